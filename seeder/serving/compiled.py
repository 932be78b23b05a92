"""A retriever's networks through ``torch.compile``, for serving (opt-in: ``Retriever.load(compiled=True)``,
``--compile``).

Answering one question is about 600 small torch ops in the policy and 100 in the question encoder, and
each op pays its dispatch: the policy runs three expansion steps and a final scoring pass, each through
three attention layers over a subgraph of ~120 nodes; int8 MiniLM quantizes every activation before
its products. Inductor fuses each piece (``POLICY_METHODS``, the encoder's forward pass) into a few
generated C++ loops. On MetaQA a question ranks in about three quarters of the eager time (2-core CPU,
one thread), and int8 MiniLM encodes faster at the same distance to float32; float32 MiniLM gains nothing
(benchmarks/RESULTS.md, "Smaller decisions").

What it costs: a C++ compiler at run time, and 20-40 s of compiling. Graphs are compiled per shape
family and per torch thread count, so ``Retriever.warm_up`` asks a question alone, two together and a
batch, which compiles them all before the first real question (inductor caches its kernels on disk,
so later processes compile faster). Fused kernels add floats in another order, so a near-tie can rank
the other way round: the default, eager path is the one whose rankings equal ``seeder evaluate``'s.
Where compiling fails (no compiler, an unsupported platform), the piece warns once and runs eagerly
from then on. Training gains nothing from it here: compiling ``propagate`` for the training step,
backward included, was slower than eager.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from seeder.features.bert import BertSentenceEncoder

POLICY_METHODS = ("propagate", "encode_nodes", "expansion_logits", "scores")
"""The ``SeedERPolicy`` methods that run compiled: the rollout's pure tensor functions (the rollout's
own steps select with data-dependent shapes, which would split any graph)."""


def _few_rows(args: tuple) -> bool:
    return any(isinstance(a, torch.Tensor) and a.dim() and a.shape[0] < 2 for a in args)


class CompiledOrEager:
    """``compiled(*args)``; ``eager(*args)`` where ``eager_for(args)`` says so, and for good once
    compiling has failed. ``prepare(args)``, when given, rewrites the arguments first, outside the
    compiled graph (where a Python value it looks at would become a guard, and each value a graph)."""

    def __init__(
        self,
        name: str,
        eager: Callable[..., Any],
        eager_for: Callable[[tuple], bool] | None = None,
        prepare: Callable[[tuple], tuple] | None = None,
        release_gil: bool = False,
    ):
        self.name, self.eager, self.eager_for, self.prepare = name, eager, eager_for, prepare
        options = {"cpp_wrapper": True} if release_gil else None
        self.compiled: Callable[..., Any] | None = torch.compile(eager, dynamic=True, options=options)

    def __call__(self, *args: Any) -> Any:
        if self.prepare is not None:
            args = self.prepare(args)
        if self.compiled is None or (self.eager_for is not None and self.eager_for(args)):
            return self.eager(*args)
        try:
            return self.compiled(*args)
        except Exception as exc:  # noqa: BLE001 - any backend failure: the eager path is always there
            self.compiled = None
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            warnings.warn(
                f"torch.compile of {self.name} failed ({type(exc).__name__}: {first_line}); running it eagerly", stacklevel=2
            )
            return self.eager(*args)


def compile_policy(model, release_gil: bool = False):
    """``model`` (a ``SeedERPolicy``) with ``POLICY_METHODS`` compiled, in place. Calls with a tensor
    of fewer than two rows (a lone node or edge, one question's query rows) run eagerly: a graph
    compiled for them would be specialised to them, one more compile in the middle of serving.

    ``release_gil``: run each graph through inductor's C++ wrapper, which releases the GIL for the
    whole graph. Its default Python wrapper holds the GIL while each generated kernel runs, so two
    threads answering the parts of one call took turns; with the C++ wrapper two parts ran 1.1x the
    questions/s, at a slightly longer compile (benchmarks/RESULTS.md)."""
    for name in POLICY_METHODS:
        setattr(model, name, CompiledOrEager(f"SeedERPolicy.{name}", getattr(model, name), _few_rows, release_gil=release_gil))
    return model


def compile_encoder(encoder, release_gil: bool = False):
    """``encoder`` with its forward pass compiled, in place, where it is the plain-torch MiniLM
    (``seeder.features.bert.BertSentenceEncoder``); other backends are returned as they are. ``release_gil`` as
    in ``compile_policy``."""
    if isinstance(encoder, BertSentenceEncoder):
        encoder._forward = CompiledOrEager(
            "the question encoder", encoder._forward, prepare=masked_batches, release_gil=release_gil
        )
    return encoder


def masked_batches(args: tuple[torch.Tensor, torch.Tensor, bool]) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Every batch of two or more questions takes the masked graph: an all-ones mask changes nothing
    but rounding, and a batch of equal lengths would otherwise need a graph of its own. Decided before
    the compiled call: inside it, ``padded`` was a guard, and the first batch of equal lengths compiled
    that graph in the middle of serving (a 4 s stall of every request behind it, under 50 clients)."""
    ids, mask, padded = args
    return ids, mask, padded or ids.shape[0] > 1
