"""``seeder evaluate``: rank a split's queries with one or more methods and print their metrics.

Methods come from ``seeder.retrieve.registry`` (``dense``, ``khop``, and whatever other modules
register, e.g. ``seeder`` with ``--model``). Every method sees the same subgraphs and query features
from the preprocessing artifacts; metrics (``seeder.retrieve.metrics``) are reported overall and per value of
each query attribute of the dataset (e.g. ``hop=1``), next to the subgraph ceiling.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import numpy as np

from seeder.config import ConfigError, SeederConfig
from seeder.retrieve import registry
from seeder.retrieve.metrics import evaluate, group_by, subgraph_ceiling
from seeder.system.io import DataError

METRIC_ORDER = ["hit_at_{k}", "recall_at_{k}", "mrr", "hit_any", "recall_any", "set_size", "precision", "f1"]


DEFAULT_METHODS = ["dense", "khop"]
NAMED_ONLY = ("seeder", "prior")
"""Methods ``all`` leaves out: ``seeder`` needs a model (it comes back last when one is given), ``prior``
needs subgraphs of the learned filter, which not every artifacts directory has."""


def resolve_methods(
    specs: str | list[str] | None,
    model: str | None,
    default: list[str] = DEFAULT_METHODS,
    order: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """Method names from ``--method`` values (each a name, a comma list or ``all``), without repeats.

    ``all`` expands to the methods of ``order`` that are registered, then the other registered ones
    but ``prior``, and ``seeder`` last, only when a model is given (it cannot run without one)."""
    specs = [specs] if isinstance(specs, str) else list(specs or default)
    known = registry.available()
    names: list[str] = []
    for spec in specs:
        for name in (part.strip() for part in spec.split(",")):
            if name == "all":
                names += [m for m in order if m in known and m not in NAMED_ONLY]
                names += [m for m in known if m not in order and m not in NAMED_ONLY]
                names += ["seeder"] if model and "seeder" in known else []
            elif name:
                names.append(name)
    unknown = [m for m in names if m not in known]
    given = ",".join(specs)
    if unknown or not names:
        problem = f"unknown retrieval method {', '.join(map(repr, unknown))}" if unknown else "no method named"
        raise ConfigError(
            f"--method {given}: {problem}; give 'all' or methods (repeated or comma-separated) of: {', '.join(known)}"
        )
    if "seeder" in names and not model:
        raise ConfigError(
            f"--method {given} includes seeder, which needs --model RUN/model, runs:/ID/model or models:/NAME@ALIAS (a trained model)"
        )
    return list(dict.fromkeys(names))


def metric_names(ks: list[int]) -> list[str]:
    names = []
    for pattern in METRIC_ORDER:
        names.extend(pattern.format(k=k) for k in ks) if "{k}" in pattern else names.append(pattern)
    return names


def run_evaluation(
    artifacts,
    methods: list[str],
    split: str,
    config: SeederConfig,
    model: str | None = None,
    log=print,
    by: list[str] | None = None,
) -> dict[str, Any]:
    """Metrics of every method on ``split``: ``{"methods": {name: {group: {metric: value}}}, "ceiling": ...}``,
    overall and per value of the query attributes ``by`` (default: ``seeder.retrieve.metrics.group_by``)."""
    subgraphs = artifacts.subgraphs(split=split)
    if len(subgraphs) == 0:
        raise DataError(f"{artifacts.path}: no {split} queries in the subgraphs stage; pick another --split")
    query_features = np.asarray(artifacts.query_features[artifacts.query_rows(subgraphs.query_ids)], dtype=np.float32)
    try:
        attributes = group_by(artifacts.dataset.query_attributes(subgraphs.query_ids), by)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    report: dict[str, Any] = {
        "artifacts": str(artifacts.path),
        "split": split,
        "queries": len(subgraphs),
        "ceiling": subgraph_ceiling(subgraphs, attributes),
        "methods": {},
        "seconds": {},
    }
    for name in methods:
        start = time.perf_counter()
        retriever = registry.build(name, artifacts, config, model=model)
        result = retriever.retrieve(subgraphs, query_features)
        if not np.array_equal(result.query_ids, subgraphs.query_ids):
            raise DataError(f"method {name} returned rankings for other queries than it was given")
        report["methods"][name] = evaluate(result, subgraphs.answer_ptr, subgraphs.answers, attributes, ks=config.eval.ks)
        report["seconds"][name] = round(time.perf_counter() - start, 3)
        log(f"{name}: {len(subgraphs)} queries ranked in {report['seconds'][name]:.2f} s", file=sys.stderr)
    return report


def format_table(report: dict[str, Any], ks: list[int]) -> str:
    """Rows: group x metric; columns: the methods side by side, then the subgraph ceiling."""
    methods = list(report["methods"])
    header = ["group", "metric", *methods, "ceiling"]
    rows = []
    groups = list(report["ceiling"])
    for group in groups:
        count = report["ceiling"][group]["queries"]
        for metric in metric_names(ks):
            values = [report["methods"][m].get(group, {}).get(metric, math.nan) for m in methods]
            ceiling = {"hit_any": "hit_any", "recall_any": "recall_any", "set_size": "size"}.get(metric)
            ceil = report["ceiling"][group][ceiling] if ceiling else math.nan
            fmt = "{:.1f}" if metric == "set_size" else "{:.4f}"
            rows.append(
                [f"{group} (n={count})", metric, *(fmt.format(v) for v in values), "" if math.isnan(ceil) else fmt.format(ceil)]
            )
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
