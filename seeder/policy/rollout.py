"""Batched seed-and-expand rollouts (paper, Algorithm 1 for inference, Algorithm 2 for training).

All trajectories of all queries in a minibatch advance together. A minibatch of B queries becomes a
dense state of G = B x C "copies" (C trajectories per query) over each query's padded node list
``[G, P]`` (P = largest subgraph in the batch). Per expansion step t:

1. frontier U_t: nodes reached by an edge from V_t, minus V_t, best ``frontier_caps[t]`` by filter
   score (one ``topk`` over ``[G, P]``);
2. the GNN runs once on the disjoint union of every copy's induced subgraph on V_t and U_t; the union
   is cut out of the copies' edge list with a boolean mask and relabelled with a cumulative sum;
3. ``expansion_sizes[t]`` frontier nodes join V_t: top-c by logit (greedy) or by Gumbel-perturbed
   logit (sampling without replacement, Plackett-Luce, Kool et al. 2019), and the sampled ordered
   subset's log-probability is accumulated for REINFORCE.

After T steps the scoring head scores V_T. Only the loop over steps and layers is Python.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from seeder.data.ragged import segment_ids
from seeder.data.subgraphs import SubgraphSet
from seeder.policy.model import SeedERPolicy
from seeder.retrieve.base import RetrievalResult
from seeder.retrieve.prior import OFF_PATH_TERM

# Finite stand-in for -inf in logits of absent candidates: keeps logsumexp and its gradient finite
# when a copy has no candidate at all.
NEG = -1e9


@dataclass
class QueryBatch:
    """B queries' bounded subgraphs as tensors, nodes padded to P per query."""

    query_ids: np.ndarray  # int64 [B]
    global_nodes: torch.Tensor  # int64 [B, P], -1 padding
    valid: torch.Tensor  # bool [B, P]
    is_seed: torch.Tensor  # bool [B, P]
    filter_score: torch.Tensor  # float [B, P]
    is_answer: torch.Tensor  # bool [B, P]
    num_answers: torch.Tensor  # float [B]: all answers, inside the subgraph or not
    flat_position: torch.Tensor  # int64 [n]: dense position b * P + p of flat node i
    node_text: torch.Tensor  # float [n, d]
    node_query: torch.Tensor  # int64 [n]: query (0..B-1) of flat node i
    hop: torch.Tensor  # int64 [n]
    flat_score: torch.Tensor  # float [n]
    path_end: torch.Tensor  # float [n]: prior's log mass ending at the node's path (0 with the cosine filter)
    query_features: torch.Tensor  # float [B, d]
    edge_query: torch.Tensor  # int64 [E2]: both directions
    edge_src: torch.Tensor  # int64 [E2], local index in the query
    edge_dst: torch.Tensor  # int64 [E2]
    edge_type: torch.Tensor  # int64 [E2] in 0..2R-1

    @property
    def num_queries(self) -> int:
        return len(self.query_ids)

    @property
    def width(self) -> int:
        return self.valid.shape[1]

    def to(self, device: torch.device | str) -> "QueryBatch":
        """The same batch with every tensor on ``device`` (the rollout follows the batch's device)."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return QueryBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})


def make_query_batch(
    subgraphs: SubgraphSet, node_features: np.ndarray, query_features: np.ndarray, num_relations: int
) -> QueryBatch:
    """Tensors for ``subgraphs`` (B queries). ``query_features`` rows are aligned with ``subgraphs``;
    ``node_features`` is indexed by global node id (a memmap is fine: only these rows are read). Given as
    a tensor on a GPU, the rows are gathered there and ``node_text`` stays on it (``QueryData.on``)."""
    sizes = subgraphs.sizes
    num_queries = len(subgraphs)
    width = max(int(sizes.max(initial=0)), 1)
    node_query = segment_ids(subgraphs.node_ptr)
    local = np.arange(len(subgraphs.nodes)) - subgraphs.node_ptr[node_query]
    flat_position = node_query * width + local

    def dense(values: np.ndarray, fill, dtype) -> torch.Tensor:
        out = np.full(num_queries * width, fill, dtype=dtype)
        out[flat_position] = values
        return torch.from_numpy(out.reshape(num_queries, width))

    edge_query = segment_ids(subgraphs.edge_ptr)
    src = subgraphs.edge_src.astype(np.int64)
    dst = subgraphs.edge_dst.astype(np.int64)
    rel = subgraphs.edge_rel.astype(np.int64)
    # Both directions: the inverse of u -r-> v is v -(r+R)-> u.
    both_query = np.concatenate([edge_query, edge_query])
    both_src = np.concatenate([src, dst])
    both_dst = np.concatenate([dst, src])
    both_type = np.concatenate([rel, rel + num_relations])
    if isinstance(node_features, torch.Tensor):  # rows already on a GPU (QueryData.on): gather them there
        text = node_features[torch.from_numpy(subgraphs.nodes).to(node_features.device)]
    elif isinstance(node_features, np.memmap):  # read each row from disk once, in file order
        unique_nodes, inverse = np.unique(subgraphs.nodes, return_inverse=True)
        text = torch.from_numpy(np.asarray(node_features[unique_nodes], dtype=np.float32)[inverse])
    else:  # in memory: one gather, unsorted (sorting the ids first cost more than it saved), by
        # np.take, which gives whole rows faster than fancy indexing
        text = torch.from_numpy(np.asarray(np.take(node_features, subgraphs.nodes, axis=0), dtype=np.float32))
    return QueryBatch(
        query_ids=subgraphs.query_ids,
        global_nodes=dense(subgraphs.nodes, -1, np.int64),
        valid=dense(np.ones(len(local), bool), False, bool),
        is_seed=dense(subgraphs.hop == 0, False, bool),
        filter_score=dense(subgraphs.score.astype(np.float32), 0.0, np.float32),
        is_answer=dense(subgraphs.is_answer, False, bool),
        num_answers=torch.from_numpy(np.maximum(subgraphs.num_answers, 1).astype(np.float32)),
        flat_position=torch.from_numpy(flat_position),
        node_text=text,
        node_query=torch.from_numpy(node_query),
        hop=torch.from_numpy(subgraphs.hop.astype(np.int64)),
        flat_score=torch.from_numpy(subgraphs.score.astype(np.float32)),
        path_end=torch.from_numpy(subgraphs.path_end.astype(np.float32)),
        query_features=torch.from_numpy(np.asarray(query_features, dtype=np.float32)),
        edge_query=torch.from_numpy(both_query),
        edge_src=torch.from_numpy(both_src),
        edge_dst=torch.from_numpy(both_dst),
        edge_type=torch.from_numpy(both_type),
    )


@dataclass
class RolloutOutput:
    selected: torch.Tensor  # bool [G, P]: V_T of every copy
    reached_at: torch.Tensor  # int64 [G, P]: 0 seeds, t+1 added at step t, -1 never
    scores: torch.Tensor  # float [G, P]: final score on V_T, NEG elsewhere
    log_prob: torch.Tensor  # float [G]: log-probability of the sampled ordered picks
    copies: int


def gumbel_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    # Drawn on the CPU generator (reproducible, checkpointed) and moved: the same noise on any device.
    u = torch.rand(x.shape, generator=generator, dtype=x.dtype).to(x.device).clamp_(1e-10, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


def plackett_luce_log_prob(logits: torch.Tensor, picks: torch.Tensor, pick_ok: torch.Tensor) -> torch.Tensor:
    """Log-probability of ordered picks without replacement under Plackett-Luce.

    logits [G, F] (absent candidates at NEG), picks [G, k] candidate indices in pick order,
    pick_ok [G, k] which picks count. Pick j contributes logit - logsumexp over candidates not yet picked.

    The candidates not yet picked at pick j are those never picked plus picks j, j+1, ...: so the
    normaliser is logaddexp(logsumexp over the never-picked, a reverse logcumsumexp over the picks),
    [G, F] and [G, k] work instead of a [G, k, F] mask (5x faster forward and backward at G=128,
    F=100, k=20). Both terms are sums of positives: no cancellation, however wide the logits spread.
    """
    picked = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, picks, pick_ok)
    never_picked = torch.logsumexp(logits.masked_fill(picked, NEG), dim=1, keepdim=True)
    chosen = logits.gather(1, picks)
    from_here = torch.logcumsumexp(chosen.masked_fill(~pick_ok, NEG).flip(1), dim=1).flip(1)
    log_norm = torch.logaddexp(never_picked, from_here)
    return torch.where(pick_ok, chosen - log_norm, torch.zeros_like(chosen)).sum(1)


def sample_top_k(
    logits: torch.Tensor,
    available: torch.Tensor,
    k: int,
    greedy: torch.Tensor | bool,
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick k of the available candidates per row: top-k by logit where ``greedy`` [G], else Gumbel-top-k
    at ``temperature``. Returns picks [G, k'], pick_ok [G, k'] and the Plackett-Luce log-prob [G].
    ``greedy=True`` (inference: every row greedy, nothing to differentiate) draws no noise and returns
    a zero log-prob, without building the [G, k, F] tensors of the Plackett-Luce term."""
    k = min(k, logits.shape[1])
    scaled = (logits / temperature).masked_fill(~available, NEG)
    if greedy is True:
        picks = torch.topk(scaled.masked_fill(~available, float("-inf")), k, dim=1).indices
        return picks, available.gather(1, picks), scaled.new_zeros(len(scaled))
    with torch.no_grad():
        perturbed = scaled + gumbel_like(scaled, generator) * (~greedy).unsqueeze(1).to(scaled.dtype)
        perturbed = perturbed.masked_fill(~available, float("-inf"))
        picks = torch.topk(perturbed, k, dim=1).indices
        pick_ok = available.gather(1, picks)
    return picks, pick_ok, plackett_luce_log_prob(scaled, picks, pick_ok)


class Rollout:
    """The per-minibatch part of a rollout that does not depend on the step: copies, edges, encodings."""

    def __init__(self, model: SeedERPolicy, batch: QueryBatch, relation_features: torch.Tensor, copies: int):
        self.model, self.batch, self.copies = model, batch, copies
        num_queries, width = batch.num_queries, batch.width
        self.width = width
        self.num_copies = num_queries * copies
        self.node_state = model.encode_nodes(
            batch.node_text, batch.query_features, batch.node_query, batch.hop, batch.flat_score, batch.path_end
        )  # [n, hidden], shared by every copy of a query
        device = self.device = batch.valid.device
        self.dense_to_flat = torch.full((num_queries * width,), -1, dtype=torch.long, device=device)
        self.dense_to_flat[batch.flat_position] = torch.arange(len(batch.flat_position), device=device)
        self.query_ctx_per_query = model.encode_queries(batch.query_features)  # [B, hidden]
        self.copy_query = torch.arange(num_queries, device=device).repeat_interleave(copies)
        self.query_ctx = self.query_ctx_per_query.index_select(0, self.copy_query)  # [G, hidden]
        self.num_types = relation_features.shape[0]
        # [B, S, 2R, hidden] edge-type embeddings, projected for every layer once for all steps.
        self.relation_tables = model.relation_tables(model.encode_relations(relation_features, batch.query_features))
        self._edges: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def flat_nodes(self, positions: torch.Tensor, copies: int | None = None) -> torch.Tensor:
        """Dense positions g * P + p of ``copies`` copies -> the flat node index of the query's own node."""
        copies = self.copies if copies is None else copies
        query_position = (positions // (self.width * copies)) * self.width + positions % self.width
        return self.dense_to_flat[query_position]

    def path_end_at(self, positions: torch.Tensor, copies: int | None = None) -> torch.Tensor:
        """The prior's path_end of the nodes at dense positions of ``copies`` copies."""
        return self.batch.path_end[self.flat_nodes(positions, copies)]

    def join_prior_ends(self, selected: torch.Tensor, count: int) -> torch.Tensor:
        """[G, P]: up to ``count`` nodes per copy outside ``selected`` that end one of the prior's relation
        paths, the largest path_end first and then the filter score (the prior alone's order,
        ``seeder.retrieve.khop.path_end_order``). The learned expansion loses some answers that the prior
        puts first: on three-hop questions worded unlike its training questions, its set holds an answer
        less often than the subgraph it expands in. Nodes off every prior path never join."""
        valid = self.expand(self.batch.valid)
        flat = valid.reshape(-1).nonzero().squeeze(1)
        path_end = torch.full((valid.numel(),), float("-inf"), device=self.device)
        path_end = path_end.index_put((flat,), self.path_end_at(flat).to(path_end.dtype)).view_as(valid)
        candidate = valid & ~selected & (path_end > OFF_PATH_TERM)
        # Two stable sorts give the order (path_end, then filter score), both descending.
        filter_score = self.expand(self.batch.filter_score).masked_fill(~candidate, float("-inf"))
        order = torch.argsort(filter_score, dim=1, descending=True, stable=True)
        by_end = path_end.masked_fill(~candidate, float("-inf")).gather(1, order)
        order = order.gather(1, torch.argsort(by_end, dim=1, descending=True, stable=True))[:, : min(count, valid.shape[1])]
        return torch.zeros_like(selected).scatter(1, order, candidate.gather(1, order))

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """A per-query [B, ...] tensor -> one row per copy [G, ...]."""
        return x.repeat_interleave(self.copies, 0)

    def edges(self, copies: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Edges of ``copies`` copies of every query, at dense positions g * P + p (cached)."""
        if copies not in self._edges:
            batch = self.batch
            base = (batch.edge_query * copies).repeat_interleave(copies) + torch.arange(copies, device=self.device).repeat(
                len(batch.edge_query)
            )
            src = base * self.width + batch.edge_src.repeat_interleave(copies)
            dst = base * self.width + batch.edge_dst.repeat_interleave(copies)
            typed = batch.edge_query * self.num_types + batch.edge_type  # the query's view of the relation
            self._edges[copies] = (src, dst, typed.repeat_interleave(copies))
        return self._edges[copies]

    def frontier(self, selected: torch.Tensor, cap: int, copies: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """U_t: neighbours of V_t minus V_t, best ``cap`` by filter score. -> index [G, cap], ok [G, cap]."""
        copies = self.copies if copies is None else copies
        src, dst, _ = self.edges(copies)
        flat_selected = selected.reshape(-1)
        reached = torch.zeros_like(flat_selected)
        reached[dst[flat_selected[src]]] = True
        per_copy = lambda x: x.repeat_interleave(copies, 0)  # noqa: E731
        candidate = reached.view_as(selected) & ~selected & per_copy(self.batch.valid)
        priority = per_copy(self.batch.filter_score).masked_fill(~candidate, float("-inf"))
        # No wider than the largest frontier of the batch: with the eval caps (300) most columns would
        # be padding, and every later tensor of the step is [G, width].
        width = max(1, min(cap, self.width, int(candidate.sum(1).max())))
        index = torch.topk(priority, width, dim=1).indices
        return index, candidate.gather(1, index)

    def embed(
        self, active: torch.Tensor, reached_at: torch.Tensor, copies: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GNN on the disjoint union of every copy's induced subgraph on ``active`` [G, P]; ``reached_at``
        [G, P] is each node's step (-1 not selected, 0 seed, t + 1 added at step t).
        Returns node embeddings [n_active, hidden] and the compact index of every dense position."""
        copies = self.copies if copies is None else copies
        src, dst, edge_type = self.edges(copies)
        flat_active = active.reshape(-1)
        compact = torch.cumsum(flat_active.long(), 0) - 1
        # One nonzero for the kept edges, then gathers (a boolean index per array repeats the nonzero).
        keep = (flat_active[src] & flat_active[dst]).nonzero().squeeze(1)
        edge_index = torch.stack([compact[src.index_select(0, keep)], compact[dst.index_select(0, keep)]])
        positions = flat_active.nonzero().squeeze(1)
        # index_select, not [idx]: its backward is an index_add; advanced indexing's accumulating
        # index_put was 5% of a MetaQA training step on the CPU.
        state = self.node_state.index_select(0, self.flat_nodes(positions, copies))
        h = self.model.propagate(
            state, reached_at.reshape(-1)[positions] + 1, edge_index, edge_type.index_select(0, keep), self.relation_tables
        )
        return h, compact

    def _expansion_logits(
        self, reached_at: torch.Tensor, cap: int, copies: int, query_ctx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        selected = reached_at >= 0
        front_index, front_ok = self.frontier(selected, cap, copies)
        rows = torch.arange(len(selected), device=self.device).unsqueeze(1).expand_as(front_index)
        active = selected.clone()
        active[rows[front_ok], front_index[front_ok]] = True
        h, compact = self.embed(active, reached_at, copies)
        # The head runs on the frontier's real candidates only; padding keeps logit 0 (masked later).
        ok_rows, ok_cols = front_ok.nonzero(as_tuple=True)
        front_h = h.index_select(0, compact[ok_rows * self.width + front_index[ok_rows, ok_cols]])
        logits = h.new_zeros(front_index.shape).index_put(
            (ok_rows, ok_cols), self.model.expansion_logits(front_h, query_ctx.index_select(0, ok_rows))
        )
        return front_index, front_ok, logits

    def run(
        self,
        expansion_sizes: list[int],
        frontier_caps: list[int],
        greedy: torch.Tensor | bool,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        prior_nodes: int = 0,
    ) -> RolloutOutput:
        """Algorithm 1's expansion steps, then the final set's scores. ``prior_nodes`` > 0 (inference
        only, ``eval.prior_nodes``): that many of the prior's best path ends join the set before it is
        scored (``join_prior_ends``)."""
        valid = self.expand(self.batch.valid)
        selected = self.expand(self.batch.is_seed) & valid
        reached_at = torch.where(selected, 0, -1)
        log_prob = self.query_ctx.new_zeros(self.num_copies)
        rows = torch.arange(self.num_copies, device=self.device).unsqueeze(1)
        for step, (size, cap) in enumerate(zip(expansion_sizes, frontier_caps)):
            if step == 0:
                # Every copy starts from the same seeds: run the GNN once per query, share the logits.
                seeds = torch.where(self.batch.is_seed & self.batch.valid, 0, -1)
                front_index, front_ok, logits = self._expansion_logits(seeds, cap, 1, self.query_ctx_per_query)
                front_index, front_ok, logits = self.expand(front_index), self.expand(front_ok), self.expand(logits)
            else:
                front_index, front_ok, logits = self._expansion_logits(reached_at, cap, self.copies, self.query_ctx)
            picks, pick_ok, step_log_prob = sample_top_k(logits, front_ok, size, greedy, temperature, generator)
            log_prob = log_prob + step_log_prob
            chosen = front_index.gather(1, picks)
            selected = selected.clone()
            selected[rows.expand_as(chosen)[pick_ok], chosen[pick_ok]] = True
            reached_at = torch.where(selected & (reached_at < 0), step + 1, reached_at)
        if prior_nodes:
            # Joined nodes enter as the last step's: the state the layers were trained to read.
            joined = self.join_prior_ends(selected, prior_nodes)
            selected = selected | joined
            reached_at = torch.where(joined, len(expansion_sizes), reached_at)
        h, compact = self.embed(selected, reached_at)
        positions = selected.reshape(-1).nonzero().squeeze(1)
        node_scores = self.model.scores(h, self.query_ctx.index_select(0, positions // self.width), self.path_end_at(positions))
        scores = h.new_full((self.num_copies * self.width,), NEG).index_put((positions,), node_scores)
        return RolloutOutput(selected, reached_at, scores.view_as(selected), log_prob, self.copies)


def score_whole_subgraph(model: SeedERPolicy, batch: QueryBatch, relation_features: torch.Tensor) -> torch.Tensor:
    """Ablation 'GNN reranking': score every node of the bounded subgraph, no learned expansion. -> [B, P]."""
    rollout = Rollout(model, batch, relation_features, copies=1)
    h, _ = rollout.embed(batch.valid, torch.where(batch.valid, 0, -1))
    positions = batch.valid.reshape(-1).nonzero().squeeze(1)
    node_scores = model.scores(h, rollout.query_ctx.index_select(0, positions // batch.width), rollout.path_end_at(positions, 1))
    scores = h.new_full((batch.valid.numel(),), NEG).index_put((positions,), node_scores)
    return scores.view_as(batch.valid)


def recall_of_sets(selected: torch.Tensor, batch: QueryBatch, copies: int) -> torch.Tensor:
    """Reward: Recall@any of every copy's final set (answers found / all answers of the query). -> [G]."""
    hits = (selected & batch.is_answer.repeat_interleave(copies, 0)).sum(1).to(torch.float32)
    return hits / batch.num_answers.repeat_interleave(copies)


def rank_nodes(batch: QueryBatch, in_set: torch.Tensor, set_scores: torch.Tensor, length: int) -> RetrievalResult:
    """Full ranking per query: the set by model score first, then the rest of the subgraph by filter
    score, ties by node id; padded with -1. in_set / set_scores are [B, P]."""
    node_id = batch.global_nodes
    secondary = torch.where(in_set, set_scores, batch.filter_score)
    group = torch.where(in_set, 0, torch.where(batch.valid, 1, 2))
    # Three stable sorts give the lexicographic order (group, -secondary, node id).
    order = torch.argsort(node_id, dim=1, stable=True)
    order = order.gather(1, torch.argsort(-secondary.gather(1, order), dim=1, stable=True))
    order = order.gather(1, torch.argsort(group.gather(1, order), dim=1, stable=True))
    ranked = node_id.gather(1, order).masked_fill(group.gather(1, order) == 2, -1)
    ranking = np.full((batch.num_queries, length), -1, dtype=np.int64)
    width = min(length, ranked.shape[1])
    ranking[:, :width] = ranked[:, :width].cpu().numpy()
    set_size = np.minimum(in_set.sum(1).cpu().numpy().astype(np.int64), length)
    return RetrievalResult(query_ids=np.asarray(batch.query_ids, dtype=np.int64), ranking=ranking, set_size=set_size)
