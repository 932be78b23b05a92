"""Dropout whose mask comes from random bytes: eight per 64-bit random word.

nn.Dropout draws one random number per element (``bernoulli_``), which was 28% of a MetaQA training
step on CPU. Drawing 64-bit words with torch (``randint``) and reading them as bytes is cheaper, but a
dropout still made five passes over memory (draw, compare, cast, scale, multiply) and its backward a
sixth (benchmarks/RESULTS.md). On the CPU the bytes now come
from a counter-based hash (SplitMix64 of a seed drawn from torch's generator plus the word's index),
computed where the value is read: forward and backward are one pass each, and nothing of the mask is
stored, since the backward recomputes it from the seed. On other devices, and under torch.compile,
the bytes are torch's ``randint`` words. Both keep each value with probability
``(256 - threshold) / 256``; their random streams differ, so a CPU and a GPU run of one seed drop
different values.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from seeder.config import ConfigError


class _CpuByteDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seed, threshold, scale):
        from seeder.policy.ops.kernels import apply_dropout_mask  # numba, loaded on the CPU path only

        flat = x.detach().contiguous().view(-1).numpy()
        out = np.empty_like(flat)
        apply_dropout_mask(flat, seed, threshold, scale, out)
        ctx.mask = (seed, threshold, scale)
        return torch.from_numpy(out).view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        from seeder.policy.ops.kernels import apply_dropout_mask  # numba, loaded on the CPU path only

        flat = grad.contiguous().view(-1).numpy()
        out = np.empty_like(flat)
        apply_dropout_mask(flat, *ctx.mask, out)
        return torch.from_numpy(out).view(grad.shape), None, None, None


def draw_seed() -> np.uint64:
    """A seed for the counter-based hash, drawn from torch's generator, so that ``torch.manual_seed``
    reproduces every mask made from it (this dropout's and the fused node update's)."""
    return np.uint64(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64).item() & (2**64 - 1))


def uses_cpu_kernels(x: torch.Tensor) -> bool:
    """Whether the policy's compiled CPU kernels (``seeder.policy.ops.kernels``: this dropout and the fused
    edge attention) serve tensors like ``x``: float32 on the CPU, outside torch.compile (a compiled
    graph traces the torch ops instead)."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and not torch.compiler.is_compiling()


class ByteDropout(nn.Module):
    """Dropout of probability ``p`` rounded to a multiple of 1/256 (0.1 -> 26/256); kept values are
    scaled by 256 / (256 - 26), so the expectation is kept exactly as with nn.Dropout. The identity in
    eval mode or with p = 0."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {p}")
        self.p = p
        self.threshold = round(p * 256)
        self.scale = 256 / (256 - self.threshold)

    def active(self, numel: int) -> bool:
        return self.training and self.threshold > 0 and numel > 0

    def mask(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor | None:
        """The scaled keep mask (0 or ``scale``) of ``shape``, in ``like``'s dtype and on its device;
        None where dropout is the identity."""
        if not self.active(math.prod(shape)):
            return None
        return self(torch.ones(shape, dtype=like.dtype, device=like.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active(x.numel()):
            return x
        if uses_cpu_kernels(x):
            return _CpuByteDropout.apply(x, draw_seed(), self.threshold, np.float32(self.scale))
        words = torch.randint(-(2**63), 2**63 - 1, ((x.numel() + 7) // 8,), dtype=torch.int64, device=x.device)
        keep = words.view(torch.uint8)[: x.numel()].view(x.shape) >= self.threshold
        return x * (keep.to(x.dtype) * self.scale)

    def extra_repr(self) -> str:
        return f"p={self.threshold}/256"
