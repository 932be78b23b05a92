"""K-HOP-WITH-FILTERING (paper, Section 3): each query's bounded candidate subgraph.

Starting from the seeds (hop 0, scored by their cosine to the query), each hop h = 1..K scores the
one-hop frontier of the nodes selected so far, over both edge directions (inverse relations are
their own ids ``r + R`` in the CSR), with

    score(u) = w1 sim(q,u) + max over edges (v -r-> u), v selected, of [w2 sim(q,v) + w3 sim(q,r)]

and keeps the best ``keep_per_hop[h-1]`` nodes not selected yet (ties: smaller node id), never more
than ``budget`` nodes in total. The output keeps ids, scores and the induced edges, never embeddings.

The seeds and hops run compiled, one query at a time (``seeder.retrieve.khop_kernels``): a query's
candidates sit in a small hash table, each capped edge is scored as it is read from the CSR, and a
candidate's cosine reads its feature row in place, once per query. The induced edges are a second
compiled pass per query over its selected nodes.

Work caps, so that a hub costs no more than the cap:

- ``neighbor_cap``: of a node with more neighbours, a sample is scored: the first ``neighbor_cap``
  entries of its CSR slice, which ``build_csr`` orders by a hash of each edge. Deterministic, uniform
  over the slice, and moved by an added or removed edge only when that edge lies inside it.
- ``candidate_cap``: per hop and query, edges are taken from the best source nodes first (sources
  in selection order) until the cap, so the weakest sources lose edges first; a source cut short
  keeps a prefix of its sample.

The max over the selected set is kept exact across hops without re-reading old sources: candidates
not selected at hop h carry their best edge term to hop h+1, where only edges out of the nodes
added at hop h are new (max over S_h = max(max over S_{h-1}, max over the new nodes)). With the
learned relation-path prior nothing is carried: path terms shrink with depth (a prefix's mass
includes all its continuations), so a candidate passed over at hop h would outrank every hop h+1
candidate; a hop's candidates are those reached by the previous hop's nodes, and among a node's
edges tied at its best term the smallest trie node names its path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from seeder.config import AUTO, ConfigError, ExpandConfig, RelationScore, SeederConfig, choices
from seeder.data.ragged import offsets_of, ranges, run_positions
from seeder.data.subgraphs import SubgraphSet, sorted_lookup
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.dense import dense_ranking, ranking_length
from seeder.retrieve.khop_kernels import expand_hops, induced_edges_kernel
from seeder.retrieve.prior import OFF_PATH_TERM, seed_relation_profile
from seeder.retrieve.registry import register
from seeder.retrieve.wording import seed_names
from seeder.system.io import DataError

RELATION_SCORES = choices(RelationScore)

MAX_NODES = (1 << 32) - 1
"""The compiled hops break ties with the node id in the low 32 bits of an int64 key."""

HEAVY_DEGREE = 256
"""Nodes with a larger degree are not scanned when collecting induced edges: their edges to other
selected nodes are looked up in a small sorted index instead (see ``GraphIndex``)."""


@dataclass
class GraphIndex:
    """The CSR arrays plus a sorted index of heavy nodes' out-edges, built once per expansion run.

    Induced edges are found by scanning the CSR slice of every light selected node (degree <=
    ``HEAVY_DEGREE``): its out-edges to selected nodes, and its in-edges from selected heavy nodes.
    Edges between two heavy nodes come from ``heavy_keys`` (heavy rank * N + out-neighbour, sorted),
    so a hub in a subgraph costs a binary search per selected heavy pair, not a scan of its slice
    (``khop_kernels.induced_edges_kernel``).
    """

    indptr: np.ndarray
    neighbors: np.ndarray
    relations: np.ndarray
    num_nodes: int
    num_relations: int
    heavy_nodes: np.ndarray  # sorted ids of nodes with degree > HEAVY_DEGREE
    heavy_mask: np.ndarray  # bool [N]
    heavy_keys: np.ndarray  # int64, sorted
    heavy_rel: np.ndarray  # int32, relation of each heavy_keys entry

    @classmethod
    def build(cls, kg, heavy_degree: int = HEAVY_DEGREE) -> "GraphIndex":
        indptr = np.asarray(kg.indptr)
        num_nodes = kg.num_nodes
        degree = np.diff(indptr)
        heavy = np.flatnonzero(degree > heavy_degree)
        pos, owner = ranges(indptr[heavy], degree[heavy]), np.repeat(np.arange(len(heavy)), degree[heavy])
        rel = np.asarray(kg.edge_relations[pos])
        out = rel < kg.num_relations
        keys = owner[out].astype(np.int64) * num_nodes + np.asarray(kg.neighbors[pos[out]], dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        return cls(
            indptr=indptr,
            neighbors=kg.neighbors,
            relations=kg.edge_relations,
            num_nodes=num_nodes,
            num_relations=kg.num_relations,
            heavy_nodes=heavy,
            heavy_mask=degree > heavy_degree,
            heavy_keys=keys[order],
            heavy_rel=rel[out][order].astype(np.int32),
        )


def _frozen(array) -> np.ndarray:
    """A read-only ndarray view of ``array`` (no copy). The kernels are compiled per argument type,
    and numba types read-only arrays apart: memmapped artifacts are read-only, arrays built in memory
    are not, so passing every large array read-only keeps it to one compilation (~15 s, then cached)."""
    view = np.asarray(array).view()
    view.flags.writeable = False
    return view


class _Clock:
    """Adds the CPU seconds since the previous call to ``timings[phase]`` (no-op without a dict)."""

    def __init__(self, timings: dict[str, float] | None):
        self.timings = timings
        self.last = time.process_time()

    def __call__(self, phase: str) -> None:
        if self.timings is not None:
            now = time.process_time()
            self.timings[phase] = self.timings.get(phase, 0.0) + now - self.last
            self.last = now


def _check_config(cfg: ExpandConfig) -> None:
    if cfg.hops < 0 or (cfg.hops == 0 and cfg.keep_per_hop):
        # 0 (auto) is resolved by pipelines/preprocess.py, whose artifacts hold the derived value.
        raise ConfigError(
            f"expand.hops must be >= 1 here, got {cfg.hops}; hops=0 (auto) is derived only by pipelines/preprocess.py, "
            f"so leave expand.hops out to use the artifacts' value"
        )
    if len(cfg.keep_per_hop) != cfg.hops:
        raise ConfigError(f"expand.keep_per_hop has {len(cfg.keep_per_hop)} entries but expand.hops={cfg.hops}; give one per hop")
    if len(cfg.weights) != 3:
        raise ConfigError(f"expand.weights needs 3 values (w1 sim(q,u), w2 sim(q,v), w3 sim(q,r)), got {cfg.weights}")
    if cfg.relation_score == AUTO:
        raise ConfigError(
            "expand.relation_score=auto is resolved by preprocessing (seeder.preprocessing.derive); expand with the resolved config"
        )
    if cfg.budget < 1 or cfg.neighbor_cap < 1 or cfg.candidate_cap < 1 or min(cfg.keep_per_hop, default=0) < 0:
        raise ConfigError("expand.budget, neighbor_cap and candidate_cap must be positive, keep_per_hop >= 0")


def expand_batch(
    graph: GraphIndex,
    node_features: np.ndarray,
    relation_features: np.ndarray,
    query_features: np.ndarray,
    seeds: np.ndarray,
    cfg: ExpandConfig,
    timings: dict[str, float] | None = None,
    path_terms: np.ndarray | None = None,
    trie_children: np.ndarray | None = None,
    end_terms: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """K-HOP-WITH-FILTERING for one batch of queries.

    Returns flat arrays ordered by (query row, selection order): ``query`` (row in the batch),
    ``nodes``, ``hop``, ``score``, ``path_end``, ``node_ptr`` [Qb+1], and the induced edges ``edge_ptr``,
    ``edge_src``/``edge_dst`` (local indices) and ``edge_rel`` (base relation). ``timings``, when
    given, accumulates CPU seconds per phase, "hops" (seeds included) and "induced edges" (for
    benchmarks).

    With ``expand.relation_score: learned``, ``path_terms`` [Qb, T] and ``trie_children`` [T, 2R] come
    from the relation-path prior (seeder.retrieve.prior): each selected node remembers the trie node of
    its best path from the seed, and the w3 term of an edge v -r-> u is the path term of
    ``trie_children[path(v), r]`` (``OFF_PATH_TERM`` off the trie) instead of sim(q, r). A selected
    node's ``path_end`` is ``end_terms`` [Qb, T] at its path's trie node (0 with the cosine score).
    """
    clock = _Clock(timings)
    learned = cfg.relation_score == "learned"
    if learned and (path_terms is None or trie_children is None or end_terms is None):
        raise ConfigError("expand.relation_score=learned needs the relation-path prior's path terms; rerun preprocessing")
    n = graph.num_nodes
    if n > MAX_NODES:
        raise DataError(f"the graph has {n:,} nodes; K-hop expansion supports at most {MAX_NODES:,} (ids in 32 bits)")
    num_q = len(query_features)
    query_features = np.ascontiguousarray(query_features, dtype=np.float32)
    seeds = np.ascontiguousarray(seeds, dtype=np.int64)
    if seeds.size and seeds.max() >= n:
        raise DataError(f"seed id {int(seeds.max())} is not a node of the graph (N={n}); recompute the seeds")
    relation_features = np.ascontiguousarray(relation_features, dtype=np.float32)
    if learned:
        path_terms = np.ascontiguousarray(path_terms, dtype=np.float32)
        trie_children = np.ascontiguousarray(trie_children, dtype=np.int64)
        end_terms = np.ascontiguousarray(end_terms, dtype=np.float32)
    else:
        path_terms = end_terms = np.zeros((0, 0), np.float32)
        trie_children = np.zeros((0, 0), np.int64)
    counts, nodes, hop, score, path_end = expand_hops(
        _frozen(graph.indptr),
        _frozen(graph.neighbors),
        _frozen(graph.relations),
        _frozen(node_features),
        query_features,
        seeds,
        np.asarray(cfg.keep_per_hop, dtype=np.int64),
        cfg.budget,
        cfg.neighbor_cap,
        cfg.candidate_cap,
        np.asarray(cfg.weights, dtype=np.float32),
        cfg.parent_term == "score",
        learned,
        relation_features,
        path_terms,
        trie_children,
        end_terms,
        np.float32(OFF_PATH_TERM),
    )
    clock("hops")
    out = {
        "query": np.repeat(np.arange(num_q, dtype=np.int64), counts),
        "nodes": nodes,
        "hop": hop,
        "score": score,
        "path_end": path_end,
    }
    out["node_ptr"] = offsets_of(counts)
    out.update(induced_edges(graph, out["nodes"], out["node_ptr"]))
    clock("induced edges")
    return out


def induced_edges(graph: GraphIndex, nodes: np.ndarray, node_ptr: np.ndarray) -> dict[str, np.ndarray]:
    """Every directed KG edge among each query's selected nodes (``nodes[node_ptr[q]:node_ptr[q+1]]``,
    distinct), once, as local indices + base relation, sorted by (query, src, dst, relation)."""
    counts, src, dst, rel = induced_edges_kernel(
        _frozen(graph.indptr),
        _frozen(graph.neighbors),
        _frozen(graph.relations),
        graph.num_relations,
        graph.num_nodes,
        _frozen(graph.heavy_mask),
        _frozen(graph.heavy_nodes),
        _frozen(graph.heavy_keys),
        _frozen(graph.heavy_rel),
        np.ascontiguousarray(nodes, dtype=np.int64),
        np.ascontiguousarray(node_ptr, dtype=np.int64),
    )
    return {"edge_ptr": offsets_of(counts), "edge_src": src, "edge_dst": dst, "edge_rel": rel}


def prior_path_terms(
    kg, graph: GraphIndex, prior, query_features: np.ndarray, seeds: np.ndarray, texts: list[str] | None
) -> tuple[np.ndarray, np.ndarray]:
    """The relation-path prior's [Q, T] log path terms and log ending terms over its trie
    (``RelationPathPrior.path_terms``) for questions with these features, seeds ([Q, k0], -1 padded)
    and texts (read when the prior reads the wording)."""
    profile = seed_relation_profile(graph.indptr, graph.relations, seeds, 2 * graph.num_relations)
    names = seed_names(kg.node_names, seeds) if prior.wording_dim else None
    return prior.path_terms(prior.inputs(query_features, profile, texts, names))


def expand_queries(
    kg,
    node_features: np.ndarray,
    relation_features: np.ndarray,
    query_features: np.ndarray,
    seeds: np.ndarray,
    seed_scores: np.ndarray,
    expand_config: ExpandConfig,
    query_ids: np.ndarray,
    splits: np.ndarray,
    answer_ptr: np.ndarray,
    answers: np.ndarray,
    graph: GraphIndex | None = None,
    progress=None,
    prior=None,
    texts: list[str] | None = None,
    path_terms: tuple[np.ndarray, np.ndarray] | None = None,
    prior_features: np.ndarray | None = None,
) -> SubgraphSet:
    """K-HOP-WITH-FILTERING for Q queries -> their bounded subgraphs (one ``SubgraphSet`` row each).

    ``seeds`` is [Q, k0] padded with -1. Hop-0 scores are the seeds' cosines to the query, recomputed
    from the features (``seed_scores`` may hold NaN for entity-linked seeds; it is not trusted).
    Queries are expanded ``expand.batch_queries`` at a time; ``progress(done)`` is called after each
    batch. Pass a prebuilt ``graph`` (``GraphIndex.build(kg)``) to share it across calls, and the
    ``prior`` (a ``RelationPathPrior``) when ``expand.relation_score`` is ``learned``, with the
    queries' ``texts`` when that prior reads their wording. A caller that has the prior's terms of
    these queries already (``prior_path_terms``, all Q rows) passes them as ``path_terms``; a prior that
    reads masked questions (``prior.question: masked``) reads ``prior_features`` instead of ``query_features``.
    """
    _check_config(expand_config)
    seeds = np.asarray(seeds, dtype=np.int64)
    num_q = len(query_ids)
    if seeds.ndim != 2 or len(seeds) != num_q or len(query_features) != num_q or len(answer_ptr) != num_q + 1:
        raise ValueError(
            f"expand_queries: seeds {seeds.shape}, query_features {len(query_features)} rows and answer_ptr "
            f"{len(answer_ptr)} entries do not match {num_q} query ids"
        )
    if len(relation_features) != 2 * kg.num_relations:
        raise DataError(
            f"relation features have {len(relation_features)} rows, expected 2R = {2 * kg.num_relations} "
            "(base relations, then inverses); recompute the features stage"
        )
    graph = graph or GraphIndex.build(kg)
    answer_ptr = np.asarray(answer_ptr, dtype=np.int64)
    answers = np.asarray(answers, dtype=np.int64)
    chunks = []
    step = max(expand_config.batch_queries, 1)
    for lo in range(0, num_q, step):
        hi = min(lo + step, num_q)
        terms = ends = children = None
        if expand_config.relation_score == "learned":
            if prior is None:
                raise ConfigError("expand.relation_score=learned needs the relation-path prior; run preprocessing")
            if prior.question == "masked" and prior_features is None and path_terms is None:
                raise ConfigError("this relation-path prior reads masked questions (prior.question: masked); pass prior_features")
            if path_terms is not None:
                terms, ends = path_terms[0][lo:hi], path_terms[1][lo:hi]
            else:
                batch_texts = None if texts is None else list(texts[lo:hi])
                reads = query_features if prior_features is None else prior_features
                terms, ends = prior_path_terms(kg, graph, prior, reads[lo:hi], seeds[lo:hi], batch_texts)
            children = prior.trie.children
        chunks.append(
            expand_batch(
                graph,
                node_features,
                relation_features,
                query_features[lo:hi],
                seeds[lo:hi],
                expand_config,
                path_terms=terms,
                trie_children=children,
                end_terms=ends,
            )
        )
        if progress is not None:
            progress(hi)

    def cat(name: str, dtype) -> np.ndarray:
        return np.concatenate([c[name] for c in chunks]).astype(dtype) if chunks else np.zeros(0, dtype)

    def cat_ptr(name: str) -> np.ndarray:
        return offsets_of(np.concatenate([np.diff(c[name]) for c in chunks]) if chunks else np.zeros(0, np.int64))

    node_ptr = cat_ptr("node_ptr")
    nodes = cat("nodes", np.int64)
    query_of_node = np.repeat(np.arange(num_q), np.diff(node_ptr))
    answer_keys = np.unique(np.repeat(np.arange(num_q), np.diff(answer_ptr)) * kg.num_nodes + answers)
    return SubgraphSet(
        query_ids=np.asarray(query_ids, dtype=np.int64),
        splits=np.asarray(splits, dtype=object),
        node_ptr=node_ptr,
        nodes=nodes,
        hop=cat("hop", np.int8),
        score=cat("score", np.float32),
        is_answer=sorted_lookup(answer_keys, query_of_node * kg.num_nodes + nodes)[0],
        path_end=cat("path_end", np.float32),
        edge_ptr=cat_ptr("edge_ptr"),
        edge_src=cat("edge_src", np.int32),
        edge_dst=cat("edge_dst", np.int32),
        edge_rel=cat("edge_rel", np.int32),
        answer_ptr=answer_ptr,
        answers=answers,
    )


# ---------------------------------------------------------------------------------------------------
# The K-HOP-W-FILTER reference retriever


def khop_ranking(subgraphs: SubgraphSet, dense_ids: np.ndarray, length: int) -> RetrievalResult:
    """Rank each subgraph by filter score (ties: smaller id), then continue with the dense order of
    the nodes outside it, up to ``length`` entries; the retrieved set is the subgraph.

    ``dense_ids`` [Q, L'] is the dense ranking; with L' >= length + budget the rows are always full
    (as far as the graph has nodes).
    """
    num_q = len(subgraphs)
    owner = np.repeat(np.arange(num_q), subgraphs.sizes)
    order = np.lexsort((subgraphs.nodes, -subgraphs.score, owner))
    sub_q, sub_nodes = owner[order], subgraphs.nodes[order]
    sub_prio = run_positions(sub_q)
    dq, dcol = np.nonzero(dense_ids >= 0)
    d_nodes = dense_ids[dq, dcol]
    base = int(max(d_nodes.max(initial=-1), sub_nodes.max(initial=-1))) + 1
    outside = ~sorted_lookup(np.sort(sub_q * base + sub_nodes), dq * base + d_nodes)[0]
    q = np.concatenate([sub_q, dq[outside]])
    prio = np.concatenate([sub_prio, dcol[outside] + base])  # subgraph first, then dense order
    nodes = np.concatenate([sub_nodes, d_nodes[outside]])
    order = np.lexsort((prio, q))
    q, nodes = q[order], nodes[order]
    rank = run_positions(q)
    keep = rank < length
    ranking = np.full((num_q, length), -1, dtype=np.int64)
    ranking[q[keep], rank[keep]] = nodes[keep]
    return RetrievalResult(
        query_ids=subgraphs.query_ids.copy(),
        ranking=ranking,
        set_size=np.minimum(subgraphs.sizes, length).astype(np.int64),
    )


@dataclass
class KHopRetriever:
    node_features: np.ndarray
    config: SeederConfig

    def retrieve(self, subgraphs: SubgraphSet, query_features: np.ndarray) -> RetrievalResult:
        length = ranking_length(self.config)
        width = length + int(subgraphs.sizes.max(initial=0))
        dense_ids = dense_ranking(query_features, self.node_features, width, self.config)
        return khop_ranking(subgraphs, dense_ids, length)


@register("khop")
def build_khop(artifacts, config: SeederConfig, model: str | None = None) -> KHopRetriever:
    return KHopRetriever(node_features=artifacts.node_features, config=config)


def path_end_order(subgraphs: SubgraphSet) -> np.ndarray:
    """A score per subgraph node whose descending order is: nodes other than the seeds first (an answer
    is rarely the node the question names), then the prior's path end (the log mass of the relation
    paths that stop at the node's path), then the filter score."""
    owner = np.repeat(np.arange(len(subgraphs)), subgraphs.sizes)
    order = np.lexsort((subgraphs.nodes, -subgraphs.score, -subgraphs.path_end, subgraphs.hop == 0, owner))
    rank = np.empty(len(order), dtype=np.float32)
    rank[order] = run_positions(owner[order])
    return -rank


@dataclass
class PriorRanker:
    """K-HOP-W-FILTER's subgraph ranked by the learned filter's own answer signal, with no policy: what
    the relation-path prior alone retrieves, the reference a trained policy must beat. (``khop`` ranks by
    the filter score, which for the learned filter is a path prefix's mass and puts the seeds and their
    neighbours first.)"""

    khop: KHopRetriever

    def retrieve(self, subgraphs: SubgraphSet, query_features: np.ndarray) -> RetrievalResult:
        if len(subgraphs.nodes) and not subgraphs.path_end.any():
            raise DataError(
                "method 'prior' ranks by the learned relation-path prior, but these artifacts' subgraphs come from "
                "the cosine filter (expand.relation_score=cosine): preprocess with expand.relation_score=learned, "
                "or use --method khop"
            )
        return self.khop.retrieve(replace(subgraphs, score=path_end_order(subgraphs)), query_features)


@register("prior")
def build_prior_ranker(artifacts, config: SeederConfig, model: str | None = None) -> PriorRanker:
    return PriorRanker(build_khop(artifacts, config))
