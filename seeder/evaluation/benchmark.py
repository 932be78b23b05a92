"""``seeder benchmark``: every retrieval method on one split, reported in the layout of the paper's Table 1.

Rows are methods, columns Hit@1, Hit@5, MRR and Recall@20 (paper, Section 5 / Appendix C; best in
**bold**), then Hit@any, Recall@any and the mean candidate-set size, and the latency per query. The
same table is repeated per value of each query attribute (e.g. one table per MetaQA hop). Files
written to ``--out``:

    table1.md      the tables (also printed to stdout)
    table1.csv     one row per (group, method): metrics at full precision, latencies
    report.json    everything above plus the subgraph ceiling and run settings
    budget.png     Hit@any and Recall@any against the retrieval budget for Dense and K-HOP-W-FILTER
                   (the paper's Figures 3 and 6); budget.csv has the points

Two latency figures per method, both wall clock on this machine:

- single query: a seeded sample of queries, each run alone (methods interleaved query by query so
  that load from other processes hits all methods alike): p50 and p95 milliseconds;
- batched: the whole evaluation, ``--block-queries`` queries per call, milliseconds per query.

Each method is built and warmed up on one query first; that one-off cost (BM25's index, page-in of
the features) is reported as setup seconds in report.json, not in either latency.

Queries are ranked in blocks in this process. ``python pipelines/benchmark.py`` takes the same
arguments, plus ``--ray-address`` and ``--num-cpus``, and ranks the blocks on Ray Data instead (this
module never imports Ray). The run is logged to MLflow (``seeder.tracking``): parameters, one metric
per method and metric (``ppr.hit_at_1``), the files.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from seeder import tracking
from seeder.config import ConfigError, SeederConfig, from_dict
from seeder.data.ragged import positions_within
from seeder.data.subgraphs import SubgraphSet, sorted_lookup
from seeder.evaluation.evaluate import resolve_methods as resolve
from seeder.preprocessing.artifacts import open_artifacts
from seeder.retrieve import registry
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.dense import dense_ranking
from seeder.retrieve.metrics import attribute_labels, evaluate, per_query_metrics, subgraph_ceiling
from seeder.system.io import DataError, atomic_directory

TABLE_COLUMNS = [("Hit@1", "hit_at_1"), ("Hit@5", "hit_at_5"), ("MRR", "mrr"), ("Recall@20", "recall_at_20")]
"""The paper's Table 1 columns (header, metric name); the best value of each is bold."""
SET_COLUMNS = [("Hit@any", "hit_any"), ("Recall@any", "recall_any")]
"""Quality of the retrieved set itself (also bold on the best)."""
TABLE_KS = (1, 5, 20)
DISPLAY_NAMES = {
    "dense": "Dense",
    "khop": "K-HOP-W-FILTER",
    "prior": "Relation-path prior",
    "g-retriever": "G-Retriever",
    "subgraphrag": "SubgraphRAG",
    "beam": "Beam",
    "astar": "A*",
    "ppr": "PPR",
    "ppr-mmr": "PPR-MMR",
    "bm25": "BM25",
    "hybrid": "Hybrid (BM25+dense)",
    "seeder": "SeedER",
}
DEFAULT_BUDGETS = (10, 20, 50, 100, 200, 500, 1000)
"""Retrieval budgets of the budget plot (nodes per query)."""
REPORT_FILES = ("table1.md", "table1.csv", "report.json", "budget.png", "budget.csv")
REPORT_MARKER = "report.json"  # a directory holding it is a previous report, which a new one may replace


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- which methods, which queries ------------------------------------------------------------------


def resolve_methods(specs: str | list[str] | None, model: str | None) -> list[str]:
    """``--method`` values as for ``seeder evaluate`` (default ``all``); ``all`` lists the rows in the
    paper's order (references, baselines, SeedER last), then anything registered later."""
    return resolve(specs, model, default=["all"], order=list(DISPLAY_NAMES))


def stratified_sample(num_queries: int, size: int, strata: np.ndarray | None, seed: int) -> np.ndarray:
    """Sorted positions of ``size`` of ``num_queries`` queries, drawn without replacement; with
    ``strata`` (one label per query), each stratum gets its proportional share (largest remainders),
    so the per-attribute tables keep the split's mix."""
    if size >= num_queries:
        return np.arange(num_queries)
    rng = np.random.default_rng(seed)
    if strata is None:
        return np.sort(rng.choice(num_queries, size, replace=False))
    labels, inverse, counts = np.unique(np.asarray(strata).astype(str), return_inverse=True, return_counts=True)
    share = counts * size / num_queries
    take = np.floor(share).astype(np.int64)
    remainder_order = np.argsort(-(share - take), kind="stable")
    take[remainder_order[: size - int(take.sum())]] += 1
    # One random key per query; within each stratum the smallest ``take`` keys win.
    keys = rng.random(num_queries)
    order = np.lexsort((keys, inverse))
    rank_in_stratum = positions_within(counts)
    chosen = order[rank_in_stratum < take[inverse[order]]]
    return np.sort(chosen)


def _first_groupable(attributes: dict[str, np.ndarray]) -> np.ndarray | None:
    for column in attributes.values():
        labels = attribute_labels(column)
        if labels is not None:
            return labels
    return None


@dataclass
class BenchmarkInputs:
    """The queries of one benchmark: their subgraphs, features and attributes (same order)."""

    subgraphs: SubgraphSet
    query_features: np.ndarray
    attributes: dict[str, np.ndarray]
    split_queries: int  # queries of the split before sampling


def load_inputs(artifacts, split: str, max_queries: int | None = None, seed: int = 0) -> BenchmarkInputs:
    subgraphs = artifacts.subgraphs(split=split)
    if len(subgraphs) == 0:
        raise DataError(f"{artifacts.path}: no {split} queries in the subgraphs stage; pick another --split")
    total = len(subgraphs)
    attributes = artifacts.dataset.query_attributes(subgraphs.query_ids)
    if max_queries and max_queries < total:
        keep = stratified_sample(total, max_queries, _first_groupable(attributes), seed)
        subgraphs = subgraphs.take(keep)
        attributes = {name: np.asarray(column)[keep] for name, column in attributes.items()}
    features = np.asarray(artifacts.query_features[artifacts.query_rows(subgraphs.query_ids)], dtype=np.float32)
    return BenchmarkInputs(subgraphs, features, attributes, total)


# -- ranking and timing ----------------------------------------------------------------------------


def concat_results(parts: Sequence[RetrievalResult]) -> RetrievalResult:
    """Results of consecutive query blocks as one (rankings padded with -1 to the widest)."""
    width = max((p.ranking.shape[1] for p in parts), default=0)
    rankings = [np.pad(p.ranking, ((0, 0), (0, width - p.ranking.shape[1])), constant_values=-1) for p in parts]
    return RetrievalResult(
        query_ids=np.concatenate([p.query_ids for p in parts]) if parts else np.zeros(0, np.int64),
        ranking=np.concatenate(rankings) if parts else np.zeros((0, 0), np.int64),
        set_size=np.concatenate([p.set_size for p in parts]) if parts else np.zeros(0, np.int64),
    )


def rank_blocks(
    retriever,
    subgraphs: SubgraphSet,
    query_features: np.ndarray,
    block_queries: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[RetrievalResult, float]:
    """Rank all queries ``block_queries`` at a time -> (result in input order, seconds spent ranking)."""
    parts, seconds = [], 0.0
    step = max(int(block_queries), 1)
    for lo in range(0, len(subgraphs), step):
        index = np.arange(lo, min(lo + step, len(subgraphs)))
        start = time.perf_counter()
        parts.append(retriever.retrieve(subgraphs.take(index), query_features[index]))
        seconds += time.perf_counter() - start
        if progress is not None:
            progress(int(index[-1]) + 1)
    result = concat_results(parts)
    if not np.array_equal(result.query_ids, subgraphs.query_ids):
        raise DataError("a retriever returned rankings for other queries than it was given")
    return result, seconds


def warm_up(retriever, subgraphs: SubgraphSet, query_features: np.ndarray) -> None:
    """One untimed call on the first query: lazy one-off work (BM25's index over all node texts,
    page-in of memory-mapped features) is setup, not per-query latency."""
    if len(subgraphs):
        retriever.retrieve(subgraphs.take(np.array([0])), np.asarray(query_features[:1], dtype=np.float32))


class BlockRanker:
    """Ranks blocks of query ids with several methods; built once per worker from paths only (the
    artifacts are memory-mapped there, never shipped). A Ray Data ``map_batches`` callable: a batch
    ``{"query_id": int64[B]}`` becomes, per method ``m``, columns ``m/ranking`` [B, L] (-1 padded),
    ``m/set_size`` [B] and ``m/seconds`` (the block's ranking time spread evenly over its rows)."""

    def __init__(
        self,
        artifacts_path: str,
        split: str,
        methods: list[str],
        config: dict,
        model: str | None = None,
        num_threads: int | None = None,
        accept_mismatch: bool = False,
    ):
        if num_threads:
            import torch  # torch only on this path

            torch.set_num_threads(num_threads)  # Ray gives actors OMP_NUM_THREADS=1
        # The driver checked the fingerprints first; a mismatch it was told to accept is accepted here too.
        self.artifacts = open_artifacts(artifacts_path, accept_mismatch=accept_mismatch)
        config = from_dict(SeederConfig, config)
        self.methods = list(methods)
        self.subgraphs = self.artifacts.subgraphs(split=split)
        self.order = np.argsort(self.subgraphs.query_ids, kind="stable")
        self.retrievers = {m: registry.build(m, self.artifacts, config, model=model) for m in self.methods}
        features = np.asarray(self.artifacts.query_features[self.artifacts.query_rows(self.subgraphs.query_ids[:1])])
        for retriever in self.retrievers.values():
            warm_up(retriever, self.subgraphs, features)

    def positions(self, query_ids: np.ndarray) -> np.ndarray:
        sorted_ids = self.subgraphs.query_ids[self.order]
        found, pos = sorted_lookup(sorted_ids, query_ids)
        if not found.all():
            raise DataError(f"{self.artifacts.path}: query ids without a subgraph in this split: {query_ids[:5].tolist()}")
        return self.order[pos]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        query_ids = np.asarray(batch["query_id"], dtype=np.int64)
        block = self.subgraphs.take(self.positions(query_ids))
        features = np.asarray(self.artifacts.query_features[self.artifacts.query_rows(query_ids)], dtype=np.float32)
        out = {"query_id": query_ids}
        for name, retriever in self.retrievers.items():
            start = time.perf_counter()
            result = retriever.retrieve(block, features)
            seconds = time.perf_counter() - start
            out[f"{name}/ranking"] = np.asarray(result.ranking, dtype=np.int64)
            out[f"{name}/set_size"] = np.asarray(result.set_size, dtype=np.int64)
            out[f"{name}/seconds"] = np.full(len(query_ids), seconds / max(len(query_ids), 1))
        return out


def results_from_blocks(
    blocks: Sequence[dict[str, np.ndarray]], methods: list[str], query_ids: np.ndarray
) -> dict[str, tuple[RetrievalResult, float]]:
    """``BlockRanker`` outputs (any order) -> per method (result in ``query_ids`` order, ranking seconds)."""
    got = np.concatenate([np.asarray(b["query_id"], dtype=np.int64) for b in blocks]) if blocks else np.zeros(0, np.int64)
    order = np.argsort(got, kind="stable")
    found, pos = sorted_lookup(got[order], query_ids)
    if len(got) != len(query_ids) or not found.all():
        raise DataError(f"ranked blocks returned {len(got)} queries for {len(query_ids)} asked; some are missing or repeated")
    rows = order[pos]
    out = {}
    for name in methods:
        width = max(np.asarray(b[f"{name}/ranking"]).shape[1] for b in blocks)
        ranking = np.concatenate(
            [
                np.pad(
                    np.asarray(b[f"{name}/ranking"]),
                    ((0, 0), (0, width - np.asarray(b[f"{name}/ranking"]).shape[1])),
                    constant_values=-1,
                )
                for b in blocks
            ]
        )
        set_size = np.concatenate([np.asarray(b[f"{name}/set_size"]) for b in blocks])
        seconds = float(sum(np.asarray(b[f"{name}/seconds"]).sum() for b in blocks))
        out[name] = (RetrievalResult(query_ids.copy(), ranking[rows], set_size[rows].astype(np.int64)), seconds)
    return out


def percentile_ms(seconds: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds, dtype=np.float64) * 1000.0, q)) if len(seconds) else math.nan


def single_query_latency(
    runners: dict[str, Callable[[int], Any]], positions: Sequence[int], progress: Callable[[int], None] | None = None
) -> dict[str, list[float]]:
    """Seconds of ``runners[name](position)`` per position, each query alone. Methods are interleaved
    query by query (order rotated per query) so that load from other processes on the machine hits
    all methods alike. Warm the methods up first (``warm_up``)."""
    names = list(runners)
    timings: dict[str, list[float]] = {name: [] for name in names}
    for i, position in enumerate(positions):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            runners[name](position)
            timings[name].append(time.perf_counter() - start)
        if progress is not None:
            progress(i + 1)
    return timings


def _ensure_table_ks(config: SeederConfig) -> SeederConfig:
    ks = sorted(set(config.eval.ks) | set(TABLE_KS))
    return replace(config, eval=replace(config.eval, ks=ks))


def run_benchmark(
    artifacts,
    methods: list[str],
    split: str,
    config: SeederConfig,
    model: str | None = None,
    max_queries: int | None = None,
    latency_queries: int = 30,
    block_queries: int = 256,
    seed: int = 0,
    ray_ranker: Callable[..., dict[str, tuple[RetrievalResult, float]]] | None = None,
) -> dict[str, Any]:
    """Rank the split with every method; metrics per group, latencies. ``ray_ranker(inputs, methods,
    config, model, block_queries)`` replaces in-process ranking (``pipelines/benchmark.py``)."""
    config = _ensure_table_ks(config)
    inputs = load_inputs(artifacts, split, max_queries, seed)
    subgraphs, features = inputs.subgraphs, inputs.query_features
    num_q = len(subgraphs)
    _stderr(f"benchmark: {num_q} {split} queries (of {inputs.split_queries}), methods: {', '.join(methods)}")
    report: dict[str, Any] = {
        "artifacts": str(artifacts.path),
        "dataset": str(artifacts.manifest.get("dataset")),
        "split": split,
        "queries": num_q,
        "split_queries": inputs.split_queries,
        "sampled": num_q < inputs.split_queries,
        "seed": seed,
        "ks": list(config.eval.ks),
        "ceiling": subgraph_ceiling(subgraphs, inputs.attributes),
        "methods": {},
        "latency": {},
        "engine": "ray" if ray_ranker else "in-process",
        "block_queries": block_queries,
        "model": model,
    }
    retrievers = {}
    setup_seconds = {}
    for name in methods:
        start = time.perf_counter()
        retrievers[name] = registry.build(name, artifacts, config, model=model)
        warm_up(retrievers[name], subgraphs, features)
        setup_seconds[name] = time.perf_counter() - start

    if ray_ranker is not None:
        ranked = ray_ranker(inputs, methods, config, model, block_queries)
    else:
        ranked = {}
        for name in methods:
            every = max(block_queries, num_q // 10)

            def progress(done: int, name=name, every=every) -> None:
                if done == num_q or done % every < block_queries:
                    _stderr(f"  {name}: {done}/{num_q} queries")

            ranked[name] = rank_blocks(retrievers[name], subgraphs, features, block_queries, progress)
    for name in methods:
        result, seconds = ranked[name]
        report["methods"][name] = evaluate(result, subgraphs.answer_ptr, subgraphs.answers, inputs.attributes, ks=config.eval.ks)
        report["latency"][name] = {
            "setup_s": round(setup_seconds[name], 4),
            "ranking_s": round(seconds, 4),
            "batched_ms_per_query": 1000.0 * seconds / max(num_q, 1),
        }
        _stderr(f"{name}: {num_q} queries in {seconds:.2f} s (+{setup_seconds[name]:.2f} s setup)")

    sample = stratified_sample(num_q, latency_queries, _first_groupable(inputs.attributes), seed + 1)

    def runner(name: str) -> Callable[[int], Any]:
        return lambda i: retrievers[name].retrieve(subgraphs.take(np.array([i])), features[i : i + 1])

    timings = single_query_latency(
        {name: runner(name) for name in methods},
        sample.tolist(),
        lambda done: _stderr(f"  single-query latency: {done}/{len(sample)} queries") if done % 10 == 0 else None,
    )
    for name in methods:
        report["latency"][name].update(
            p50_ms=percentile_ms(timings[name], 50), p95_ms=percentile_ms(timings[name], 95), latency_queries=len(sample)
        )
    return report


# -- the budget curves (paper, Figures 3 and 6) ----------------------------------------------------


def scaled_expand_config(expand, budget: int):
    """``expand`` with ``budget`` and every ``keep_per_hop`` entry scaled by budget / expand.budget."""
    factor = budget / expand.budget
    keep = [max(1, int(round(k * factor))) for k in expand.keep_per_hop]
    return replace(expand, budget=int(budget), keep_per_hop=keep)


def budget_curves(
    artifacts, split: str, config: SeederConfig, budgets: Sequence[int] = DEFAULT_BUDGETS, max_queries: int = 200, seed: int = 0
) -> dict[str, Any]:
    """Hit@any and Recall@any per budget on a seeded sample of the split: Dense's top-k, and
    K-HOP-W-FILTER re-expanded with each budget (``keep_per_hop`` scaled proportionally)."""
    from seeder.retrieve.khop import GraphIndex, expand_queries  # numba: only for the budget curves

    inputs = load_inputs(artifacts, split, max_queries, seed)
    subgraphs, features = inputs.subgraphs, inputs.query_features
    budgets = sorted({int(b) for b in budgets if int(b) > 0})
    if not budgets:
        raise ConfigError("budget plot: give at least one positive budget")
    num_nodes = artifacts.node_features.shape[0]
    budgets = [b for b in budgets if b <= num_nodes] or [num_nodes]
    curves: dict[str, Any] = {"budgets": budgets, "queries": len(subgraphs), "dense": {}, "khop": {}}
    ranking = dense_ranking(features, artifacts.node_features, max(budgets), config)
    for budget in budgets:
        size = np.minimum((ranking >= 0).sum(axis=1), budget)
        result = RetrievalResult(subgraphs.query_ids, ranking, size.astype(np.int64))
        values = per_query_metrics(result, subgraphs.answer_ptr, subgraphs.answers, ks=[1])
        curves["dense"][budget] = {m: float(values[m].mean()) for m in ("hit_any", "recall_any", "set_size")}

    seed_ids, seeds, seed_scores = artifacts.seeds()
    rows = np.searchsorted(seed_ids, subgraphs.query_ids)
    rows = np.minimum(rows, max(len(seed_ids) - 1, 0))
    if len(seed_ids) == 0 or not np.array_equal(seed_ids[rows], subgraphs.query_ids):
        raise DataError(f"{artifacts.path}/seeds: some {split} queries have no seeds; rerun the seeds stage")
    kg = artifacts.dataset
    graph = GraphIndex.build(kg)
    prior = artifacts.prior() if config.expand.relation_score == "learned" else None
    texts = artifacts.query_texts(subgraphs.query_ids) if prior is not None else None
    masked = prior is not None and prior.question == "masked"
    prior_features = artifacts.prior_questions(subgraphs.query_ids) if masked else None
    for budget in budgets:
        expand = scaled_expand_config(config.expand, budget)
        start = time.perf_counter()
        expanded = expand_queries(
            kg,
            artifacts.filter_features,
            artifacts.relation_features,
            features,
            seeds[rows],
            seed_scores[rows],
            expand,
            subgraphs.query_ids,
            subgraphs.splits,
            subgraphs.answer_ptr,
            subgraphs.answers,
            graph=graph,
            prior=prior,
            texts=texts,
            prior_features=prior_features,
        )
        ceiling = subgraph_ceiling(expanded)["all"]
        curves["khop"][budget] = {"hit_any": ceiling["hit_any"], "recall_any": ceiling["recall_any"], "set_size": ceiling["size"]}
        _stderr(f"  budget {budget}: K-hop {len(subgraphs)} queries expanded in {time.perf_counter() - start:.2f} s")
    return curves


def plot_budget_curves(curves: dict[str, Any], path: str | Path) -> Path:
    """Two panels (Hit@any, Recall@any) against the budget, log x axis (matplotlib, Agg)."""
    import matplotlib  # plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # plots only

    path = Path(path)
    budgets = curves["budgets"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (title, metric) in zip(axes, SET_COLUMNS):
        for method in ("dense", "khop"):
            ax.plot(budgets, [curves[method][b][metric] for b in budgets], marker="o", label=DISPLAY_NAMES[method])
        ax.set_xscale("log")
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("retrieval budget (nodes per query)")
        ax.set_title(f"{title} ({curves['queries']} queries)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# -- the report ------------------------------------------------------------------------------------


def _groups(report: dict[str, Any]) -> list[str]:
    return list(report["ceiling"])


def table_rows(report: dict[str, Any], group: str) -> list[dict[str, Any]]:
    """One dict per method for ``group``: method id, display name, metrics, latencies."""
    rows = []
    for name, groups in report["methods"].items():
        entry = groups.get(group, {})
        row = {"group": group, "method": name, "name": DISPLAY_NAMES.get(name, name), "queries": entry.get("queries", 0)}
        for _, metric in [*TABLE_COLUMNS, *SET_COLUMNS]:
            row[metric] = entry.get(metric, math.nan)
        row["set_size"] = entry.get("set_size", math.nan)
        latency = report["latency"].get(name, {})
        for key in ("p50_ms", "p95_ms", "batched_ms_per_query"):
            row[key] = latency.get(key, math.nan)
        rows.append(row)
    return rows


def _cell(value: float, best: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = fmt.format(value)
    return f"**{text}**" if best is not None and text == fmt.format(best) else text


def markdown_table(rows: list[dict[str, Any]], with_latency: bool) -> str:
    header = ["Method", *(h for h, _ in TABLE_COLUMNS), *(h for h, _ in SET_COLUMNS), "Set size"]
    if with_latency:
        header += ["p50 ms (1 query)", "p95 ms (1 query)", "ms/query (batched)"]
    best = {}
    for _, metric in [*TABLE_COLUMNS, *SET_COLUMNS]:
        finite = [r[metric] for r in rows if not math.isnan(r[metric])]
        best[metric] = max(finite) if finite else None
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for r in rows:
        cells = [r["name"]]
        cells += [_cell(r[m], best[m], "{:.4f}") for _, m in [*TABLE_COLUMNS, *SET_COLUMNS]]
        cells.append(_cell(r["set_size"], None, "{:.1f}"))
        if with_latency:
            cells += [_cell(r[k], None, "{:.1f}") for k in ("p50_ms", "p95_ms")]
            cells.append(_cell(r["batched_ms_per_query"], None, "{:.2f}"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_report(report: dict[str, Any]) -> str:
    """The Markdown report: the overall table (Table 1 layout, with latencies), then one per group."""
    some_latency = next(iter(report["latency"].values()), {})
    sampled = f" (seeded sample of {report['split_queries']:,}, stratified by the first attribute)" if report["sampled"] else ""
    parts = [
        f"# Retrieval benchmark: {report['dataset']}, split {report['split']}",
        "",
        f"{report['queries']:,} queries{sampled}; artifacts {report['artifacts']}; ranking engine: {report['engine']}.",
        "Best value of each quality column in **bold**. Set size: mean size of the retrieved set (Hit@any and "
        "Recall@any are measured on it).",
        f"Latency: *p50/p95 ms (1 query)* = wall clock of each of {some_latency.get('latency_queries', 0)} sampled "
        f"queries run alone (methods interleaved); *ms/query (batched)* = ranking time of the whole evaluation in "
        f"blocks of {report['block_queries']} queries divided by the number of queries"
        + (" (summed over Ray workers' blocks)." if report["engine"] == "ray" else "."),
        "",
        f"## All queries (n={report['ceiling']['all']['queries']:,})",
        "",
        markdown_table(table_rows(report, "all"), with_latency=True),
        "",
        _ceiling_line(report, "all"),
    ]
    for group in _groups(report)[1:]:
        parts += [
            "",
            f"## {group} (n={report['ceiling'][group]['queries']:,})",
            "",
            markdown_table(table_rows(report, group), with_latency=False),
            "",
            _ceiling_line(report, group),
        ]
    if "budget" in report:
        curves = report["budget"]
        parts += [
            "",
            f"## Retrieval budget ({curves['queries']} sampled queries; budget.png)",
            "",
            "| Budget | Dense Hit@any | Dense Recall@any | K-hop Hit@any | K-hop Recall@any | K-hop mean size |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for b in curves["budgets"]:
            d, k = curves["dense"][b], curves["khop"][b]
            parts.append(
                f"| {b} | {d['hit_any']:.4f} | {d['recall_any']:.4f} | {k['hit_any']:.4f} | "
                f"{k['recall_any']:.4f} | {k['set_size']:.1f} |"
            )
    return "\n".join(parts) + "\n"


def _ceiling_line(report: dict[str, Any], group: str) -> str:
    c = report["ceiling"][group]
    return (
        f"Subgraph ceiling (precomputed K-hop subgraphs): Hit@any {c['hit_any']:.4f}, "
        f"Recall@any {c['recall_any']:.4f}, mean size {c['size']:.1f}."
    )


CSV_FIELDS = [
    "group",
    "queries",
    "method",
    "name",
    *(m for _, m in TABLE_COLUMNS),
    *(m for _, m in SET_COLUMNS),
    "set_size",
    "p50_ms",
    "p95_ms",
    "batched_ms_per_query",
]


def write_csv(report: dict[str, Any], path: str | Path) -> Path:
    """One row per (group, method); latencies only on the ``all`` rows (they are not per group)."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for group in _groups(report):
            for row in table_rows(report, group):
                out = {k: row[k] for k in CSV_FIELDS}
                for key in ("p50_ms", "p95_ms", "batched_ms_per_query"):
                    out[key] = "" if group != "all" else round(out[key], 4)
                for _, metric in [*TABLE_COLUMNS, *SET_COLUMNS]:
                    out[metric] = round(out[metric], 6)
                out["set_size"] = round(out["set_size"], 4)
                writer.writerow(out)
    return Path(path)


def write_budget_csv(curves: dict[str, Any], path: str | Path) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["method", "budget", "hit_any", "recall_any", "mean_set_size"])
        for method in ("dense", "khop"):
            for b in curves["budgets"]:
                v = curves[method][b]
                writer.writerow([method, b, round(v["hit_any"], 6), round(v["recall_any"], 6), round(v["set_size"], 4)])
    return Path(path)


def write_report(report: dict[str, Any], out: str | Path) -> Path:
    """All report files into ``out`` (replaced as a whole, via a temporary directory). An existing ``out``
    is replaced only when it is empty or a previous report (it has report.json)."""
    out = Path(out)
    with atomic_directory(out, overwrite=True, marker=REPORT_MARKER) as tmp:
        (tmp / "table1.md").write_text(format_report(report))
        write_csv(report, tmp / "table1.csv")
        if "budget" in report:
            plot_budget_curves(report["budget"], tmp / "budget.png")
            write_budget_csv(report["budget"], tmp / "budget.csv")
        (tmp / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=_json_default))
    return out


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# -- MLflow ----------------------------------------------------------------------------------------


def _metric_key(*parts: str) -> str:
    """MLflow allows letters, digits, ``_ - . / space``: ``hop=1`` becomes ``hop_1``."""
    return ".".join("".join(c if c.isalnum() or c in "_-" else "_" for c in p) for p in parts)


def log_to_mlflow(report: dict[str, Any], out: Path, experiment: str, run_name: str | None = None) -> str:
    """One run: params (methods, split, dataset, ...), ``method.metric`` for every method and group
    (the ``all`` group without a group part), latencies, and the report files as artifacts."""
    params = {
        "methods": ",".join(report["methods"]),
        "split": report["split"],
        "dataset": report["dataset"],
        "artifacts": report["artifacts"],
        "queries": report["queries"],
        "split_queries": report["split_queries"],
        "engine": report["engine"],
        "block_queries": report["block_queries"],
        "model": report.get("model") or "",
    }
    metrics: dict[str, float] = {}
    for name, groups in report["methods"].items():
        for group, values in groups.items():
            for metric, value in values.items():
                if metric != "queries" and isinstance(value, float):
                    metrics[_metric_key(name, metric) if group == "all" else _metric_key(name, group, metric)] = value
        for key in ("p50_ms", "p95_ms", "batched_ms_per_query"):
            value = report["latency"][name].get(key)
            if value is not None:
                metrics[_metric_key(name, key)] = float(value)
    files = [out / name for name in REPORT_FILES if (out / name).is_file()]
    return tracking.log_report_run(experiment, run_name or f"benchmark-{report['split']}", params, metrics, files)


# -- the command -----------------------------------------------------------------------------------
