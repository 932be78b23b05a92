"""Retrieval methods by name, for ``seeder evaluate --method NAME``.

A method is a builder ``builder(artifacts, config, model=None) -> retriever``; the retriever has
``retrieve(subgraphs, query_features) -> RetrievalResult``, where ``query_features`` are the rows of
``subgraphs.query_ids`` (same order). A module registers its methods at import time::

    from seeder.retrieve.registry import register

    @register("ppr")
    def build_ppr(artifacts, config, model=None): ...

and is listed once in ``METHOD_MODULES``. Modules are imported lazily, on the first lookup.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol

import numpy as np

from seeder.config import ConfigError, SeederConfig
from seeder.data.subgraphs import SubgraphSet
from seeder.retrieve.base import RetrievalResult

METHOD_MODULES = [
    "seeder.retrieve.dense",  # dense
    "seeder.retrieve.khop",  # khop, prior
    "seeder.evaluation.learned",  # seeder (the trained policy; needs --model)
    "seeder.retrieve.baselines.registration",  # the paper's baselines (G-Retriever, PPR, BM25, ...)
]


class Retriever(Protocol):
    def retrieve(self, subgraphs: SubgraphSet, query_features: np.ndarray) -> RetrievalResult: ...


Builder = Callable[..., Retriever]
_BUILDERS: dict[str, Builder] = {}
_loaded = False


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator: make ``builder(artifacts, config, model=None)`` available as method ``name``."""

    def wrap(builder: Builder) -> Builder:
        if name in _BUILDERS and _BUILDERS[name] is not builder:
            raise ValueError(f"retrieval method {name!r} is registered twice")
        _BUILDERS[name] = builder
        return builder

    return wrap


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for module in METHOD_MODULES:
        importlib.import_module(module)
    _loaded = True


def available() -> list[str]:
    _load_all()
    return sorted(_BUILDERS)


def build(name: str, artifacts: Any, config: SeederConfig, model: str | None = None) -> Retriever:
    """The retriever for method ``name``; an unknown name is a ConfigError listing the known ones."""
    _load_all()
    if name not in _BUILDERS:
        raise ConfigError(f"unknown retrieval method {name!r}; known: {', '.join(available())}")
    return _BUILDERS[name](artifacts, config, model=model)
