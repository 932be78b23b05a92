"""``seeder questions``: a dataset whose training questions are generated from the graph's own paths and texts."""

from __future__ import annotations

import argparse
import dataclasses

from seeder.cli.arguments import parse_bool
from seeder.config import QuestionsConfig, field_docs, from_dict, load_config
from seeder.generate.questions import build_dataset, load_paraphraser


def run(args: argparse.Namespace) -> int:
    base = dataclasses.asdict(load_config(args.config).questions)
    base.update({f.name: getattr(args, f.name) for f in dataclasses.fields(QuestionsConfig) if getattr(args, f.name) is not None})
    cfg = from_dict(QuestionsConfig, base, prefix="questions.")
    paraphrase = load_paraphraser(args.paraphraser) if args.paraphraser else None
    build_dataset(args.dataset, args.out, cfg, overwrite=args.overwrite, paraphrase=paraphrase)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "questions", help="write a dataset whose training questions are generated from the graph's own paths and texts"
    )
    parser.add_argument("--dataset", required=True, help="source dataset directory (from `seeder import` or `seeder synth`)")
    parser.add_argument("--out", required=True, help="dataset directory to create: the same graph, generated training questions")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--config", help="config file whose `questions` section holds the parameters")
    parser.add_argument("--paraphraser", help="module:function that rewrites the list of question texts (e.g. an LLM call)")
    docs = field_docs(QuestionsConfig)
    for f in dataclasses.fields(QuestionsConfig):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type={"int": int, "float": float, "bool": parse_bool}[str(f.type)],
            default=None,
            help=f"{docs.get(f.name, '')} (default {f.default})",
        )
    parser.set_defaults(func=run)
