"""When to retrain (issue 47): a model trained on one version of a graph, evaluated on versions with
more and more of the graph changed, against a model retrained on the most changed one.

On the synthetic relation-tracing graph of ``--config`` (default ``configs/synth_default.yaml``) with
the hash encoder and ``reduce.dim=0`` (the encoder's own feature space, so that the old model runs on
every version), this:

1. generates version 1 (``seeder synth``), preprocesses it in full and trains a model on it
   (``python -m seeder.training``, no Ray, no MLflow);
2. for each share of ``--changes`` (default 1, 5, 20 and 50 % of the triples) writes a change set that
   removes half that share of the edges at random and adds as many random edges between existing
   nodes (rewiring), and applies it with ``seeder import triples --update`` as a new version. A question
   of the synthetic graph is a start node and a relation path, so its true answers on the new version
   are the ends of that path there: a question whose answers changed is replaced by the same text
   with the new answers (same split), one left without answers is removed;
3. preprocesses each new version from version 1's artifacts (``pipelines/preprocess.py --update``: in
   the encoder's feature space the same subgraphs and features as a full run, with version 1's
   relation-path prior kept) and evaluates the old model on it with ``seeder evaluate``, which also
   evaluates the model on version 1 (the comparison it prints after its table);
4. retrains on the versions named by ``--retrain`` (default the most changed) and evaluates that model.

Training takes ``TRAINING``'s sample of the questions per epoch, for both models.

Every step is skipped when its output is already under ``--work``, so a rerun continues. It prints one
table: change, questions, the subgraph ceiling, the old model's Hit@1 and Recall@20 and their change
against version 1, and the retrained model's where measured.

Usage:
    python benchmarks/bench_retrain.py --work /tmp/bench-retrain
    python benchmarks/bench_retrain.py --work /tmp/bench-retrain --changes 1 5 20 50 --retrain 20 50
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from seeder.data.store import open_dataset  # noqa: E402

FEATURES = ["embed.encoder=hash", "reduce.dim=0"]
# A sample of the training questions per epoch, as benchmarks/bench_million.py does: on the shared 2-core
# machine the config's 3 full epochs take over an hour.
TRAINING = ["train.epochs=2", "train.queries_per_epoch=800"]


def run(command: list[str], log: Path) -> float:
    """Run ``command`` from the repository root, its output into ``log``; its wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}; see {log}")
    return time.perf_counter() - start


def seeder_cli() -> list[str]:
    return [sys.executable, "-m", "seeder.cli"]


def follow(adjacency: dict[tuple[int, int], list[int]], start: int, path: list[int]) -> set[int]:
    """The nodes at the end of relation ``path`` from ``start``."""
    frontier = {start}
    for relation in path:
        frontier = {v for u in frontier for v in adjacency.get((u, relation), ())}
    return frontier


def change_set(parent: Path, share: float, out: Path, seed: int) -> tuple[Path, Path]:
    """A triples change file rewiring ``share`` of the parent's edges, and a queries change file with
    the questions whose answers moved (see the module docstring)."""
    kg = open_dataset(parent)
    names = np.asarray(kg.nodes.column("name").to_pylist(), dtype=object)
    relation_names = np.asarray(kg.relations.column("name").to_pylist(), dtype=object)
    edges = kg.table("edges")
    src = edges.column("src").to_numpy()
    dst = edges.column("dst").to_numpy()
    rel = edges.column("relation").to_numpy()
    rng = np.random.default_rng(seed)
    count = int(round(len(src) * share / 2))
    removed = rng.choice(len(src), count, replace=False)
    keep = np.ones(len(src), dtype=bool)
    keep[removed] = False
    existing = set(zip(src.tolist(), rel.tolist(), dst.tolist()))
    added: list[tuple[int, int, int]] = []
    while len(added) < count:  # random edges between existing nodes, relations as often as they are used
        u, r, v = int(rng.integers(len(names))), int(rel[rng.integers(len(rel))]), int(rng.integers(len(names)))
        if u != v and (u, r, v) not in existing:
            existing.add((u, r, v))
            added.append((u, r, v))
    triples = out / "changes.tsv"
    out.mkdir(parents=True, exist_ok=True)
    with triples.open("w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["head", "relation", "tail", "op"])
        writer.writerows([names[src[i]], relation_names[rel[i]], names[dst[i]], "remove"] for i in removed.tolist())
        writer.writerows([names[u], relation_names[r], names[v], "add"] for u, r, v in added)
    adjacency: dict[tuple[int, int], list[int]] = {}
    new_src = np.concatenate([src[keep], [u for u, _, _ in added]]).astype(np.int64)
    new_rel = np.concatenate([rel[keep], [r for _, r, _ in added]]).astype(np.int64)
    new_dst = np.concatenate([dst[keep], [v for _, _, v in added]]).astype(np.int64)
    for u, r, v in zip(new_src.tolist(), new_rel.tolist(), new_dst.tolist()):
        adjacency.setdefault((u, r), []).append(v)
    queries = kg.queries.to_pylist()
    questions = out / "query-changes.csv"
    with questions.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["id", "text", "answers", "split", "hop", "op"])
        for q in queries:
            answers = follow(adjacency, int(q["start"]), list(q["path"]))
            if answers == set(q["answers"]):
                continue
            writer.writerow([q["id"], q["text"], "", "", "", "remove"])
            if answers:
                writer.writerow(["", q["text"], "|".join(names[sorted(answers)]), q["split"], q["hop"], "add"])
    return triples, questions


def new_relation(parent: Path, out: Path, seed: int, questions: int) -> tuple[Path, Path]:
    """A change of another kind: a relation the graph did not have (``founder_of``, a random permutation
    of the nodes, as the generator draws one) and ``questions`` new questions that use it, one or two hops
    (``What is the founder of the mentor of X?``), their split drawn by the importer."""
    kg = open_dataset(parent)
    names = np.asarray(kg.nodes.column("name").to_pylist(), dtype=object)
    relations = kg.relations.to_pylist()
    phrases = {r["id"]: r["text"] for r in relations if r["name"] not in ("associate_of", "features")}
    edges = kg.table("edges")
    adjacency: dict[tuple[int, int], list[int]] = {}
    for u, r, v in zip(*(edges.column(c).to_numpy().tolist() for c in ("src", "relation", "dst"))):
        adjacency.setdefault((u, r), []).append(v)
    rng = np.random.default_rng(seed)
    new_id = len(relations)
    sigma = rng.permutation(len(names))
    for u in range(len(names)):
        adjacency[(u, new_id)] = [int(sigma[u])]
    phrases_all = {**phrases, new_id: "founder of"}
    out.mkdir(parents=True, exist_ok=True)
    triples = out / "changes.tsv"
    with triples.open("w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["head", "relation", "tail", "op"])
        writer.writerows([names[u], "founder_of", names[sigma[u]], "add"] for u in range(len(names)))
    old = list(phrases)
    rows = []
    for i in range(questions):
        start = int(rng.integers(len(names)))
        hops = 1 + i % 2
        path = (
            [new_id]
            if hops == 1
            else ([new_id, old[rng.integers(len(old))]] if rng.random() < 0.5 else [old[rng.integers(len(old))], new_id])
        )
        answers = follow(adjacency, start, path)
        text = "What is " + "".join(f"the {phrases_all[r]} " for r in reversed(path)) + f"{names[start]}?"
        if answers:
            rows.append([text, "|".join(names[sorted(answers)]), hops, "add"])
    questions_path = out / "query-changes.csv"
    with questions_path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["text", "answers", "hop", "op"])
        writer.writerows(dict((row[0], row) for row in rows).values())  # one question per text
    return triples, questions_path


def preprocess(dataset: Path, artifacts: Path, config: str, work: Path, parent: Path | None = None, refit: bool = False) -> float:
    """A full run, or with ``parent`` an update from the parent version's artifacts (their prior kept,
    or with ``refit`` fitted again)."""
    if (artifacts / "manifest.json").is_file():
        return float("nan")
    command = [sys.executable, "pipelines/preprocess.py", "--dataset", str(dataset), "--out", str(artifacts)]
    command += (["--update", str(parent)] + (["--refit-prior"] if refit else [])) if parent else ["--config", config, *FEATURES]
    return run(command, work / f"preprocess-{artifacts.name}.log")


def train(artifacts: Path, run_dir: Path, config: str, work: Path) -> float:
    if (run_dir / "model" / "seeder_model.json").is_file() and (run_dir / "history.json").is_file():
        return float("nan")
    command = [sys.executable, "-m", "seeder.training", "--artifacts", str(artifacts), "--out", str(run_dir)]
    command += ["--config", config, "--experiment", "none", "--resume", *TRAINING]
    return run(command, work / f"train-{run_dir.name}.log")


def evaluate(artifacts: Path, model: Path, out: Path, work: Path, split: str) -> dict:
    if not out.is_file():
        command = [*seeder_cli(), "evaluate", "--artifacts", str(artifacts), "--method", "seeder", "--model", str(model)]
        run([*command, "--split", split, "--json", str(out)], work / f"{out.stem}.log")
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, type=Path, help="directory for every version, artifacts and model")
    parser.add_argument("--config", default="configs/synth_default.yaml")
    parser.add_argument("--changes", type=float, nargs="+", default=[1, 5, 20, 50], help="shares of the triples changed, in %%")
    parser.add_argument("--retrain", type=float, nargs="*", default=None, help="shares to retrain on (default: the largest)")
    parser.add_argument(
        "--new-relation-questions", type=int, default=1500, help="questions of the new-relation version (0: no such version)"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    config = str((REPO / args.config).resolve()) if not Path(args.config).is_absolute() else args.config
    retrain = set(args.retrain if args.retrain is not None else [max(args.changes)])
    times: dict[str, float] = {}

    v1 = work / "v1"
    if not (v1 / "manifest.json").is_file():
        times["synth"] = run([*seeder_cli(), "synth", "--config", config, "--out", str(v1), "--overwrite"], work / "synth.log")
    times["preprocess v1"] = preprocess(v1, work / "v1-artifacts", config, work)
    times["train v1"] = train(work / "v1-artifacts", work / "v1-model", config, work)
    model = work / "v1-model" / "model"

    # (label, dataset, artifacts, retrained here): every version and its artifacts first, then the models,
    # then the evaluations.
    versions: list[tuple[str, str, str, bool]] = []
    for share in args.changes:
        name = f"v1-changed-{share:g}pct"
        if not (work / name / "manifest.json").is_file():
            triples, questions = change_set(v1, share / 100, work / f"{name}-changes", args.seed + int(share * 100))
            command = [*seeder_cli(), "import", "triples", "--update", str(v1), "--triples", str(triples)]
            run([*command, "--queries", str(questions), "--out", str(work / name)], work / f"import-{name}.log")
        times[f"preprocess {name}"] = preprocess(work / name, work / f"{name}-artifacts", config, work, work / "v1-artifacts")
        versions.append((f"{share:g}% rewired", name, f"{name}-artifacts", share in retrain))
    if args.new_relation_questions:
        name = "v1-new-relation"
        if not (work / name / "manifest.json").is_file():
            triples, questions = new_relation(v1, work / f"{name}-changes", args.seed + 7, args.new_relation_questions)
            command = [*seeder_cli(), "import", "triples", "--update", str(v1), "--triples", str(triples)]
            run([*command, "--queries", str(questions), "--out", str(work / name)], work / f"import-{name}.log")
        # Version 1's relation-path prior does not know the new relation: fitted again (--refit-prior).
        times[f"preprocess {name}"] = preprocess(
            work / name, work / f"{name}-artifacts", config, work, work / "v1-artifacts", True
        )
        versions.append(("new relation", name, f"{name}-artifacts", True))
    for _, name, artifacts, again in versions:
        if again:
            times[f"train {artifacts}"] = train(work / artifacts, work / f"{artifacts}-model", config, work)
    rows = []
    for label, name, artifacts, again in versions:
        row = {"label": label, "change": json.loads((work / name / "manifest.json").read_text())["change"]}
        row["old"] = evaluate(work / artifacts, model, work / f"eval-{artifacts}-old.json", work, args.split)
        if again:
            model_dir = work / f"{artifacts}-model" / "model"
            row["new"] = evaluate(work / artifacts, model_dir, work / f"eval-{artifacts}-new.json", work, args.split)
        rows.append(row)

    baseline = rows[0]["old"]["baseline"]
    base = baseline["metrics"]
    print(f"seconds: {json.dumps({k: round(v, 1) for k, v in times.items() if v == v})}")
    print(
        f"version 1: {baseline['queries']} {args.split} questions, ceiling Recall@any {baseline['ceiling']['recall_any']:.3f}, "
        f"Hit@1 {base['hit_at_1']:.3f}, Recall@20 {base['recall_at_20']:.3f}"
    )
    header = ["change", "triples -/+", "questions -/+", f"{args.split} questions", "ceiling", "old Hit@1", "old Recall@20"]
    header += ["retrained Hit@1", "retrained Recall@20"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        old, change = row["old"]["methods"]["seeder"]["all"], row["change"]
        cells = [
            row["label"],
            f"-{change.get('triples_removed', 0)} +{change.get('triples_added', 0)}",
            f"-{change.get('queries_removed', 0)} +{change.get('queries_added', 0)}",
            f"{row['old']['queries']}",
            f"{row['old']['ceiling']['all']['recall_any']:.3f}",
            f"{old['hit_at_1']:.3f} ({old['hit_at_1'] - base['hit_at_1']:+.3f})",
            f"{old['recall_at_20']:.3f} ({old['recall_at_20'] - base['recall_at_20']:+.3f})",
        ]
        new = row.get("new", {}).get("methods", {}).get("seeder", {}).get("all")
        cells += [f"{new['hit_at_1']:.3f}", f"{new['recall_at_20']:.3f}"] if new else ["", ""]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
