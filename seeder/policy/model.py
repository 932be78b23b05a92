"""The SeedER policy network: a query-conditioned sparse graph transformer (paper, Section 4.1, App. D.2).

One network serves both decisions of a rollout:

- the expansion head ``g(h_u, z_q)`` gives one logit per frontier node (Algorithm 1, line "select c_t");
- the scoring head gives two-class logits per node of the final set; their difference is the node's
  final score (Appendix D.5), trained with BPR.

Attention runs only along the edges of the induced subgraph of the nodes a step looks at, and every edge
modulates its keys and values with an embedding of its relation text and direction (and, with
``model.step_relations``, of the rollout state of its source node):
``a_ij = Q_i . (K_j * E^K_ij) / sqrt(d)``, softmax over each target's incoming edges, messages
``alpha_ij (V_j + E^V_ij)``. Edge embeddings depend only on the relation id (``r`` or ``r + R`` for the
inverse direction), the query and the source's state, so a rollout projects the ``B x S x 2R``
relation rows once per layer for all its steps and gathers them per edge.

The attention itself (gathers per edge, the softmax over each target's incoming edges, the sum of the
messages) is ``seeder.policy.ops.edge_attention.edge_attention``, and the update of every node after it (output
product, residuals, LayerNorms, feed-forward network) is ``seeder.policy.ops.node_update.node_update``: each is one
autograd step with compiled kernels on the CPU, and the modules' torch ops on a GPU and under
torch.compile.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from seeder.config import ConfigError, ModelConfig
from seeder.policy.ops.dropout import ByteDropout
from seeder.policy.ops.edge_attention import EdgeIndex, edge_attention, edge_index_for
from seeder.policy.ops.node_update import node_update

# Hop distances above this share one embedding (the bounded subgraphs have K <= 3 in the paper).
MAX_HOP = 4
# Expansion steps with their own state embedding (the paper uses T <= 3); later steps share the last.
MAX_STEPS = 6


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b``. Under torch.compile (serving) the bias of a 2-D ``x`` is added to a view of the
    product instead of inside the GEMM: compiled, an addmm first copies the broadcast bias into its whole
    output (on the CPU 5.1 ms of a [19K, 64] x [64, 192] addmm, against 3.0 for the product), while
    an add is fused into the kernel that reads the product. Run eagerly, addmm is as fast or faster."""
    if bias is None or x.dim() != 2 or not torch.compiler.is_compiling():
        return nn.functional.linear(x, weight, bias)
    # A view in between, or inductor's pattern matcher fuses the add back into an addmm on the CPU.
    return (torch.mm(x, weight.t()).unsqueeze(1) + bias).squeeze(1)


class Linear(nn.Linear):
    """``nn.Linear`` through ``linear``: the layers that run once per node or edge."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def _mlp(in_dim: int, hidden: int, out_dim: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(Linear(in_dim, hidden), nn.GELU(), ByteDropout(dropout), Linear(hidden, out_dim))


class EdgeModulatedAttention(nn.Module):
    """One sparse transformer layer with relation-modulated attention, residuals, LayerNorm and a FFN."""

    def __init__(self, hidden_dim: int, num_heads: int, dropout: float):
        super().__init__()
        if hidden_dim % num_heads:
            raise ConfigError(f"model.hidden_dim={hidden_dim} must be divisible by model.num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads
        self.query = nn.Linear(hidden_dim, hidden_dim)
        self.key = nn.Linear(hidden_dim, hidden_dim)
        self.value = nn.Linear(hidden_dim, hidden_dim)
        self.edge_key = nn.Linear(hidden_dim, hidden_dim)
        self.edge_value = nn.Linear(hidden_dim, hidden_dim)
        self.out = Linear(hidden_dim, hidden_dim)
        self.norm_attention = nn.LayerNorm(hidden_dim)
        self.norm_ffn = nn.LayerNorm(hidden_dim)
        self.ffn = _mlp(hidden_dim, 2 * hidden_dim, hidden_dim, dropout)
        self.dropout = ByteDropout(dropout)

    def edge_tables(self, relation_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value modulation of every edge type: relation rows [T, hidden] -> two [T, heads,
        head_dim]. They depend on the query but not on the rollout step, so a rollout projects them once
        for all its propagations (``SeedERPolicy.relation_tables``) and each layer gathers them per edge."""
        heads, dh = self.num_heads, self.head_dim
        return (self.edge_key(relation_rows).view(-1, heads, dh), self.edge_value(relation_rows).view(-1, heads, dh))

    def forward(self, x: torch.Tensor, edges: EdgeIndex, tables: tuple[torch.Tensor, torch.Tensor]):
        n, heads, dh = x.shape[0], self.num_heads, self.head_dim
        # Q, K and V as one product: a third of the kernel launches, which dominate a single question.
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = linear(x, weight, bias).view(n, 3, heads, dh)
        keep = self.dropout.mask((len(edges.src), heads), x)  # dropout on the attention weights
        aggregated = edge_attention(qkv, *tables, edges, keep).reshape(n, heads * dh)
        return node_update(self, x, aggregated)


class RelationTables(NamedTuple):
    """Per-layer edge-type tables of a minibatch (``SeedERPolicy.relation_tables``)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    num_states: int
    num_types: int


class SeedERPolicy(nn.Module):
    """Query-conditioned graph transformer with an expansion head and a scoring head.

    Inputs are split so that a rollout pays for the expensive part once per minibatch:
    ``encode_nodes`` turns each subgraph node's text embedding, the query embedding and cheap structural
    features (hop from the seeds, K-hop filter score, the relation-path prior's log mass ending at the
    node's path) into a hidden vector once per query; every
    expansion step then adds a state embedding (in the current set V_t, or frontier U_t) and runs
    ``propagate`` on the induced subgraph of V_t and U_t of every trajectory at once.
    """

    def __init__(self, feature_dim: int, config: ModelConfig):
        super().__init__()
        hidden = config.hidden_dim
        self.config = config
        self.feature_dim = feature_dim
        self.query_injection = config.query_injection
        # W_q of the query injection (paper, Section 4.1).
        self.query_map = nn.Linear(feature_dim, feature_dim, bias=False)
        structural = MAX_HOP + 3  # one-hot hop, filter score, path end
        text_in = 2 * feature_dim + 1 if config.query_injection == "concat" else feature_dim
        self.input_proj = nn.Sequential(Linear(text_in + structural, hidden), nn.GELU(), Linear(hidden, hidden))
        # Rollout state of a node: 0 frontier candidate, 1 seed, t + 2 added at expansion step t.
        self.state_embedding = nn.Embedding(MAX_STEPS + 2, hidden)
        self.relation_proj = nn.Linear(feature_dim, hidden)
        # Query-conditioned part of an edge's embedding: z_q * z_r and cos(z_q, z_r), the relation term of
        # K-HOP-WITH-FILTERING's score (Section 3), so attention can follow the relations the query names.
        self.relation_query_proj = nn.Linear(feature_dim + 1, hidden)
        self.direction_embedding = nn.Embedding(2, hidden)  # 0: r as stored, 1: inverse r + R
        # Step-aware relations: a bilinear match z_q^T A_s^T B z_r per rollout state s of the edge's source,
        # so "r leaves the seed" and "r leaves a node added at step 1" can match different parts of the
        # question (which relation comes first in "the r2 of the r1 of X"). A plain z_q * z_r term only
        # tells whether the question names r, not where.
        self.num_source_states = MAX_STEPS + 2 if config.step_relations else 1
        if config.step_relations:
            self.state_query_maps = nn.Parameter(torch.randn(self.num_source_states, feature_dim, hidden) / feature_dim**0.5)
            self.relation_match = nn.Linear(feature_dim, hidden, bias=False)
        self.layers = nn.ModuleList(
            EdgeModulatedAttention(hidden, config.num_heads, config.dropout) for _ in range(config.num_layers)
        )
        self.query_context = nn.Linear(feature_dim, hidden)
        self.expansion_head = _mlp(3 * hidden, hidden, 1, config.dropout)
        self.scoring_head = _mlp(3 * hidden, hidden, 2, config.dropout)
        # The prior's path_end as a residual of the final score (model.path_end_residual).
        self.path_end_weight = nn.Parameter(torch.ones(())) if config.path_end_residual else None

    # -- pieces called by the rollout -------------------------------------------------------------

    def encode_nodes(
        self,
        node_text: torch.Tensor,
        query_features: torch.Tensor,
        node_query: torch.Tensor,
        hop: torch.Tensor,
        filter_score: torch.Tensor,
        path_end: torch.Tensor,
    ) -> torch.Tensor:
        """[n, d] node embeddings, [B, d] query embeddings with ``node_query`` [n] the query row of each
        node, hop [n], filter score [n] and path end [n] (seeder.data.subgraphs: 0 with the cosine filter)
        -> [n, hidden].

        The path end tells the scoring head where the predicted relation path stops, which the filter
        score (a prefix's mass includes its continuations) blurs. The query's share of the input
        projection (W_q z_q, then its block of the first layer) is computed once per query and gathered,
        not once per node: per node it was most of the cost of ranking a batch (a 256 x 256 product for
        each of ~170 nodes per question)."""
        first, rest = self.input_proj[0], self.input_proj[1:]
        injected = self.query_map(query_features)  # [B, d]
        hop_onehot = nn.functional.one_hot(hop.long().clamp(0, MAX_HOP), MAX_HOP + 1).to(node_text.dtype)
        scalars = torch.stack([filter_score, path_end], -1).to(node_text.dtype)
        if self.query_injection == "add":
            text = node_text + injected.index_select(0, node_query)
            return self.input_proj(torch.cat([text, hop_onehot, scalars], -1))
        d, weight = self.feature_dim, first.weight  # input blocks: [text | W_q z_q | cosine, hop, scalars]
        per_query = nn.functional.linear(injected, weight[:, d : 2 * d])  # [B, hidden]
        cosine = nn.functional.cosine_similarity(
            node_text, query_features.index_select(0, node_query), dim=-1, eps=1e-8
        ).unsqueeze(-1)
        structural = torch.cat([cosine, hop_onehot, scalars], -1)
        hidden = (
            linear(node_text, weight[:, :d], first.bias)
            + per_query.index_select(0, node_query)
            + nn.functional.linear(structural, weight[:, 2 * d :])
        )
        return rest(hidden)

    def encode_relations(self, relation_features: torch.Tensor, query_features: torch.Tensor) -> torch.Tensor:
        """[2R, d] relation text embeddings (base, then inverses) and [B, d] queries -> [B, S, 2R, hidden]
        edge-type embeddings: relation r as seen by query b from a source in rollout state s (S = 1
        unless ``model.step_relations``; then s is the state index of ``propagate``'s ``node_step``)."""
        num_types = relation_features.shape[0]
        direction = (torch.arange(num_types, device=relation_features.device) >= num_types // 2).long()
        base = self.relation_proj(relation_features) + self.direction_embedding(direction)  # [2R, hidden]
        product = query_features.unsqueeze(1) * relation_features  # [B, 2R, d]
        cosine = nn.functional.cosine_similarity(query_features.unsqueeze(1), relation_features, dim=-1, eps=1e-8).unsqueeze(-1)
        conditioned = self.relation_query_proj(torch.cat([product, cosine], -1)).unsqueeze(1)  # [B, 1, 2R, hidden]
        if self.num_source_states == 1:
            return base + conditioned
        per_state = torch.einsum("bd,sdh->bsh", query_features, self.state_query_maps)  # [B, S, hidden]
        match = per_state.unsqueeze(2) * self.relation_match(relation_features)  # [B, S, 2R, hidden]
        return base + conditioned + match

    def encode_queries(self, query_features: torch.Tensor) -> torch.Tensor:
        """[B, d] -> [B, hidden] query context for the heads."""
        return self.query_context(query_features)

    def relation_tables(self, relation_emb: torch.Tensor) -> RelationTables:
        """Every layer's edge tables for ``relation_emb`` (``encode_relations``, [B, S, 2R, hidden]):
        computed once per rollout, shared by its propagations."""
        rows = relation_emb.reshape(-1, relation_emb.shape[-1])
        return RelationTables([layer.edge_tables(rows) for layer in self.layers], relation_emb.shape[1], relation_emb.shape[2])

    def propagate(
        self,
        node_state: torch.Tensor,
        node_step: torch.Tensor,
        edge_index: torch.Tensor,
        edge_type: torch.Tensor,
        tables: RelationTables,
    ) -> torch.Tensor:
        """Run the layers on a (batched) graph. node_state [n, hidden], node_step [n] (0 frontier, 1 seed,
        t + 2 added at step t; a bool "selected" works too), edge_type [E] = query * 2R + relation,
        ``tables`` from ``relation_tables`` -> [n, hidden]."""
        step = node_step.long().clamp(0, MAX_STEPS + 1)
        x = node_state + self.state_embedding(step)
        num_states, num_types = tables.num_states, tables.num_types
        if num_states > 1:
            source_state = step.index_select(0, edge_index[0])
            typed = ((edge_type // num_types) * num_states + source_state) * num_types + edge_type % num_types
        else:
            # One state: the row is the edge type itself. Spelled out, the arithmetic was fused into every
            # element of every layer's edge kernels (a division and a modulo per float) by torch.compile.
            typed = edge_type
        edges = edge_index_for(edge_index[0], edge_index[1], typed, len(x), x)
        for layer, layer_tables in zip(self.layers, tables.layers):
            x = layer(x, edges, layer_tables)
        return x

    def expansion_logits(self, h: torch.Tensor, query_ctx: torch.Tensor) -> torch.Tensor:
        """g(h_u, z_q): one logit per node. h [n, hidden], query_ctx [n, hidden] -> [n]."""
        return self.expansion_head(torch.cat([h, query_ctx, h * query_ctx], -1)).squeeze(-1)

    def scores(self, h: torch.Tensor, query_ctx: torch.Tensor, path_end: torch.Tensor) -> torch.Tensor:
        """Final score: difference of the scoring head's two-class logits (paper, Appendix D.5), plus
        ``w * path_end`` [n] with ``model.path_end_residual`` -> [n]."""
        two = self.scoring_head(torch.cat([h, query_ctx, h * query_ctx], -1))
        score = two[:, 1] - two[:, 0]
        if self.path_end_weight is None:
            return score
        return score + self.path_end_weight * path_end.to(score.dtype)

    def forward(
        self,
        node_text: torch.Tensor,
        query_features: torch.Tensor,
        node_graph: torch.Tensor,
        hop: torch.Tensor,
        filter_score: torch.Tensor,
        path_end: torch.Tensor,
        selected: torch.Tensor,
        edge_index: torch.Tensor,
        edge_type: torch.Tensor,
        relation_features: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Whole-graph call (tests, reranking) on a batch of graphs: node i belongs to graph
        ``node_graph[i]`` whose query is ``query_features[node_graph[i]]``; edge types are base ids
        (< 2R). Returns node embeddings, expansion logits and scores per node."""
        node_query = query_features[node_graph]
        state = self.encode_nodes(node_text, query_features, node_graph, hop, filter_score, path_end)
        relation_emb = self.encode_relations(relation_features, query_features)
        typed = node_graph[edge_index[1]] * relation_features.shape[0] + edge_type
        h = self.propagate(state, selected, edge_index, typed, self.relation_tables(relation_emb))
        ctx = self.query_context(node_query)
        return h, self.expansion_logits(h, ctx), self.scores(h, ctx, path_end)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
