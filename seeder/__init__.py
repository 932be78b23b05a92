"""SeedER: learned seed-and-expand retrieval over knowledge graphs (Shirzad et al.).

The library is split by concept: ``store`` (on-disk graphs), ``importers``, ``synth``, ``embed``,
``retrieve`` (seeding, K-HOP-WITH-FILTERING, reference retrievers and baselines), ``model``,
``rollout``, ``losses``, ``train``, ``metrics`` and ``cli``. Nothing here imports Ray: the Ray entry
points live in ``pipelines/`` and ``tune/``.
"""

__version__ = "0.1.0"
