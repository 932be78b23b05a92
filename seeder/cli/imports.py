"""``seeder import stark|metaqa|triples|rdf``: build a dataset directory from a source's files."""

from __future__ import annotations

import argparse

from seeder.data.importers.metaqa import import_metaqa
from seeder.data.importers.rdf import BLANK_NODES, FORMATS, import_rdf
from seeder.data.importers.stark import import_stark
from seeder.data.importers.triples import import_triples
from seeder.data.update import update_dataset
from seeder.system.io import DataError


def _metaqa(args: argparse.Namespace) -> int:
    import_metaqa(
        args.root,
        args.out,
        val_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        overwrite=args.overwrite,
    )
    return 0


def _stark(args: argparse.Namespace) -> int:
    import_stark(args.kb, args.qa, args.out, overwrite=args.overwrite)
    return 0


def _triples(args: argparse.Namespace) -> int:
    # An update reads its change set with the import's own options.
    options = dict(
        nodes_path=args.nodes,
        queries_path=args.queries,
        head_col=args.head_col,
        relation_col=args.relation_col,
        tail_col=args.tail_col,
        no_header=args.no_header,
        val_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        overwrite=args.overwrite,
    )
    if args.update is not None:
        update_dataset(args.update, args.out, triples_path=args.triples, **options)
        return 0
    if args.triples is None:
        raise DataError("--triples is required: the triples file to import (with --update DATASET, the triples to change)")
    import_triples(args.triples, args.out, **options)
    return 0


def _rdf(args: argparse.Namespace) -> int:
    import_rdf(
        args.files,
        args.out,
        queries_path=args.queries,
        lang=args.lang,
        rdf_format_name=args.format,
        blank_nodes=args.blank_nodes,
        type_edges=args.type_edges,
        base_iri=args.base,
        val_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        overwrite=args.overwrite,
    )
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("import", help="import a knowledge graph and its queries into a dataset directory")
    sources = parser.add_subparsers(dest="source", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", required=True, help="dataset directory to create")
        p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")

    metaqa = sources.add_parser("metaqa", help="MetaQA: kb.txt and {1,2,3}-hop/qa_{dev,test}.txt")
    metaqa.add_argument("--root", required=True, help="MetaQA folder holding kb.txt and 1-hop/, 2-hop/, 3-hop/")
    metaqa.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="share of dev questions put in val by a stable hash of the question (default 0.1)",
    )
    metaqa.add_argument(
        "--test-fraction",
        type=float,
        default=0.1,
        help="share of dev questions put in test where a hop has no qa_test.txt (default 0.1)",
    )
    common(metaqa)
    metaqa.set_defaults(func=_metaqa)

    stark = sources.add_parser(
        "stark",
        help="STaRK: processed/ knowledge base plus stark_qa/ and split/",
        description="Import a STaRK knowledge base. WARNING: node_info.pkl, node_type_dict.pkl and "
        "edge_type_dict.pkl are Python pickles, and loading a pickle can run arbitrary code: import only "
        "files from a source you trust (STaRK's own release).",
    )
    stark.add_argument("--kb", required=True, help="STaRK processed/ folder (pickles: trusted sources only)")
    stark.add_argument("--qa", required=True, help="folder holding stark_qa/stark_qa.csv and split/*.index")
    common(stark)
    stark.set_defaults(func=_stark)

    triples = sources.add_parser("triples", help="generic head/relation/tail triples (TSV, CSV or Parquet)")
    triples.add_argument(
        "--triples",
        help="triples file (.tsv, .csv or .parquet); with --update, the triples to add and remove (column op)",
    )
    triples.add_argument("--nodes", help="optional node file: id (or name), text[, type][, name]")
    triples.add_argument("--queries", help="optional queries file: text, answers (ids separated by |)[, split][, id]")
    triples.add_argument("--head-col", default="head", help="head column name (default head)")
    triples.add_argument("--relation-col", default="relation", help="relation column name (default relation)")
    triples.add_argument("--tail-col", default="tail", help="tail column name (default tail)")
    triples.add_argument("--no-header", action="store_true", help="the triples file has no header line")
    triples.add_argument("--val-fraction", type=float, default=0.1, help="val share of the hash split (default 0.1)")
    triples.add_argument("--test-fraction", type=float, default=0.1, help="test share of the hash split (default 0.1)")
    triples.add_argument(
        "--update",
        metavar="DATASET",
        help="apply a change set to DATASET instead: --triples, --nodes and --queries (any of them) carry a column op "
        "(add or remove), and --out receives the new version; DATASET stays as it is",
    )
    common(triples)
    triples.set_defaults(func=_triples)

    rdf = sources.add_parser(
        "rdf",
        help="RDF: N-Triples, N-Quads, Turtle, TriG or RDF/XML (IRIs become nodes, IRI-valued predicates relations)",
        description="Import RDF files: IRIs become nodes named by their rdfs:label or skos:prefLabel (else their "
        "local name), with rdfs:comment, skos:definition or schema:description as text and rdf:type as type; "
        "predicates between IRIs become relations. Other literal triples, and by default blank-node triples, are "
        "skipped and counted; graph names are ignored.",
    )
    rdf.add_argument("files", nargs="+", metavar="FILE", help="RDF files (.nt, .nq, .ttl, .trig, .rdf, .owl, .xml)")
    rdf.add_argument(
        "--format",
        choices=list(FORMATS),
        help="the syntax of every FILE (default: from each file's extension; .rdf, .owl and .xml are rdfxml)",
    )
    rdf.add_argument("--queries", help="optional queries file: text, answers (IRIs or node names separated by |)[, split][, id]")
    rdf.add_argument(
        "--lang",
        default="en",
        help="language of names and texts: labels tagged with it first, then untagged ones, then any (default en)",
    )
    rdf.add_argument(
        "--blank-nodes",
        choices=BLANK_NODES,
        default="skip",
        help="skip: drop (and count) triples with a blank-node subject or object; keep: make blank nodes nodes "
        "named by their label, else _:b1, _:b2, ... (default skip)",
    )
    rdf.add_argument("--type-edges", action="store_true", help="keep rdf:type triples as edges too (they always give types)")
    rdf.add_argument("--base", metavar="IRI", help="base IRI for relative IRIs (default: each file's file:// URI)")
    rdf.add_argument("--val-fraction", type=float, default=0.1, help="val share of the hash split (default 0.1)")
    rdf.add_argument("--test-fraction", type=float, default=0.1, help="test share of the hash split (default 0.1)")
    common(rdf)
    rdf.set_defaults(func=_rdf)
