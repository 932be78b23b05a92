"""Relation-modulated sparse attention of one layer, fused per target node on the CPU (paper, Section 4.1).

For every edge j -> i of type t, with queries, keys and values of H heads of size D,

    a_ji  = Q_i . (K_j * E^K_t) / sqrt(D)                 logits, softmax over i's incoming edges
    out_i = sum_j alpha_ji * drop_ji * (V_j + E^V_t)       aggregated messages

Written with torch ops (``edge_attention_torch``, the path on a GPU and the reference of the tests), a
layer materialises about ten [E, H, D] tensors forward and as many backward: gathers of Q, K, V and the
edge tables per edge, their products, and scatter-adds back to the nodes. On a CPU these passes over
memory were most of a training step (per-edge products, scatter-adds and index_select's backward
together over 40% of a MetaQA step, spread over some twenty kernels). Here one compiled pass over the
edges, grouped by target, computes a target's logits, softmax and messages while its rows are in the
cache, and the backward is two such passes (over targets, then over sources): only [E, H] logits
and probabilities are kept in between, and nothing of size [E, H, D] is ever written. The kernels
are in ``seeder.policy.ops.kernels``, loaded on the CPU path only (``uses_cpu_kernels``).

The softmax is the same as the torch path's: the maximum is subtracted per target (no gradient
through it) and the normaliser is the sum plus 1e-16; dropout multiplies the probabilities by a mask
drawn for [E, H] (``ByteDropout.mask``). Sums run in float32 in another order than torch's, so the
two paths agree to rounding, not bit for bit.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from seeder.policy.ops.dropout import uses_cpu_kernels


def edge_attention_torch(
    qkv: torch.Tensor,
    edge_key: torch.Tensor,
    edge_value: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    edge_type: torch.Tensor,
    keep: torch.Tensor | None,
) -> torch.Tensor:
    """The layer's attention with torch ops. qkv [n, 3, H, D]; edge_key, edge_value [T, H, D]; src, dst,
    edge_type [E]; keep [E, H] (the dropout mask, scaled) or None -> [n, H, D]."""
    n, _, heads, dh = qkv.shape
    q, k, v = qkv.unbind(1)
    # index_select, not x[idx]: its backward is an index_add, several times faster on CPU than the
    # accumulating index_put of advanced indexing.
    ek, ev = edge_key.index_select(0, edge_type), edge_value.index_select(0, edge_type)
    logits = (q.index_select(0, dst) * k.index_select(0, src) * ek).sum(-1) / math.sqrt(dh)  # [E, H]
    alpha = segment_softmax(logits, dst, n)
    if keep is not None:
        alpha = alpha * keep
    messages = alpha.unsqueeze(-1) * (v.index_select(0, src) + ev)
    return segment_sum(messages, dst, n)


def _per_row(index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``index`` (``[E]``) broadcast over the trailing dimensions of ``src`` (``[E, ...]``), as scatter wants."""
    return index.view(-1, *([1] * (src.dim() - 1))).expand_as(src)


def segment_sum(src: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Sum the rows of ``src`` (``[E, ...]``) into ``num_segments`` rows by ``index`` (``[E]``)."""
    return src.new_zeros((num_segments, *src.shape[1:])).scatter_add_(0, _per_row(index, src), src)


def segment_softmax(src: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Softmax of ``src`` (``[E, ...]``) over the rows that share an ``index``: each target node's
    incoming edges. The maximum is subtracted per segment for stability (no gradient through it)."""
    peak = src.new_zeros((num_segments, *src.shape[1:])).scatter_reduce_(
        0, _per_row(index, src), src.detach(), reduce="amax", include_self=False
    )
    out = (src - peak.index_select(0, index)).exp()
    return out / (segment_sum(out, index, num_segments) + 1e-16).index_select(0, index)


# -- the fused CPU path ---------------------------------------------------------------------------


class EdgeGroups(NamedTuple):
    """A propagation's edges grouped for the fused kernels (``group_edges``), shared by its layers."""

    ptr: np.ndarray  # [n + 1] offsets of each target's incoming edges in the grouped order
    src: np.ndarray  # [E] source of each grouped edge
    dst: np.ndarray  # [E] target of each grouped edge
    edge_type: np.ndarray  # [E] type of each grouped edge
    order: np.ndarray  # [E] original position of each grouped edge (to read the dropout mask)
    source_ptr: np.ndarray  # [n + 1] offsets of each source's outgoing edges in ``by_source``
    by_source: np.ndarray  # [E] grouped positions, ordered by source


def group_edges(src: torch.Tensor, dst: torch.Tensor, edge_type: torch.Tensor, num_nodes: int) -> EdgeGroups:
    """Group the edges by target, and the grouped edges by source (once per propagation)."""
    from seeder.policy.ops import kernels  # numba, loaded on the CPU path only

    arrays = (t.long().contiguous().numpy() for t in (src, dst, edge_type))
    return EdgeGroups(*kernels.group_edges(*arrays, num_nodes))


class _FusedEdgeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, edge_key, edge_value, keep, groups: EdgeGroups, threads: int):
        from seeder.policy.ops import kernels  # numba, loaded on the CPU path only

        n, _, heads, dh = qkv.shape
        keep_array = keep.numpy() if keep is not None else np.empty((0, heads), np.float32)
        arrays = [t.detach().contiguous().numpy() for t in (qkv, edge_key, edge_value)]
        out = np.empty((n, heads, dh), np.float32)  # each target's row is zeroed by its kernel
        alpha = np.empty((len(groups.order), heads), np.float32)
        scale = np.float32(1.0 / math.sqrt(dh))
        forward = kernels.attention_forward_parallel if threads > 1 else kernels.attention_forward_serial
        forward(*arrays, groups.ptr, groups.src, groups.edge_type, keep_array, groups.order, scale, out, alpha)
        ctx.saved = (arrays, keep_array, groups, scale, alpha, threads)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad):
        from seeder.policy.ops import kernels  # numba, loaded on the CPU path only

        (qkv, edge_key, edge_value), keep, groups, scale, alpha, threads = ctx.saved
        del ctx.saved
        d_qkv, d_logit = np.empty_like(qkv), np.empty_like(alpha)  # rows zeroed by the kernels' node passes
        # The edge tables' gradients: one copy per thread of the sources' pass, summed here.
        key_parts = np.zeros((threads, *edge_key.shape), np.float32)
        value_parts = np.zeros_like(key_parts)
        backward = kernels.attention_backward_parallel if threads > 1 else kernels.attention_backward_serial
        backward(
            qkv,
            edge_key,
            edge_value,
            groups.ptr,
            groups.src,
            groups.dst,
            groups.edge_type,
            keep,
            groups.order,
            scale,
            alpha,
            grad.contiguous().numpy(),
            groups.source_ptr,
            groups.by_source,
            d_qkv,
            d_logit,
            key_parts,
            value_parts,
        )
        return (
            torch.from_numpy(d_qkv),
            torch.from_numpy(key_parts.sum(0)),
            torch.from_numpy(value_parts.sum(0)),
            None,
            None,
            None,
        )


class EdgeIndex(NamedTuple):
    """A propagation's typed edges, and their grouping for the fused kernels where those run."""

    src: torch.Tensor
    dst: torch.Tensor
    edge_type: torch.Tensor
    groups: EdgeGroups | None


def edge_index_for(
    src: torch.Tensor, dst: torch.Tensor, edge_type: torch.Tensor, num_nodes: int, like: torch.Tensor
) -> EdgeIndex:
    """The edges of a graph of ``num_nodes`` nodes with features like ``like``, ready for every layer."""
    groups = group_edges(src, dst, edge_type, num_nodes) if uses_cpu_kernels(like) else None
    return EdgeIndex(src, dst, edge_type, groups)


def edge_attention(
    qkv: torch.Tensor, edge_key: torch.Tensor, edge_value: torch.Tensor, edges: EdgeIndex, keep: torch.Tensor | None
) -> torch.Tensor:
    """``edge_attention_torch``'s result, through the fused kernels where the edges were grouped for them."""
    if edges.groups is not None and uses_cpu_kernels(qkv):
        import numba  # numba, loaded on the CPU path only

        threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)  # torch's budget (one per Ray Train CPU)
        if threads > 1:
            numba.set_num_threads(threads)  # per calling thread
        return _FusedEdgeAttention.apply(qkv, edge_key, edge_value, keep, edges.groups, threads)
    return edge_attention_torch(qkv, edge_key, edge_value, edges.src, edges.dst, edges.edge_type, keep)
