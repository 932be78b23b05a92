"""SeedER: learned seed-and-expand retrieval over knowledge graphs (Shirzad et al.).

The library is split by concept into layers; a package imports only those below it (checked by the
import-linter contracts in pyproject.toml; docs/architecture.md):

- ``cli``: the ``seeder`` command, one module per subcommand;
- ``integrations``: LangChain, LlamaIndex and MCP adapters (optional extras);
- ``evaluation``: ``seeder evaluate``, ``seeder benchmark``;
- ``training``: the one training loop and the sweep trial;
- ``tracking``: MLflow runs, the logged model and the registry;
- ``serving``: ``Retriever``, a trained model answering new questions;
- ``policy``: the network, rollouts, losses, the one inference path and the one model format;
- ``preprocessing``: the stages, the artifacts they write, the derived defaults;
- ``generate``: synthetic graphs and questions generated from a graph;
- ``retrieve``: seeds, K-HOP-WITH-FILTERING, golden paths, the prior, metrics and the baselines;
- ``features``: encoders and PCA;
- ``data``: the on-disk graph, subgraphs and importers;
- ``system``: files and URIs, manifests, progress, threads, memory;
- ``config``: typed configuration.

Nothing here imports Ray: the Ray entry points live in ``pipelines/`` and ``tune/``.
"""

__version__ = "0.1.0"
__all__ = ["Retriever", "Hits", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import seeder` stays cheap (no torch) for the CLI and the importers.
    if name in ("Retriever", "Hits"):
        from seeder.serving import retriever  # lazy: see above

        return getattr(retriever, name)
    raise AttributeError(f"module 'seeder' has no attribute {name!r}")
