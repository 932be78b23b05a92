"""``seeder benchmark --ray``: the query blocks of a benchmark ranked on Ray Data.

Only the query ids travel: each actor opens the artifacts by path (memory-mapped features, the
split's subgraphs) and builds the retrievers once (``seeder.benchmark.BlockRanker``); the driver
gets back rankings and set sizes and computes the metrics exactly as the in-process path does.
Imported lazily by ``seeder.benchmark`` when ``--ray`` is given; the library never imports Ray.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import pyarrow as pa

from pipelines.ray_runtime import start_ray
from seeder.benchmark import BlockRanker, results_from_blocks
from seeder.config import to_dict


def make_ray_ranker(artifacts_path: str | Path, split: str, address: str | None = None, num_cpus: int | None = None,
                    actors: int | None = None) -> Callable[..., dict[str, Any]]:
    """A ``ray_ranker`` for ``seeder.benchmark.run_benchmark``: ranks the benchmark's queries in
    blocks of ``block_queries`` on an actor pool (one actor per CPU unless ``actors`` is given)."""

    def rank(inputs, methods: list[str], config, model: str | None, block_queries: int):
        ray = start_ray(address, num_cpus, who="benchmark")
        import ray.data

        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        pool = actors or cpus
        query_ids = np.asarray(inputs.subgraphs.query_ids, dtype=np.int64)
        ds = ray.data.from_arrow(pa.table({"query_id": query_ids}))
        ds = ds.map_batches(
            BlockRanker,
            fn_constructor_kwargs={
                "artifacts_path": str(Path(artifacts_path).resolve()), "split": split, "methods": list(methods),
                "config": to_dict(config), "model": model, "num_threads": 1,
            },
            compute=ray.data.ActorPoolStrategy(size=pool),
            batch_size=max(1, int(block_queries)),
            batch_format="numpy",
            num_cpus=1,
        )
        blocks = list(ds.iter_batches(batch_format="numpy", batch_size=None))
        print(f"ray: {len(query_ids)} queries ranked in {len(blocks)} batches on {pool} actors", file=sys.stderr, flush=True)
        return results_from_blocks(blocks, list(methods), query_ids)

    return rank
