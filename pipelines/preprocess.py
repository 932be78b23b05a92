"""Preprocessing on Ray: embed -> features (PCA) -> seeds -> subgraphs, resumable, with a run summary.

    python pipelines/preprocess.py --dataset DIR --out ARTIFACTS [--config FILE] [KEY=VALUE ...]
    python pipelines/preprocess.py --dataset NEW_VERSION --update PARENT_ARTIFACTS --out ARTIFACTS [--refit-prior]
    ray job submit --working-dir . -- python pipelines/preprocess.py --dataset /abs/DIR --out /abs/ARTIFACTS

Run directly, it starts an embedded local Ray on 127.0.0.1, and joins a cluster only when given one:
``--ray-address ADDR`` or ``RAY_ADDRESS``, which ``ray job submit`` sets (``--ray-address local``
always starts an embedded one). Paths given to a submitted job should be absolute: the job runs in a
copy of the working directory. ``--dataset`` and ``--out`` may be URIs (``s3://...``, ``file://...``):
the dataset is fetched into each node's cache, and the artifacts are written in a local staging
directory of the driver, each stage published as it finishes and the manifest last
(``seeder.system.storage``). Nodes share no disk: Ray tasks read the dataset and the finished stages from
their locations and hand their results back through the object store. This file is only the Ray
entry point; the work lives in ``seeder.preprocessing.stages``.

With ``--update``, the dataset is a version written by ``seeder import ... --update`` and
PARENT_ARTIFACTS are its parent's artifacts: every stage reuses the parent's rows and recomputes only
what the change reaches (``seeder.preprocessing.incremental``), with the parent's config and PCA.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np

from pipelines.ray_runtime import add_ray_arguments, cluster_address, start_ray
from seeder.cli.arguments import HelpFormatter
from seeder.config import ConfigError, SeederConfig, load_config, parse_overrides, to_dict
from seeder.data.store import KnowledgeGraph, open_dataset
from seeder.data.subgraphs import SubgraphSet
from seeder.features.embed import EncoderUDF
from seeder.preprocessing import incremental as inc
from seeder.preprocessing import stages as pp
from seeder.preprocessing.artifacts import Artifacts, open_artifacts
from seeder.preprocessing.derive import derive_defaults, derive_unset, needs_derivation
from seeder.system import storage
from seeder.system.io import DataError, now, output_lock, read_manifest, write_manifest
from seeder.system.progress import Progress
from seeder.system.storage import is_uri, join, output_directory


def embed_pool(resources: dict, ec) -> tuple[int, int, dict]:
    """The embedding actor pool for a cluster's ``resources``: (actors, torch threads per actor, the
    ``map_batches`` resource request). ``embed.actors_per_gpu`` actors per GPU, each asking for that
    share of one; without GPUs one actor per ``embed.cpus_per_actor`` CPUs, each running that many
    torch threads."""
    gpus = int(resources.get("GPU", 0))
    cpus = float(resources.get("CPU", 1))
    if gpus:
        actors, threads, wanted = ec.num_actors or gpus * ec.actors_per_gpu, 1, 1.0
    else:
        actors = ec.num_actors or max(1, int(cpus // ec.cpus_per_actor))
        threads, wanted = max(1, int(min(ec.cpus_per_actor, cpus))), ec.cpus_per_actor
    # Each actor reserves its whole share: the texts reach the pool from the object store, so no read
    # task needs a CPU beside it, and a node with room for one actor cannot take a second one while
    # another node stands idle (SPREAD only prefers free nodes). Only a pool larger than the cluster
    # (``embed.num_actors``) shares the CPUs out; the reservation is Ray's bookkeeping, each actor
    # still runs ``threads`` torch threads.
    remote = {"num_cpus": min(wanted, cpus / actors)}
    if gpus:
        remote["num_gpus"] = 1 / -(-actors // gpus)  # a share small enough that every actor fits on one GPU
    return actors, threads, remote


# Texts per Ray Data batch for a GPU actor at least: on an H200, 8,192 against 1,024 took a 100K-text
# run from 12.0 to 9.2 s (fewer, larger hand-overs between the pipeline and the actor).
GPU_BLOCK_ROWS = 8192


def block_rows(batch_rows: int, gpu: bool) -> int:
    """Texts per ``map_batches`` call of an encoder actor: ``batch_rows``, and at least
    ``GPU_BLOCK_ROWS`` for a GPU actor."""
    return max(batch_rows, GPU_BLOCK_ROWS) if gpu else batch_rows


class NodeTaggedEncoder(EncoderUDF):
    """The encoder actor, with the Ray node it runs on added to every output row, so that the embed
    stage can record which node encoded what."""

    def __init__(self, embed_config: dict, num_threads: int):
        import ray

        super().__init__(embed_config, num_threads)
        self.node = ray.get_runtime_context().get_node_id()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().__call__(batch)
        out["node"] = np.full(len(out["row"]), self.node)
        return out


def embedding_dataset(ray, table, ec, batch_rows: int):
    """The Ray Data pipeline that embeds ``table``'s ``text`` column (keeping ``kind``, ``row``, ``id``,
    adding ``node``) through the pool of ``embed_pool``. Returns the dataset and the pool's (actors,
    torch threads per actor)."""
    import ray.data as data  # binds only ``data``: the ``ray`` argument stays the caller's module

    actors, threads, remote = embed_pool(ray.cluster_resources(), ec)
    batch_rows = block_rows(batch_rows, gpu="num_gpus" in remote)
    # The texts go from the driver into Ray's object store as several blocks, so that every actor of
    # the pool, on whichever node, gets work; no file of the driver is read anywhere else.
    chunks = max(actors * 4, table.num_rows // (batch_rows * 4) + 1)
    step = -(-table.num_rows // chunks)
    ds = data.from_arrow([table.slice(start, step) for start in range(0, table.num_rows, step)])
    # A slow encoder on a busy machine can take long per block; progress is the blocks we get,
    # and Ray Data's default 30 min no-progress limit once killed a MiniLM run that was working.
    ds.context.execution_no_progress_timeout_s = 6 * 3600
    # One progress display for the tool (seeder.system.progress), not Ray Data's per-operator bars or, off a
    # terminal, its log line per operator every few seconds.
    ds.context.enable_progress_bars = False
    # Data flows once every actor of the pool is up: otherwise the first actor to start can take every
    # batch of a small input while the others, on other nodes, are still loading.
    ds.context.wait_for_min_actors_s = 600
    ds = ds.map_batches(
        NodeTaggedEncoder,
        fn_constructor_kwargs={"embed_config": to_dict(ec), "num_threads": threads},
        compute=data.ActorPoolStrategy(size=actors),
        batch_size=batch_rows,
        batch_format="numpy",
        **remote,
    )
    return ds, (actors, threads)


def encoded_batches(ray, table, ec, batch_rows: int, threads: int):
    """``table``'s texts encoded, as batches of ``kind``, ``row``, ``id``, ``embedding`` and the ``node``
    that encoded them: through the actor pool of ``embedding_dataset``, or, with ``ray`` None, in
    this process (node ``driver``) with ``threads`` torch threads."""
    if ray is not None:
        ds, _ = embedding_dataset(ray, table, ec, batch_rows)
        yield from ds.iter_batches(batch_format="numpy", batch_size=None)
        return
    encoder = EncoderUDF(to_dict(ec), threads)
    for start in range(0, table.num_rows, batch_rows):
        part = table.slice(start, batch_rows)
        batch = encoder({name: part.column(name).to_numpy(zero_copy_only=False) for name in ("kind", "row", "id", "text")})
        yield {**batch, "node": np.full(part.num_rows, "driver")}


def run_embed(ray, stage: pp.StageDir, kg: KnowledgeGraph, config: SeederConfig, args) -> dict:
    inputs = pp.embed_inputs(kg)
    counts = {kind: len(ids) for kind, (ids, _) in inputs.items()}
    work = stage.open({"shard_rows": args.shard_rows})
    collector = pp.ShardCollector(work, counts, args.shard_rows)
    pending = collector.pending()
    table = pp.embed_text_table(inputs, pending, args.shard_rows)
    reused = sum(collector.num_blocks(k) - len(pending[k]) for k in pp.KINDS)
    if reused:
        print(f"embed: resuming, {reused} finished shards kept, {table.num_rows:,} texts left", flush=True)
    by_node: Counter = Counter()
    if table.num_rows:
        batch_rows = max(config.embed.batch_size, args.udf_batch)
        with Progress(table.num_rows, "embed", "texts") as bar:
            for batch in encoded_batches(ray, table, config.embed, batch_rows, driver_threads(args)):
                nodes, texts = np.unique(batch["node"], return_counts=True)
                by_node.update(dict(zip(nodes.tolist(), texts.tolist())))
                if collector.add(batch["kind"], batch["row"], batch["id"], np.asarray(batch["embedding"])):
                    pp.maybe_stop_for_test("embed", collector.written)
                bar.update(len(batch["row"]))
        if collector.unfinished():
            raise DataError(f"embed: the encoder returned incomplete blocks: {collector.unfinished()[:3]}")
    info = pp.finish_embed(work, kg)
    return {
        **info,
        "encoder": config.embed.encoder,
        "texts_embedded_this_run": int(table.num_rows),
        "texts_by_node": dict(sorted(by_node.items())),
    }


def driver_threads(args) -> int:
    """Torch threads of an encoder in the driver: the CPUs the run was given, else the machine's."""
    return args.num_cpus or os.cpu_count() or 1


def project_shards(batch: dict[str, np.ndarray], shards: str, pca) -> dict[str, np.ndarray]:
    """The Ray Data map of the features stage: the node-embedding shards a batch names, read from the
    ``shards`` location and projected with the fitted PCA, each row tagged with the Ray node."""
    import ray

    parts = [pp.project_embedding_shard(join(shards, str(name)), pca) for name in batch["shard"]]
    ids = np.concatenate([p[0] for p in parts])
    node = ray.get_runtime_context().get_node_id()
    return {"id": ids, "features": np.concatenate([p[1] for p in parts]), "node": np.full(len(ids), node)}


LOCAL_EMBED_BATCHES = 8
"""An update with at most this many ``--udf-batch`` batches of changed texts encodes them in the driver."""


def run_update_embed(need_ray, stage: pp.StageDir, kg: KnowledgeGraph, config: SeederConfig, args, update: "Update") -> dict:
    """The embed stage of an update: only the texts the parent has not embedded go through the encoder
    pool; the rest is the parent's (``incremental.write_embed``)."""
    table = inc.texts_to_embed(kg, update.diff)
    embedded = inc.EmbeddedRows(table)
    work = stage.open({"shard_rows": update.shard_rows})
    by_node: Counter = Counter()
    if table.num_rows:
        # A few batches: the driver encodes them, since starting an actor pool costs more than they do.
        ray = need_ray() if need_ray and table.num_rows > LOCAL_EMBED_BATCHES * args.udf_batch else None
        batch_rows = max(config.embed.batch_size, args.udf_batch)
        with Progress(table.num_rows, "embed", "texts") as bar:
            for batch in encoded_batches(ray, table, config.embed, batch_rows, driver_threads(args)):
                nodes, texts = np.unique(batch["node"], return_counts=True)
                by_node.update(dict(zip(nodes.tolist(), texts.tolist())))
                embedded.add(batch["kind"], batch["row"], np.asarray(batch["embedding"]))
                bar.update(len(batch["row"]))
    info = inc.write_embed(update.parent.path / "embed", work, kg, update.diff, embedded, update.shard_rows)
    return {
        **info,
        "encoder": config.embed.encoder,
        "texts_embedded_this_run": int(table.num_rows),
        "texts_by_node": dict(sorted(by_node.items())),
    }


def run_features(ray, stage: pp.StageDir, kg: KnowledgeGraph, config: SeederConfig, embed_dir: Path, artifacts: str) -> dict:
    """The features stage: the PCA is fitted in the driver on its bounded sample, and every node
    shard is projected by a Ray Data map over the workers, which read the shards from the artifacts
    location; the driver places the rows it gets back into ``node.npy``. With ``ray`` None, this
    process projects them."""
    if ray is None:
        return {**pp.run_features(embed_dir, stage.open(), kg, config), "rows_by_node": {"driver": kg.num_nodes}}
    import ray.data as data

    by_node: Counter = Counter()

    def project_nodes(names: list[str], pca):
        ds = data.from_items([{"shard": name} for name in names], override_num_blocks=len(names))
        ds.context.enable_progress_bars = False
        ds = ds.map_batches(
            project_shards,
            fn_kwargs={"shards": join(artifacts, "embed", "nodes"), "pca": pca},
            batch_size=1,
            batch_format="numpy",
            num_cpus=1,
        )
        with Progress(kg.num_nodes, "features", "rows") as bar:
            for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
                nodes, rows = np.unique(batch["node"], return_counts=True)
                by_node.update(dict(zip(nodes.tolist(), rows.tolist())))
                yield batch["id"], batch["features"]
                bar.update(len(batch["id"]))

    info = pp.run_features(embed_dir, stage.open(), kg, config, project_nodes=project_nodes)
    return {**info, "rows_by_node": dict(sorted(by_node.items()))}


BLOCK_TASK = {"num_cpus": 1, "max_retries": 3, "scheduling_strategy": "SPREAD"}
"""How a block of queries runs: one CPU; again on another node when its node dies (3 retries); and
spread over the nodes, since Ray's default packs short tasks onto the first idle node (seen on a
two-node cluster: all 12 blocks on one node while the other stood idle)."""


def on_node(task, *args):
    """Run a library task and say which Ray node ran it (Ray's remote wrapper; the library has no Ray)."""
    import ray

    shard, info = task(*args)
    return shard, {**info, "node": ray.get_runtime_context().get_node_id()}


def query_layout(args) -> dict:
    """The shard layout of a stage of query blocks: a working directory of another is started afresh."""
    return {"query_block": args.query_block}


def run_query_blocks(ray, stage: pp.StageDir, task, query_ids, dataset: str, artifacts: str, config: SeederConfig, args) -> dict:
    """One Ray task per block of queries; each reads the dataset and the finished stages from their
    locations (``dataset``, ``artifacts``) and returns its shard through the object store, and the
    driver writes it, so that no task touches a path of the driver. A rerun keeps finished shards."""
    blocks = pp.query_blocks(query_ids, args.query_block)
    work = stage.open(query_layout(args))
    todo = [b for b in range(len(blocks)) if not pp.subgraph_shard_path(work, b).exists()]
    if len(todo) < len(blocks):
        print(f"{stage.name}: resuming, {len(blocks) - len(todo)} of {len(blocks)} blocks kept", flush=True)
    by_node: dict[str, list[int]] = {}
    if todo:
        config_dict = to_dict(config)
        with Progress(int(sum(len(blocks[b]) for b in todo)), stage.name, "queries") as bar:
            for done, (block, shard, result) in enumerate(
                finished_blocks(ray, task, todo, blocks, dataset, artifacts, config_dict, args.num_cpus or os.cpu_count() or 1), 1
            ):
                pp.write_table_atomic(shard, pp.subgraph_shard_path(work, block), **pp.SHARD_WRITE)
                by_node.setdefault(result["node"], []).append(block)
                bar.update(int(result["queries"]))
                pp.maybe_stop_for_test(stage.name, done)
    return {
        "queries": int(len(query_ids)),
        "blocks": len(blocks),
        "blocks_this_run": len(todo),
        "blocks_by_node": {node: sorted(b) for node, b in sorted(by_node.items())},
    }


def finished_blocks(ray, task, todo: list[int], blocks, dataset: str, artifacts: str, config_dict: dict, threads: int = 1):
    """(block, shard, info with its ``node``) of every block in ``todo``, as each finishes: Ray tasks
    over the cluster, or, with ``ray`` None, in this process (node ``driver``) on ``threads`` threads.
    The compiled kernels release the GIL, so threads share the work; one question runs first, alone, so
    that what a block opens once per process (the graph index, the mapped features) is built once."""
    if ray is None:

        def one(b: int):
            return b, *task(dataset, artifacts, blocks[b], config_dict)

        if todo:
            task(dataset, artifacts, blocks[todo[0]][:1], config_dict)
        pool = ThreadPoolExecutor(max(threads, 1))
        try:
            for b, shard, info in (f.result() for f in as_completed([pool.submit(one, b) for b in todo])):
                yield b, shard, {**info, "node": "driver"}
        finally:
            pool.shutdown(cancel_futures=True)
        return
    remote = ray.remote(**BLOCK_TASK)(on_node)
    pending = {remote.remote(task, dataset, artifacts, blocks[b], config_dict): b for b in todo}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        block = pending.pop(ready[0])
        yield block, *ray.get(ready[0])


def run_seeds(ray, stage: pp.StageDir, kg: KnowledgeGraph, config: SeederConfig, args, features: Path, artifacts: str) -> dict:
    """The seeds stage, its dense search spread over Ray tasks of ``--query-block`` queries that read
    the node features from the artifacts location; entity linking and the choice among seeds stay in
    the driver (they read every question's text). With ``ray`` None, this process searches them all."""
    if ray is None:
        return {**pp.run_seeds(features, stage.open(), kg, config), "blocks_by_node": {"driver": [0]}}
    by_node: dict[str, list[int]] = {}
    info = pp.run_seeds(features, stage.open(), kg, config, dense_blocks=ray_dense_blocks(ray, config, args, artifacts, by_node))
    return {**info, "blocks_by_node": {node: sorted(b) for node, b in sorted(by_node.items())}}


def ray_dense_blocks(ray, config: SeederConfig, args, artifacts: str, by_node: dict[str, list[int]]):
    """``dense_blocks(query_features, search, index)`` of ``stages.run_seeds``: Ray tasks of
    ``--query-block`` queries that read the node features from the artifacts location; ``by_node``
    collects which Ray node ran which block."""

    def dense_blocks(query_features: np.ndarray, search: str, index):
        remote = ray.remote(**BLOCK_TASK)(on_node)
        index_ref = ray.put(index.to_bytes()) if index is not None else None  # one copy for every task
        config_dict = to_dict(config)
        starts = range(0, len(query_features), args.query_block)
        pending = {
            remote.remote(
                pp.dense_seed_block, artifacts, query_features[s : s + args.query_block], config_dict, search, index_ref
            ): b
            for b, s in enumerate(starts)
        }
        parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        with Progress(len(query_features), "seeds", "queries") as bar:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                block = pending.pop(ready[0])
                parts[block], result = ray.get(ready[0])
                by_node.setdefault(result["node"], []).append(block)
                bar.update(int(result["queries"]))
        ordered = [parts[b] for b in range(len(parts))]
        return np.concatenate([p[0] for p in ordered]), np.concatenate([p[1] for p in ordered])

    return dense_blocks


class Update:
    """An update run's parent artifacts, its dataset, what changed and whether the prior is refitted."""

    def __init__(self, parent: Artifacts, kg: KnowledgeGraph, config: SeederConfig, refit_prior: bool):
        self.parent = parent
        self.parent_kg = parent.dataset
        self.refit_prior = refit_prior and config.expand.relation_score == "learned"
        self.kept = (["pca"] if config.reduce.dim else []) + (
            ["paths", "prior"] if config.expand.relation_score == "learned" and not self.refit_prior else []
        )
        layout = (read_manifest(parent.path / "embed") or {}).get("layout", {})
        self.shard_rows = int(layout.get("shard_rows", 10_000))
        # The parent's subgraphs are read on a thread of their own while the versions are compared
        # (Arrow's reader releases the GIL): the subgraphs stage needs them unless the prior is refitted.
        self._reader = ThreadPoolExecutor(1)
        self._parent_subgraphs = None if self.refit_prior else self._reader.submit(SubgraphSet.read, parent.path / "subgraphs")
        self._reader.shutdown(wait=False)
        self.diff = inc.diff_versions(self.parent_kg, kg)
        if "prior" in self.kept:
            inc.check_kept_masked_prior(kg, parent, config, self.diff)

    def parent_subgraphs(self):
        """The parent's subgraphs (``SubgraphSet``), or None when the prior is refitted."""
        return None if self._parent_subgraphs is None else self._parent_subgraphs.result()

    def record(self) -> dict:
        return {
            "parent": inc.parent_record(self.parent),
            "kept": self.kept,
            "refit_prior": self.refit_prior,
            "diff": self.diff.counts,
        }


def run_update_seeds(
    need_ray, stage: pp.StageDir, kg: KnowledgeGraph, config: SeederConfig, args, out: Path, inputs: str, update: Update
) -> dict:
    """The seeds stage of an update: the questions the change can reach are seeded again, their dense
    search over Ray tasks when there are any (``incremental.update_seeds``), or here with ``need_ray`` None."""
    by_node: dict[str, list[int]] = {}

    def dense_blocks(features, search, index):
        if small_update(args, len(features)):
            found, _ = pp.dense_seed_block(inputs, features, to_dict(config), search, index.to_bytes() if index else None)
            by_node.setdefault("driver", []).append(0)
            return found
        return ray_dense_blocks(need_ray(), config, args, inputs, by_node)(features, search, index)

    info = inc.update_seeds(
        out / "features",
        stage.open(),
        kg,
        update.parent_kg,
        update.parent.path / "seeds" / "seeds.parquet",
        update.diff,
        config,
        dense_blocks=dense_blocks if need_ray else None,
    )
    return {**info, "blocks_by_node": {node: sorted(b) for node, b in sorted(by_node.items())}}


def update_query_stage(
    need_ray, stage: pp.StageDir, task, ids: np.ndarray, dataset: str, inputs: str, config, args, keep
) -> dict:
    """A stage of query shards in an update: ``ids`` computed as a full run computes them (one Ray task
    per block), then ``keep(directory)`` writes the parent's rows of every other question."""
    local = need_ray is None or not len(ids) or small_update(args, len(ids))
    # The parent's rows are written while the blocks are computed: Arrow's writer releases the GIL, and
    # the blocks' kernels are bound by memory more than by the cores.
    with ThreadPoolExecutor(1) as writer:
        kept = writer.submit(keep, stage.open(query_layout(args)))
        info = run_query_blocks(None if local else need_ray(), stage, task, ids, dataset, inputs, config, args)
        return {**info, "recomputed": int(len(ids)), "kept": int(kept.result())}


SMALL_UPDATE = 65536
"""An update's stage with fewer questions to compute than this runs them on threads in this process
when Ray is not a cluster: Ray's start (about 5 s) costs more than its worker processes save over
threads on that few questions (the kernels release the GIL)."""


def small_update(args, questions: int) -> bool:
    """Whether an update computes this many questions of a stage here (``--update-in-process-below``)."""
    return questions < args.update_in_process_below and cluster_address(args.ray_address) is None


IN_PROCESS_BELOW = 2048
"""Texts under which a local run skips Ray: starting Ray and its workers costs a small graph's run
several times its work (a few seconds of stages against about 15 s of start)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python pipelines/preprocess.py", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--dataset", required=True, help="dataset directory or URI (from `seeder import` or `seeder synth`)")
    parser.add_argument(
        "--out", required=True, help="artifacts directory or URI (created; reruns resume and skip finished stages)"
    )
    parser.add_argument(
        "--config",
        help="YAML config, e.g. configs/metaqa.yaml (default: derive the choices it would make from the training split)",
    )
    add_ray_arguments(parser)
    parser.add_argument("--shard-rows", type=int, default=10_000, help="texts per embedding shard (resume granularity)")
    parser.add_argument("--udf-batch", type=int, default=1024, help="texts per Ray Data batch given to an encoder actor")
    parser.add_argument("--query-block", type=int, default=1_000, help="queries per expansion task and shard")
    parser.add_argument(
        "--in-process-below",
        type=int,
        default=IN_PROCESS_BELOW,
        metavar="TEXTS",
        help="a graph of fewer texts (nodes, relations and queries) than this, with no cluster to join, goes through "
        "every stage in this process without starting Ray; 0: always on Ray",
    )
    parser.add_argument(
        "--update",
        metavar="PARENT_ARTIFACTS",
        help="the artifacts of --dataset's parent version (`seeder import ... --update`): reuse them and recompute "
        "only what the change reaches, with the parent's config and PCA (docs/updates.md)",
    )
    parser.add_argument(
        "--update-in-process-below",
        type=int,
        default=SMALL_UPDATE,
        metavar="QUESTIONS",
        help="with --update and no cluster to join: a stage with fewer questions to seed or extract again than this "
        "computes them in this process, without starting Ray for them; 0: always on Ray",
    )
    parser.add_argument(
        "--refit-prior",
        action="store_true",
        help="with --update: fit the relation-path prior again on the updated golden paths (every subgraph is then "
        "extracted again); by default the parent's prior is kept",
    )
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. embed.encoder=hash expand.budget=150")
    args = parser.parse_args(argv)
    if args.in_process_below < 0 or args.update_in_process_below < 0:
        parser.error("--in-process-below and --update-in-process-below must be 0 or more")
    if args.refit_prior and not args.update:
        parser.error("--refit-prior goes with --update (a full run always fits the prior)")
    for name in ("shard_rows", "udf_batch", "query_block"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # Everything that can fail on bad input is checked before Ray starts.
        # Ray tasks run in their own directories: local paths go to them absolute.
        dataset = args.dataset if is_uri(args.dataset) else str(Path(args.dataset).resolve())
        kg = open_dataset(dataset)
        update = None
        if args.update:
            parent = open_artifacts(args.update)
            inc.check_parent(kg, parent)
            config = inc.update_config(parent, args.config, args.overrides)
            inc.check_kept_prior(kg, parent, config, args.refit_prior)
            update = Update(parent, kg, config, args.refit_prior)
        else:
            config = load_config(args.config, args.overrides)
            if args.config is None:
                config = derive_unset(config, parse_overrides(args.overrides))
            pp.check_config(config)
        target = args.out if is_uri(args.out) else str(Path(args.out).resolve())
        # A URI gets its manifest only when every stage finished: after an error it does not look complete.
        with output_directory(target) as out, output_lock(out):
            run_stages(args, config, kg, dataset, out, target, update)
    except (ConfigError, DataError) as exc:
        print(f"preprocess: error: {exc}", file=sys.stderr)
        return 2
    return 0


def run_stages(
    args: argparse.Namespace,
    config: SeederConfig,
    kg: KnowledgeGraph,
    dataset: str,
    out: Path,
    target: str,
    update: Update | None = None,
) -> None:
    """Every stage into the local directory ``out``; ``dataset`` and ``target`` are the locations
    recorded in the manifest and summary (URIs stay URIs). With ``update``, each stage reuses the
    parent's artifacts and recomputes what the change reaches."""
    previous = read_manifest(out) if out.is_dir() else None
    if out.is_dir() and next(out.iterdir(), None) is not None and (previous or {}).get("kind") != "seeder-artifacts":
        # Resuming writes into an existing --out: only artifacts of this tool (or an empty folder) qualify.
        raise DataError(
            f"{target}: exists and is not an artifacts directory of seeder (its manifest kind is "
            f"{(previous or {}).get('kind')!r}); choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    if update is not None:
        fps = inc.update_fingerprints(config, kg, update.parent, update.kept)
    else:
        fps = pp.stage_fingerprints(config, kg.fingerprint, kg.num_nodes)
    previous = previous or {}
    manifest = {
        "kind": "seeder-artifacts",
        "dataset": dataset,
        "dataset_fingerprint": kg.fingerprint,
        "config": to_dict(config),
        "fingerprints": fps,
        "created": previous.get("created", now()),
        "stages": {},
    }
    if update is not None:
        manifest["update"] = update.record()
        if update.parent.step_budget:
            manifest["step_budget"] = update.parent.step_budget
    write_manifest(out, manifest)
    timer = pp.StageTimer()
    counts = {"nodes": kg.num_nodes, "relations": 2 * kg.num_relations, "queries": kg.queries.num_rows}
    ray = None
    total_start = time.perf_counter()

    recomputed = []  # stages computed in this run: the stages after them are computed again too
    inputs = target if is_uri(target) else str(out)  # where a task reads the finished stages

    def stage_run(name, body, items, unit, detail):
        stage = pp.StageDir(out, name, fps[name])
        start = time.perf_counter()
        if recomputed:
            # Its inputs were just computed again: nothing of this stage kept from before is trusted.
            if stage.complete_manifest() is not None:
                print(f"{name}: recomputing, since {recomputed[-1]} was recomputed in this run", flush=True)
            done = None
            stage.discard_partial()
        else:
            done = stage.reusable(echo=lambda line: print(line, flush=True))  # checksums of every file
        verify_seconds = time.perf_counter() - start
        if done is None:
            start = time.perf_counter()
            info = body(stage)
            linked_from = update.parent.path / name if update is not None else None
            done = stage.commit({"seconds": time.perf_counter() - start, "info": info}, linked_from=linked_from)
            skipped = False
            recomputed.append(name)
        else:
            skipped = True
        timer.record(
            name,
            done["seconds"],
            items,
            unit,
            detail,
            skipped=skipped,
            info=done.get("info", {}),
            verify_seconds=round(verify_seconds, 4),
            record_seconds=done.get("record_seconds"),
        )
        manifest["stages"][name] = {"fingerprint": fps[name], "skipped": skipped, "seconds": done["seconds"]}
        write_manifest(out, manifest)
        share_stage(name)

    def share_stage(name):
        # Tasks on other nodes read a finished stage from the artifacts location. A URI gets each
        # stage as it completes; its top manifest is withdrawn first, so that the location never
        # looks complete while its stages change, and comes back last when the run ends.
        if not is_uri(target):
            return
        local = read_manifest(out / name)
        if storage.published_manifest(join(target, name)) == local:
            return
        if not retracted:
            storage.retract(target)
            retracted.append(True)
        storage.publish(out / name, join(target, name))

    retracted: list[bool] = []

    def need_ray():
        nonlocal ray
        if ray is None:
            ray = start_ray(args.ray_address, args.num_cpus, who="preprocess")
        return ray

    texts = sum(counts.values())
    in_process = cluster_address(args.ray_address) is None and texts < args.in_process_below
    if in_process:
        print(
            f"preprocess: {texts:,} texts, fewer than --in-process-below {args.in_process_below:,}: "
            "every stage runs in this process, without Ray",
            flush=True,
        )
    if update is not None:
        run_update(update, stage_run, None if in_process else need_ray, args, config, kg, dataset, out, inputs, counts)
        finish(args, kg, dataset, out, target, timer, counts, config, total_start, ray, update, manifest)
        return

    def cluster():
        """Ray for a stage's work, or None when the graph is small enough for this process."""
        return None if in_process else need_ray()

    stage_run(
        "embed",
        lambda s: run_embed(cluster(), s, kg, config, args),
        texts,
        "texts",
        f"{counts['nodes']:,} nodes, {counts['relations']:,} relations, {counts['queries']:,} queries",
    )
    stage_run(
        "features",
        lambda s: run_features(cluster(), s, kg, config, out / "embed", inputs),
        texts,
        "rows",
        f"PCA to {config.reduce.dim or 'encoder'} dims of {texts:,} rows",
    )
    if needs_derivation(config):
        features = out / "features"
        config, lines = derive_defaults(
            kg,
            np.load(features / "node.npy", mmap_mode="r"),
            np.load(features / "query.npy"),
            np.load(features / "query_ids.npy"),
            config,
        )
        for line in lines:
            print(line, flush=True)
        pp.check_config(config)
        fps = pp.stage_fingerprints(config, kg.fingerprint, kg.num_nodes)
        step_budget = {"expansion_sizes": config.train.expansion_sizes, "frontier_caps": config.train.frontier_caps}
        manifest.update(config=to_dict(config), fingerprints=fps, derived=lines, step_budget=step_budget)
        write_manifest(out, manifest)
    stage_run(
        "seeds",
        lambda s: run_seeds(cluster(), s, kg, config, args, out / "features", inputs),
        counts["queries"],
        "queries",
        f"top-{config.seed.k0} {config.seed.strategy} seeds of {counts['queries']:,} queries",
    )
    if "paths" in fps:
        train_count = len(pp.train_query_ids(kg))
        stage_run(
            "paths",
            lambda s: run_query_blocks(cluster(), s, pp.paths_block, pp.train_query_ids(kg), dataset, inputs, config, args),
            train_count,
            "queries",
            f"golden relation paths (<= {config.expand.hops} hops) of {train_count:,} training queries",
        )
        stage_run(
            "prior", lambda s: pp.run_prior(out, s.open(), kg, config), train_count, "queries", "relation-path prior fitted"
        )
        for line in pp.path_summary(out, kg):
            print(line)
    stage_run(
        "subgraphs",
        lambda s: run_query_blocks(
            cluster(), s, pp.expand_block, np.load(out / "features" / "query_ids.npy"), dataset, inputs, config, args
        ),
        counts["queries"],
        "subgraphs",
        f"{counts['queries']:,} subgraphs (budget {config.expand.budget}, {config.expand.hops} hops)",
    )

    finish(args, kg, dataset, out, target, timer, counts, config, total_start, ray, update, manifest)


def run_update(
    update: Update,
    stage_run,
    need_ray,
    args,
    config: SeederConfig,
    kg: KnowledgeGraph,
    dataset: str,
    out: Path,
    inputs: str,
    counts: dict,
) -> None:
    """The stages of an update, each committed as a full run commits it (``stage_run``). ``need_ray()``
    starts Ray for a stage that has work for it; None runs every stage in this process."""
    diff = update.diff
    parent = update.parent.path
    texts = sum(counts.values())
    changed = int((diff.node_source < 0).sum() + (diff.relation_source < 0).sum() + (diff.query_source < 0).sum())
    stage_run(
        "embed",
        lambda s: run_update_embed(need_ray, s, kg, config, args, update),
        changed,
        "texts",
        f"{changed:,} new or edited texts of {texts:,}",
    )
    stage_run(
        "features",
        lambda s: inc.write_features(parent / "features", out / "embed", s.open(), kg, diff, config, update.shard_rows),
        changed,
        "rows",
        f"{changed:,} rows projected ({'the parent PCA' if config.reduce.dim else 'no PCA'}), the rest the parent's",
    )
    stage_run(
        "seeds",
        lambda s: run_update_seeds(need_ray, s, kg, config, args, out, inputs, update),
        counts["queries"],
        "queries",
        f"top-{config.seed.k0} {config.seed.strategy} seeds of the questions the change reaches",
    )
    seeds, reseeded = inc.changed_seeds(parent / "seeds" / "seeds.parquet", out / "seeds" / "seeds.parquet", diff, config.seed.k0)
    if config.expand.relation_score == "learned" and update.refit_prior:
        train = pp.train_query_ids(kg)
        # Paths that a parent kept from its own parent were searched on an older graph: all again.
        current = inc.paths_searched_on(update.parent) == update.parent_kg.fingerprint
        redo = inc.paths_to_recompute(kg, diff, config, seeds, reseeded) if current else train
        stage_run(
            "paths",
            lambda s: {
                **update_query_stage(
                    need_ray,
                    s,
                    pp.paths_block,
                    redo,
                    dataset,
                    inputs,
                    config,
                    args,
                    lambda d: inc.keep_golden_paths(parent / "paths", d, train, redo),
                ),
                "searched_on": kg.fingerprint,
            },
            len(redo),
            "queries",
            f"golden relation paths of {len(redo):,} of {len(train):,} training queries",
        )
        stage_run("prior", lambda s: pp.run_prior(out, s.open(), kg, config), len(train), "queries", "relation-path prior fitted")
    elif config.expand.relation_score == "learned":
        # The kept prior's training data: the golden paths it was fitted on stay with it, and the
        # graph they were searched on is recorded, so that a refit later searches them all again.
        stage_run(
            "paths",
            lambda s: {
                "files": inc.copy_stage_files(parent / "paths", s.open()),
                "kept": "the golden paths of the kept prior",
                "recomputed": 0,
                "searched_on": inc.paths_searched_on(update.parent),
            },
            0,
            "queries",
            "golden relation paths kept with the prior",
        )
        stage_run(
            "prior",
            lambda s: {"files": inc.copy_stage_files(parent / "prior", s.open()), "kept": "the parent's prior"},
            0,
            "queries",
            "relation-path prior kept from the parent",
        )
    ids = np.load(out / "features" / "query_ids.npy")
    warm = None
    if len(ids) and (need_ray is None or cluster_address(args.ray_address) is None):
        # What an in-process extraction opens once (the graph index, the mapped features) is built on
        # a thread of its own while the regions test below runs (numpy and compiled, so mostly outside
        # the GIL); finished_blocks then finds it built.
        warmer = ThreadPoolExecutor(1)
        warm = warmer.submit(pp.expand_block, dataset, inputs, ids[:1], to_dict(config))
        warmer.shutdown(wait=False)
    why = {"all": "the prior was fitted again"}
    previous = update.parent_subgraphs()
    if previous is not None:
        ids, why = inc.subgraphs_to_recompute(kg, diff, config, previous, seeds, reseeded, update.parent_kg, out / "features")
    if warm is not None:
        warm.result()
    stage_run(
        "subgraphs",
        lambda s: {
            **update_query_stage(
                need_ray,
                s,
                pp.expand_block,
                ids,
                dataset,
                inputs,
                config,
                args,
                lambda d: inc.keep_subgraphs(previous, d, diff.query_ids, ids) if previous is not None else 0,
            ),
            "why": why,
        },
        len(ids),
        "subgraphs",
        f"{len(ids):,} of {counts['queries']:,} subgraphs extracted again (budget {config.expand.budget}, {config.expand.hops} hops)",
    )


def finish(
    args,
    kg: KnowledgeGraph,
    dataset: str,
    out: Path,
    target: str,
    timer,
    counts: dict,
    config: SeederConfig,
    total_start: float,
    ray,
    update: Update | None,
    manifest: dict,
) -> None:
    """The run summary (and, for an update, what it recomputed), written once every stage is done."""
    subgraphs = SubgraphSet.read(out / "subgraphs", ordered=False)
    ceiling = pp.ceilings(subgraphs, kg)
    summary = {
        "dataset": dataset,
        "artifacts": target,
        "finished": now(),
        "wall_seconds": round(time.perf_counter() - total_start, 3),
        "counts": {
            **counts,
            "edges": kg.num_edges,
            "subgraph_nodes": int(subgraphs.sizes.sum()),
            "subgraph_edges": int(subgraphs.edge_ptr[-1]),
            "mean_subgraph_size": float(subgraphs.sizes.mean()) if len(subgraphs) else 0.0,
        },
        "stages": timer.stages,
        "ceiling": ceiling,
        "config": to_dict(config),
    }
    if update is not None:
        summary["update"] = {**update.record(), "recomputed": recomputed(timer.stages)}
        manifest["update"] = summary["update"]
        write_manifest(out, manifest)
    pp.write_summary(out, summary)
    for line in pp.format_ceilings(ceiling):
        print(line)
    print(f"summary: {join(target, 'summary.json')}")
    if ray is not None and not os.environ.get("RAY_ADDRESS"):
        ray.shutdown()


def recomputed(stages: dict) -> dict:
    """What an update computed, per stage, from the stages' infos (those of a resumed run included)."""
    info = {name: entry.get("info", {}) for name, entry in stages.items()}
    out = {
        "embedded_rows": info.get("embed", {}).get("embedded", {}),
        "seeded_queries": info.get("seeds", {}).get("recomputed"),
        "subgraphs": info.get("subgraphs", {}).get("recomputed"),
        "subgraphs_why": info.get("subgraphs", {}).get("why"),
        "seeds_why": info.get("seeds", {}).get("why"),
    }
    if "paths" in info:
        out["golden_path_queries"] = info["paths"].get("recomputed")
        out["prior"] = "kept" if info.get("prior", {}).get("kept") else "fitted again"
    return out


if __name__ == "__main__":
    sys.exit(main())
