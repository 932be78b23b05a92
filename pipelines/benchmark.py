"""The retrieval benchmark with its query blocks ranked on Ray Data: ``seeder benchmark``'s arguments,
plus where Ray runs.

    python pipelines/benchmark.py --artifacts A [--method all] [--split val] [--ray-address ADDR] [--num-cpus N] ...
    ray job submit --working-dir . -- python pipelines/benchmark.py --artifacts /abs/A ...

Only the query ids travel: each actor opens the artifacts by path or URI (memory-mapped features, the
split's subgraphs) and builds the retrievers once (seeder.evaluation.benchmark.BlockRanker); the driver gets back
rankings and set sizes and computes the metrics, latencies and report exactly as seeder benchmark does.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import numpy as np
import pyarrow as pa

from pipelines.ray_runtime import add_ray_arguments, start_ray
from seeder.cli import benchmark as command
from seeder.cli.arguments import HelpFormatter
from seeder.config import ConfigError, to_dict
from seeder.evaluation import benchmark as bm
from seeder.system.io import DataError
from seeder.system.storage import is_uri


def make_ray_ranker(
    artifacts: str | Path,
    split: str,
    address: str | None = None,
    num_cpus: int | None = None,
    actors: int | None = None,
    accept_mismatch: bool = False,
) -> Callable[..., dict[str, Any]]:
    """A ``ray_ranker`` for ``seeder.evaluation.benchmark.run_benchmark``: ranks the benchmark's queries in
    blocks of ``block_queries`` on an actor pool (one actor per CPU unless ``actors`` is given)."""
    # Actors run in their own directories (and, on a cluster, on other nodes, which fetch a URI themselves).
    location = str(artifacts) if is_uri(artifacts) else str(Path(artifacts).resolve())

    def rank(inputs, methods: list[str], config, model: str | None, block_queries: int):
        ray = start_ray(address, num_cpus, who="benchmark")
        import ray.data  # noqa: F811 (the same ray, with its data module loaded)

        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        pool = actors or cpus
        query_ids = np.asarray(inputs.subgraphs.query_ids, dtype=np.int64)
        ds = ray.data.from_arrow(pa.table({"query_id": query_ids}))
        ds = ds.map_batches(
            bm.BlockRanker,
            fn_constructor_kwargs={
                "artifacts_path": location,
                "split": split,
                "methods": list(methods),
                "config": to_dict(config),
                "model": model,
                "num_threads": 1,
                "accept_mismatch": accept_mismatch,
            },
            compute=ray.data.ActorPoolStrategy(size=pool),
            batch_size=max(1, int(block_queries)),
            batch_format="numpy",
            num_cpus=1,
        )
        blocks = list(ds.iter_batches(batch_format="numpy", batch_size=None))
        print(f"ray: {len(query_ids)} queries ranked in {len(blocks)} batches on {pool} actors", file=sys.stderr, flush=True)
        return bm.results_from_blocks(blocks, list(methods), query_ids)

    return rank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python pipelines/benchmark.py", description=__doc__, formatter_class=HelpFormatter)
    command.add_arguments(parser)
    add_ray_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return command.run(
            args,
            ray_ranker=make_ray_ranker(
                args.artifacts, args.split, args.ray_address, args.num_cpus, accept_mismatch=args.accept_mismatch
            ),
        )
    except (DataError, ConfigError, FileNotFoundError) as exc:
        print(f"pipelines/benchmark.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
