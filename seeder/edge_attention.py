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
cache, and the backward is one more such pass: only [E, H] logits and probabilities are kept in
between, and nothing of size [E, H, D] is ever written.

The softmax is the same as the torch path's: the maximum is subtracted per target (no gradient
through it) and the normaliser is the sum plus 1e-16; dropout multiplies the probabilities by a mask
drawn for [E, H] (``ByteDropout.mask``). Sums run in float32 in another order than torch's, so the
two paths agree to rounding, not bit for bit.
"""

from __future__ import annotations

import math

from typing import NamedTuple

import numba
import numpy as np
import torch
from numba import njit, prange


def edge_attention_torch(qkv: torch.Tensor, edge_key: torch.Tensor, edge_value: torch.Tensor, src: torch.Tensor,
                         dst: torch.Tensor, edge_type: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
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
        0, _per_row(index, src), src.detach(), reduce="amax", include_self=False)
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


@njit(cache=True, nogil=True)
def _counting_order(keys: np.ndarray, num_keys: int):
    """Offsets [num_keys + 1] and the stable order of ``keys`` sorted (a counting sort)."""
    ptr = np.zeros(num_keys + 1, np.int64)
    for e in range(len(keys)):
        ptr[keys[e] + 1] += 1
    for i in range(num_keys):
        ptr[i + 1] += ptr[i]
    fill = ptr[:-1].copy()
    order = np.empty(len(keys), np.int64)
    for e in range(len(keys)):
        slot = fill[keys[e]]
        order[slot] = e
        fill[keys[e]] = slot + 1
    return ptr, order


@njit(cache=True, nogil=True)
def _group(src: np.ndarray, dst: np.ndarray, edge_type: np.ndarray, num_nodes: int):
    ptr, order = _counting_order(dst, num_nodes)
    grouped_src = src[order]
    source_ptr, by_source = _counting_order(grouped_src, num_nodes)
    return ptr, grouped_src, dst[order], edge_type[order], order, source_ptr, by_source


def group_edges(src: torch.Tensor, dst: torch.Tensor, edge_type: torch.Tensor, num_nodes: int) -> EdgeGroups:
    """Group the edges by target, and the grouped edges by source (once per propagation)."""
    arrays = (t.long().contiguous().numpy() for t in (src, dst, edge_type))
    return EdgeGroups(*_group(*arrays, num_nodes))


_MATH = {"reassoc", "contract"}
"""Sums over D in any order and fused multiply-adds, so the loops over D vectorise. The kernels that
inline the per-node helpers need the flags too: inlined code is compiled with the caller's (without
them, 2.3-2.6 ms forward and 3.6 ms backward on a 23K-edge MetaQA propagation, 2.0 and 2.9-3.0 with)."""


@njit(cache=True, nogil=True, fastmath=_MATH, inline="always")
def _forward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha):
    """Target i's softmax over its incoming edges into alpha[p] (before dropout) and its messages'
    sum into out[i]. ``keep`` is the dropout mask in the original edge order ([0, H]: none)."""
    _, _, heads, dh = qkv.shape
    begin, end = ptr[i], ptr[i + 1]
    for h in range(heads):
        peak = np.float32(-np.inf)
        for p in range(begin, end):
            j, t = src[p], edge_type[p]
            s = np.float32(0.0)
            for d in range(dh):
                s += qkv[i, 0, h, d] * qkv[j, 1, h, d] * edge_key[t, h, d]
            s *= scale
            alpha[p, h] = s
            peak = max(peak, s)
        total = np.float32(0.0)
        for p in range(begin, end):
            e = np.exp(alpha[p, h] - peak)
            alpha[p, h] = e
            total += e
        total += np.float32(1e-16)
        for p in range(begin, end):
            a = alpha[p, h] / total
            alpha[p, h] = a
            if keep.shape[0] > 0:
                a *= keep[order[p], h]
            j, t = src[p], edge_type[p]
            for d in range(dh):
                out[i, h, d] += a * (qkv[j, 2, h, d] + edge_value[t, h, d])


@njit(cache=True, nogil=True, fastmath=_MATH, inline="always")
def _backward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, alpha, grad, d_qkv,
                     d_logit):
    """Target i's part of the backward: the softmax's backward into d_logit[p] (times 1/sqrt(D)) and
    the gradient of its query into d_qkv[i, 0]."""
    _, _, heads, dh = qkv.shape
    begin, end = ptr[i], ptr[i + 1]
    for h in range(heads):
        # d out / d alpha through dropout (kept in d_logit for now), then sum(alpha * d_alpha).
        weighted = np.float32(0.0)
        for p in range(begin, end):
            j, t = src[p], edge_type[p]
            s = np.float32(0.0)
            for d in range(dh):
                s += grad[i, h, d] * (qkv[j, 2, h, d] + edge_value[t, h, d])
            if keep.shape[0] > 0:
                s *= keep[order[p], h]
            d_logit[p, h] = s
            weighted += alpha[p, h] * s
        for p in range(begin, end):
            j, t = src[p], edge_type[p]
            dl = alpha[p, h] * (d_logit[p, h] - weighted) * scale
            d_logit[p, h] = dl
            for d in range(dh):
                d_qkv[i, 0, h, d] += dl * qkv[j, 1, h, d] * edge_key[t, h, d]


@njit(cache=True, nogil=True, fastmath=_MATH, inline="always")
def _backward_source(j, part, qkv, edge_key, dst, edge_type, keep, order, alpha, grad, d_logit, source_ptr,
                     by_source, d_qkv, key_parts, value_parts):
    """Source j's part: the gradients of its key and value into d_qkv[j, 1:], and its edges' share of
    the edge tables' gradients into key_parts[part], value_parts[part]."""
    _, _, heads, dh = qkv.shape
    for r in range(source_ptr[j], source_ptr[j + 1]):
        p = by_source[r]
        i, t = dst[p], edge_type[p]
        for h in range(heads):
            dl = d_logit[p, h]
            a = alpha[p, h] * keep[order[p], h] if keep.shape[0] > 0 else alpha[p, h]
            for d in range(dh):
                q, g = qkv[i, 0, h, d], grad[i, h, d]
                d_qkv[j, 1, h, d] += dl * q * edge_key[t, h, d]
                d_qkv[j, 2, h, d] += a * g
                key_parts[part, t, h, d] += dl * q * qkv[j, 1, h, d]
                value_parts[part, t, h, d] += a * g


@njit(cache=True, nogil=True)
def _source_bounds(source_ptr, parts):
    """Sources of each part: equal shares of the edges, by the sources' offsets -> [parts + 1]."""
    num_nodes = len(source_ptr) - 1
    bounds = np.searchsorted(source_ptr, (np.arange(parts + 1) * source_ptr[num_nodes]) // parts)
    bounds[0], bounds[parts] = 0, num_nodes
    return bounds


# Each pass twice: over targets (sources) in parallel, and serially for a caller on one thread (a Ray
# Train worker of one CPU, a retriever's part), which skips the parallel region's start-up and never
# launches one from two threads at once (numba's fallback threading layer, workqueue, cannot).


@njit(cache=True, nogil=True, parallel=True, fastmath=_MATH)
def _forward_parallel(qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha):
    for i in prange(qkv.shape[0]):
        _forward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha)


@njit(cache=True, nogil=True, fastmath=_MATH)
def _forward_serial(qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha):
    for i in range(qkv.shape[0]):
        _forward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha)


@njit(cache=True, nogil=True, parallel=True, fastmath=_MATH)
def _backward_parallel(qkv, edge_key, edge_value, ptr, src, dst, edge_type, keep, order, scale, alpha, grad,
                       source_ptr, by_source, d_qkv, d_logit, key_parts, value_parts):
    for i in prange(qkv.shape[0]):
        _backward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, alpha, grad, d_qkv,
                         d_logit)
    # The sources' pass writes each source's rows from one part, and the edge tables into the part's own
    # copy, which the caller sums.
    parts = key_parts.shape[0]
    bounds = _source_bounds(source_ptr, parts)
    for c in prange(parts):
        for j in range(bounds[c], bounds[c + 1]):
            _backward_source(j, c, qkv, edge_key, dst, edge_type, keep, order, alpha, grad, d_logit, source_ptr,
                             by_source, d_qkv, key_parts, value_parts)


@njit(cache=True, nogil=True, fastmath=_MATH)
def _backward_serial(qkv, edge_key, edge_value, ptr, src, dst, edge_type, keep, order, scale, alpha, grad,
                     source_ptr, by_source, d_qkv, d_logit, key_parts, value_parts):
    for i in range(qkv.shape[0]):
        _backward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, alpha, grad, d_qkv,
                         d_logit)
    for j in range(qkv.shape[0]):
        _backward_source(j, 0, qkv, edge_key, dst, edge_type, keep, order, alpha, grad, d_logit, source_ptr,
                         by_source, d_qkv, key_parts, value_parts)


class _FusedEdgeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, edge_key, edge_value, keep, groups: EdgeGroups, threads: int):
        n, _, heads, dh = qkv.shape
        keep_array = keep.numpy() if keep is not None else np.empty((0, heads), np.float32)
        arrays = [t.detach().contiguous().numpy() for t in (qkv, edge_key, edge_value)]
        out = np.zeros((n, heads, dh), np.float32)
        alpha = np.empty((len(groups.order), heads), np.float32)
        scale = np.float32(1.0 / math.sqrt(dh))
        forward = _forward_parallel if threads > 1 else _forward_serial
        forward(*arrays, groups.ptr, groups.src, groups.edge_type, keep_array, groups.order, scale, out, alpha)
        ctx.saved = (arrays, keep_array, groups, scale, alpha, threads)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad):
        (qkv, edge_key, edge_value), keep, groups, scale, alpha, threads = ctx.saved
        del ctx.saved
        d_qkv, d_logit = np.zeros_like(qkv), np.empty_like(alpha)
        key_parts = np.zeros((threads, *edge_key.shape), np.float32)
        value_parts = np.zeros_like(key_parts)
        backward = _backward_parallel if threads > 1 else _backward_serial
        backward(qkv, edge_key, edge_value, groups.ptr, groups.src, groups.dst, groups.edge_type, keep, groups.order,
                 scale, alpha, grad.contiguous().numpy(), groups.source_ptr, groups.by_source, d_qkv, d_logit,
                 key_parts, value_parts)
        return (torch.from_numpy(d_qkv), torch.from_numpy(key_parts.sum(0)), torch.from_numpy(value_parts.sum(0)),
                None, None, None)


def fused_supported(x: torch.Tensor) -> bool:
    """Whether ``edge_attention`` runs the fused kernels for features ``x``: float32 on the CPU, outside
    torch.compile (a compiled graph traces the torch ops instead)."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and not torch.compiler.is_compiling()


class EdgeIndex(NamedTuple):
    """A propagation's typed edges, and their grouping for the fused kernels where those run."""

    src: torch.Tensor
    dst: torch.Tensor
    edge_type: torch.Tensor
    groups: EdgeGroups | None


def edge_index_for(src: torch.Tensor, dst: torch.Tensor, edge_type: torch.Tensor, num_nodes: int,
                   like: torch.Tensor) -> EdgeIndex:
    """The edges of a graph of ``num_nodes`` nodes with features like ``like``, ready for every layer."""
    groups = group_edges(src, dst, edge_type, num_nodes) if fused_supported(like) else None
    return EdgeIndex(src, dst, edge_type, groups)


def edge_attention(qkv: torch.Tensor, edge_key: torch.Tensor, edge_value: torch.Tensor, edges: EdgeIndex,
                   keep: torch.Tensor | None) -> torch.Tensor:
    """``edge_attention_torch``'s result, through the fused kernels where the edges were grouped for them."""
    if edges.groups is not None and fused_supported(qkv):
        threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)  # torch's budget (one per Ray Train CPU)
        if threads > 1:
            numba.set_num_threads(threads)  # per calling thread
        return _FusedEdgeAttention.apply(qkv, edge_key, edge_value, keep, edges.groups, threads)
    return edge_attention_torch(qkv, edge_key, edge_value, edges.src, edges.dst, edges.edge_type, keep)
