"""A layer's update of every node after its attention, as one autograd step on the CPU (paper, Section 4.1).

The post-norm transformer block around the aggregated messages ``a``:

    x1 = LayerNorm(x + dropout(W_o a + b_o))
    y  = LayerNorm(x1 + dropout(W_2 dropout(GELU(W_1 x1 + b_1)) + b_2))

Run as modules, this is some fifteen torch calls forward and as many autograd nodes backward per layer
and propagation; at hidden size 32 each moves little data, so dispatch and autograd bookkeeping weigh
as much as the arithmetic (a MetaQA training step runs 12 layers; about 35 ms of a step does not grow
with the batch). Here it is one autograd function: the three products stay torch matrix products,
and each ``x + dropout(u + b)`` with its LayerNorm is one compiled pass forward and one backward
(``seeder.policy.ops.kernels``), which also sums the columns of the gradients for the biases and the
norms' parameters. A MetaQA training step runs about 1.1 times faster than with the modules
(benchmarks/RESULTS.md, "Smaller decisions"). The dropout
bytes come from the same counter-based hash as ``seeder.policy.ops.dropout``, drawn once per call and kept for
the backward (one byte per value).

``node_update`` runs the modules instead on a GPU, under torch.compile, and for other dtypes; the
modules are the tests' reference.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from seeder.policy.ops.dropout import ByteDropout, draw_seed, uses_cpu_kernels


class _FusedNodeUpdate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, aggregated, w_out, b_out, g1, beta1, w1, b1, w2, b2, g2, beta2, masks, dropout, eps):
        from seeder.policy.ops import kernels  # numba, loaded on the CPU path only

        n, dim = x.shape
        mask_out, mask_hidden, mask_ffn = masks
        cut, scale = dropout
        x1, xhat1, rstd1 = np.empty((n, dim), np.float32), np.empty((n, dim), np.float32), np.empty(n, np.float32)
        kernels.add_dropout_layer_norm(
            x.detach().numpy(),
            aggregated.mm(w_out.t()).numpy(),
            b_out.detach().numpy(),
            mask_out,
            cut,
            scale,
            g1.detach().numpy(),
            beta1.detach().numpy(),
            eps,
            x1,
            xhat1,
            rstd1,
        )
        x1_t = torch.from_numpy(x1)
        pre_gelu = torch.addmm(b1, x1_t, w1.t())
        hidden = nn.functional.gelu(pre_gelu)
        if len(mask_hidden):
            kernels.apply_byte_mask(hidden.numpy(), mask_hidden, cut, scale)
        y, xhat2, rstd2 = np.empty((n, dim), np.float32), np.empty((n, dim), np.float32), np.empty(n, np.float32)
        kernels.add_dropout_layer_norm(
            x1,
            hidden.mm(w2.t()).numpy(),
            b2.detach().numpy(),
            mask_ffn,
            cut,
            scale,
            g2.detach().numpy(),
            beta2.detach().numpy(),
            eps,
            y,
            xhat2,
            rstd2,
        )
        ctx.save_for_backward(aggregated, w_out, g1, w1, w2, g2, x1_t, pre_gelu, hidden)
        ctx.arrays = (xhat1, rstd1, xhat2, rstd2, masks, dropout)
        return torch.from_numpy(y)

    @staticmethod
    def backward(ctx, grad):
        from seeder.policy.ops import kernels  # numba, loaded on the CPU path only

        aggregated, w_out, g1, w1, w2, g2, x1, pre_gelu, hidden = ctx.saved_tensors
        xhat1, rstd1, xhat2, rstd2, (mask_out, mask_hidden, mask_ffn), (cut, scale) = ctx.arrays
        del ctx.arrays
        dim = grad.shape[1]

        def norm_backward(grad, xhat, rstd, gamma, mask):
            d_x, d_u = np.empty_like(xhat), np.empty_like(xhat)
            d_gamma, d_beta, d_bias = (np.zeros(dim, np.float32) for _ in range(3))
            kernels.add_dropout_layer_norm_backward(
                grad.contiguous().numpy(), xhat, rstd, gamma.detach().numpy(), mask, cut, scale, d_x, d_u, d_gamma, d_beta, d_bias
            )
            return (torch.from_numpy(a) for a in (d_x, d_u, d_gamma, d_beta, d_bias))

        d_x1, d_ffn, d_g2, d_beta2, d_b2 = norm_backward(grad, xhat2, rstd2, g2, mask_ffn)
        d_w2 = d_ffn.t().mm(hidden)
        d_hidden = d_ffn.mm(w2)
        if len(mask_hidden):
            kernels.apply_byte_mask(d_hidden.numpy(), mask_hidden, cut, scale)
        d_pre = torch.ops.aten.gelu_backward(d_hidden, pre_gelu)
        d_w1, d_b1 = d_pre.t().mm(x1), d_pre.sum(0)
        d_x1 = d_x1.addmm_(d_pre, w1)
        d_x, d_out, d_g1, d_beta1, d_b_out = norm_backward(d_x1, xhat1, rstd1, g1, mask_out)
        return (
            d_x,
            d_out.mm(w_out),
            d_out.t().mm(aggregated),
            d_b_out,
            d_g1,
            d_beta1,
            d_w1,
            d_b1,
            d_w2,
            d_b2,
            d_g2,
            d_beta2,
            None,
            None,
            None,
        )


def fused_supported(layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``layer``'s node update runs fused for ``x``: the compiled kernels serve it, and the
    block has the standard layout (exact GELU, LayerNorms with an affine map and one epsilon, one dropout
    rate)."""
    ffn = layer.ffn
    return (
        uses_cpu_kernels(x)
        and isinstance(ffn[1], nn.GELU)
        and ffn[1].approximate == "none"
        and layer.norm_attention.elementwise_affine
        and layer.norm_ffn.elementwise_affine
        and layer.norm_attention.eps == layer.norm_ffn.eps
        and ffn[2].threshold == layer.dropout.threshold
    )


def node_update(layer: nn.Module, x: torch.Tensor, aggregated: torch.Tensor) -> torch.Tensor:
    """``layer``'s update of node states x [n, hidden] from the aggregated messages [n, hidden], with
    its modules ``out``, ``norm_attention``, ``ffn`` (Linear, GELU, ByteDropout, Linear), ``dropout``
    and ``norm_ffn``."""
    ffn, dropout = layer.ffn, layer.dropout
    if not fused_supported(layer, x):
        x = layer.norm_attention(x + dropout(layer.out(aggregated)))
        return layer.norm_ffn(x + dropout(ffn(x)))
    n, dim = x.shape
    masks = draw_masks(dropout, n, dim, ffn[0].out_features)
    norm1, norm2 = layer.norm_attention, layer.norm_ffn
    return _FusedNodeUpdate.apply(
        x.contiguous(),
        aggregated.contiguous(),
        layer.out.weight,
        layer.out.bias,
        norm1.weight,
        norm1.bias,
        ffn[0].weight,
        ffn[0].bias,
        ffn[3].weight,
        ffn[3].bias,
        norm2.weight,
        norm2.bias,
        masks,
        (np.uint8(dropout.threshold), np.float32(dropout.scale)),
        np.float32(norm1.eps),
    )


def draw_masks(dropout: ByteDropout, n: int, dim: int, hidden: int):
    """The dropout bytes of one node update: after the output product ([n, dim]), inside the
    feed-forward network ([n, hidden]) and after it ([n, dim]), at ``dropout``'s rate (``fused_supported``
    checks that the block has one); empty arrays where dropout is off."""
    from seeder.policy.ops import kernels  # numba, loaded on the CPU path only

    if not dropout.active(n * dim):
        empty = np.empty(0, np.uint8)
        return empty, empty, empty
    data = kernels.random_bytes(draw_seed(), n * (2 * dim + hidden))
    return data[: n * dim], data[n * dim : n * (dim + hidden)], data[n * (dim + hidden) :]
