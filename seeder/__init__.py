"""SeedER: learned seed-and-expand retrieval over knowledge graphs (Shirzad et al.).

The library is split by concept: ``store`` (on-disk graphs), ``importers``, ``synth``, ``embed``,
``retrieve`` (seeding, K-HOP-WITH-FILTERING, reference retrievers and baselines), ``model``,
``rollout``, ``losses``, ``train`` (the one training loop), ``inference`` (the one ranking path),
``checkpoint`` (the one model format), ``retriever`` (a trained model as a Python object),
``tracking`` (the one place that speaks to MLflow), ``metrics`` and ``cli``. Nothing here imports
Ray: the Ray entry points live in ``pipelines/`` and ``tune/``.
"""

__version__ = "0.1.0"
__all__ = ["Retriever", "Hits", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import seeder` stays cheap (no torch) for the CLI and the importers.
    if name in ("Retriever", "Hits"):
        from seeder.serving import retriever

        return getattr(retriever, name)
    raise AttributeError(f"module 'seeder' has no attribute {name!r}")
