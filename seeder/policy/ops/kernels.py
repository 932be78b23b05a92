"""Compiled CPU kernels of the policy network (numba): the fused edge attention of
``seeder.policy.ops.edge_attention`` and the dropout masks of ``seeder.policy.ops.dropout``.

They live apart from the modules that call them so that importing the model needs no numba: on a GPU,
and under torch.compile, those modules run torch ops and never load this one. Every kernel is cached on
disk after its first compilation (a few seconds, once per install).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

# -- edge attention (seeder.policy.ops.edge_attention) --------------------------------------------------------


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
def group_edges(src: np.ndarray, dst: np.ndarray, edge_type: np.ndarray, num_nodes: int):
    ptr, order = _counting_order(dst, num_nodes)
    grouped_src = src[order]
    source_ptr, by_source = _counting_order(grouped_src, num_nodes)
    return ptr, grouped_src, dst[order], edge_type[order], order, source_ptr, by_source


_MATH = {"reassoc", "contract"}
"""Sums over D in any order and fused multiply-adds, so the loops over D vectorise. The kernels that
inline the per-node helpers need the flags too: inlined code is compiled with the caller's (without
them a MetaQA propagation ran about 1.2 times slower).

A sum over D is kept out of a loop over D that also stores into an array. LLVM vectorises such a loop
behind a run-time test that the stored array does not overlap the ones read (numba cannot say they
never do), and where the addresses fail it (an array allocated just after another's row) runs the loop's
scalar copy, which adds in another order. The result then depended on where malloc had put the arrays:
the first training step of a process, a resumed run's, differed in its last bits from a run that went
on. A loop that only reads has no such test, so its order is fixed by D alone."""


@njit(cache=True, nogil=True, fastmath=_MATH, inline="always")
def _forward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha):
    """Target i's softmax over its incoming edges into alpha[p] (before dropout) and its messages'
    sum into out[i]. ``keep`` is the dropout mask in the original edge order ([0, H]: none)."""
    _, _, heads, dh = qkv.shape
    begin, end = ptr[i], ptr[i + 1]
    out[i] = np.float32(0.0)  # here, not by the caller: the row is about to be read anyway
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
def _backward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, alpha, grad, d_qkv, d_logit):
    """Target i's part of the backward: the softmax's backward into d_logit[p] (times 1/sqrt(D)) and
    the gradient of its query into d_qkv[i, 0]."""
    _, _, heads, dh = qkv.shape
    begin, end = ptr[i], ptr[i + 1]
    d_qkv[i, 0] = np.float32(0.0)
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
def _backward_source(
    j,
    part,
    qkv,
    edge_key,
    dst,
    edge_type,
    keep,
    order,
    alpha,
    grad,
    d_logit,
    source_ptr,
    by_source,
    d_qkv,
    key_parts,
    value_parts,
):
    """Source j's part: the gradients of its key and value into d_qkv[j, 1:], and its edges' share of
    the edge tables' gradients into key_parts[part], value_parts[part]."""
    _, _, heads, dh = qkv.shape
    d_qkv[j, 1:] = np.float32(0.0)
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
def attention_forward_parallel(qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha):
    for i in prange(qkv.shape[0]):
        _forward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha)


@njit(cache=True, nogil=True, fastmath=_MATH)
def attention_forward_serial(qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha):
    for i in range(qkv.shape[0]):
        _forward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, out, alpha)


@njit(cache=True, nogil=True, parallel=True, fastmath=_MATH)
def attention_backward_parallel(
    qkv,
    edge_key,
    edge_value,
    ptr,
    src,
    dst,
    edge_type,
    keep,
    order,
    scale,
    alpha,
    grad,
    source_ptr,
    by_source,
    d_qkv,
    d_logit,
    key_parts,
    value_parts,
):
    for i in prange(qkv.shape[0]):
        _backward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, alpha, grad, d_qkv, d_logit)
    # The sources' pass writes each source's rows from one part, and the edge tables into the part's own
    # copy, which the caller sums.
    parts = key_parts.shape[0]
    bounds = _source_bounds(source_ptr, parts)
    for c in prange(parts):
        for j in range(bounds[c], bounds[c + 1]):
            _backward_source(
                j,
                c,
                qkv,
                edge_key,
                dst,
                edge_type,
                keep,
                order,
                alpha,
                grad,
                d_logit,
                source_ptr,
                by_source,
                d_qkv,
                key_parts,
                value_parts,
            )


@njit(cache=True, nogil=True, fastmath=_MATH)
def attention_backward_serial(
    qkv,
    edge_key,
    edge_value,
    ptr,
    src,
    dst,
    edge_type,
    keep,
    order,
    scale,
    alpha,
    grad,
    source_ptr,
    by_source,
    d_qkv,
    d_logit,
    key_parts,
    value_parts,
):
    for i in range(qkv.shape[0]):
        _backward_target(i, qkv, edge_key, edge_value, ptr, src, edge_type, keep, order, scale, alpha, grad, d_qkv, d_logit)
    for j in range(qkv.shape[0]):
        _backward_source(
            j,
            0,
            qkv,
            edge_key,
            dst,
            edge_type,
            keep,
            order,
            alpha,
            grad,
            d_logit,
            source_ptr,
            by_source,
            d_qkv,
            key_parts,
            value_parts,
        )


# -- dropout (seeder.policy.ops.dropout) -----------------------------------------------------------------------

_GOLDEN = uint64(0x9E3779B97F4A7C15)
_MIX_1 = uint64(0xBF58476D1CE4E5B9)
_MIX_2 = uint64(0x94D049BB133111EB)


@njit(cache=True, nogil=True, inline="always")
def _word(seed, index):
    """SplitMix64's output for counter ``seed + index``: eight random bytes."""
    z = seed + uint64(index) * _GOLDEN
    z = (z ^ (z >> uint64(30))) * _MIX_1
    z = (z ^ (z >> uint64(27))) * _MIX_2
    return z ^ (z >> uint64(31))


@njit(cache=True, nogil=True)
def apply_dropout_mask(x, seed, threshold, scale, out):
    """out = x * scale where the element's byte is >= threshold, else 0 (x, out flat, float32).
    Serial: one pass runs at about 0.3 ns an element, less than a parallel region's start-up costs on
    the tensors of a training step (137 against 226 us for 473K values on two threads)."""
    n, full = len(x), len(x) // 8
    cut = uint64(threshold)
    for w in range(full):  # whole words, without a bounds test per byte, so that LLVM vectorises
        bits = _word(seed, w)
        for b in range(8):
            keep = ((bits >> uint64(8 * b)) & uint64(255)) >= cut
            out[w * 8 + b] = x[w * 8 + b] * (scale if keep else np.float32(0.0))
    if full * 8 < n:
        bits = _word(seed, full)
        for i in range(full * 8, n):
            keep = ((bits >> uint64(8 * (i - full * 8))) & uint64(255)) >= cut
            out[i] = x[i] * (scale if keep else np.float32(0.0))


@njit(cache=True, nogil=True)
def random_bytes(seed, n):
    """``n`` dropout bytes: the bytes of the words ``_word(seed, w)``, in order (the stream
    ``apply_dropout_mask`` reads)."""
    words = np.empty((n + 7) // 8, np.uint64)
    for w in range(len(words)):
        words[w] = _word(seed, w)
    return words.view(np.uint8)[:n]


# -- the node update of a layer (seeder.policy.ops.node_update) ------------------------------------------------


@njit(cache=True, nogil=True, fastmath=_MATH)
def add_dropout_layer_norm(x, u, bias, mask, cut, scale, gamma, beta, eps, y, xhat, rstd):
    """y = LayerNorm(x + dropout(u + bias)) per row, keeping the normalised rows and 1/std for the
    backward. ``u`` is a product without its bias: added here, it costs no pass of its own (an addmm
    first copies the bias into its whole output). ``mask`` holds a byte per element of ``u`` (empty:
    no dropout); kept where the byte >= ``cut``."""
    n, dim = x.shape
    inv_dim = np.float32(1.0) / np.float32(dim)  # float32 throughout: an int divisor promotes to float64
    masked = len(mask) > 0
    row, keep = np.empty(dim, np.float32), np.empty(dim, np.float32)
    keep[:] = np.float32(1.0)
    for i in range(n):
        # The row's dropout factors into a buffer first: a select inside the loops below kept them from
        # vectorising (2.2 times slower; so was this loop as an inlined helper).
        for d in range(dim * masked):
            keep[d] = scale if mask[i * dim + d] >= cut else np.float32(0.0)
        for d in range(dim):
            row[d] = x[i, d] + (u[i, d] + bias[d]) * keep[d]
        mean = np.float32(0.0)
        for d in range(dim):  # a loop that only reads (see _MATH)
            mean += row[d]
        mean *= inv_dim
        var = np.float32(0.0)
        for d in range(dim):
            c = row[d] - mean
            var += c * c
        r = np.float32(1.0) / np.sqrt(var * inv_dim + eps)
        rstd[i] = r
        for d in range(dim):
            h = (row[d] - mean) * r
            xhat[i, d] = h
            y[i, d] = h * gamma[d] + beta[d]


@njit(cache=True, nogil=True, fastmath=_MATH)
def add_dropout_layer_norm_backward(grad, xhat, rstd, gamma, mask, cut, scale, d_x, d_u, d_gamma, d_beta, d_bias):
    """The backward of ``add_dropout_layer_norm``: d_x (the residual's gradient), d_u (through the
    dropout), and the column sums d_gamma, d_beta and d_bias (= d_u summed: the gradient of the bias of
    the product that made ``u``)."""
    n, dim = grad.shape
    inv_dim = np.float32(1.0) / np.float32(dim)
    masked = len(mask) > 0
    keep = np.ones(dim, np.float32)
    for i in range(n):
        for d in range(dim * masked):
            keep[d] = scale if mask[i * dim + d] >= cut else np.float32(0.0)
        dot_h = np.float32(0.0)
        dot_1 = np.float32(0.0)
        for d in range(dim):  # sums in a loop that only reads (see _MATH)
            g = grad[i, d] * gamma[d]
            dot_1 += g
            dot_h += g * xhat[i, d]
        for d in range(dim):
            d_gamma[d] += grad[i, d] * xhat[i, d]
            d_beta[d] += grad[i, d]
        dot_1 *= inv_dim
        dot_h *= inv_dim
        r = rstd[i]
        for d in range(dim):
            g = r * (grad[i, d] * gamma[d] - dot_1 - xhat[i, d] * dot_h)
            d_x[i, d] = g
            g *= keep[d]
            d_u[i, d] = g
            d_bias[d] += g


@njit(cache=True, nogil=True, fastmath=_MATH)
def apply_byte_mask(x, mask, cut, scale):
    """x *= scale where the element's byte >= ``cut``, else 0, in place (x 2-D, one byte per element)."""
    n, dim = x.shape
    keep = np.empty(dim, np.float32)
    for i in range(n):
        for d in range(dim):
            keep[d] = scale if mask[i * dim + d] >= cut else np.float32(0.0)
        for d in range(dim):
            x[i, d] *= keep[d]
