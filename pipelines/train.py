"""Distributed training of the SeedER policy on Ray Train (V2): sharded data, gradient averaging,
a checkpoint per epoch, resume, MLflow tracking.

    python pipelines/train.py --artifacts A [--artifacts B ...] [--config FILE] [KEY=VALUE ...] [--num-workers N] [--use-gpu]
        [--out DIR] [--experiment NAME] [--storage PATH_OR_URI] [--name NAME] [--resume]

Every worker reads the artifacts (``--artifacts`` may be an ``s3://``/``file://`` URI: each node
fetches it once into its cache; given more than once, one model trains on every graph's questions)
and, each epoch, trains on its slice of one seeded permutation of the trainable queries, so the ranks
see disjoint queries and the same number of steps. Gradients are averaged over the ranks before every
optimiser step. Rank 0 validates, logs to MLflow and writes the
checkpoint that ``ray.train.report`` persists under ``STORAGE/NAME``. At the end the best epoch's
weights become the model directory ``OUT/model`` (plus ``OUT/history.json`` and
``OUT/training_curve.png``), logged to MLflow as the run's model, so ``seeder evaluate --method seeder
--model OUT/model`` and ``runs:/ID/model`` work.

Resume: Ray Train V2 has no ``TorchTrainer.restore`` (it raises a DeprecationWarning). A run started
again with the same ``RunConfig(name, storage_path)`` finds ``checkpoint_manager_snapshot.json`` there
and hands the latest checkpoint to ``ray.train.get_checkpoint()``; worker failures inside a run are
retried the same way (``--max-failures``). So ``--resume`` reruns the same command; without it an
existing run under ``STORAGE/NAME`` is an error rather than a silent continuation.

This file holds only the Ray side (worker setup, the gradient all-reduce, reporting); the epoch loop,
the validation, the best rule and the checkpoint format are ``seeder.training.loop.fit`` and
``seeder.policy.checkpoint``, shared with ``python -m seeder.training.loop`` and the sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


from pipelines.ray_runtime import add_ray_arguments, check_tracking_reaches_workers, cluster_address, start_ray
from seeder import tracking
from seeder.cli.arguments import HelpFormatter
from seeder.config import ConfigError, SeederConfig, from_dict, to_dict, training_config
from seeder.system.io import DataError
from seeder.system.storage import fetch, is_uri, join

CHECKPOINT_DIR = "checkpoint"  # inside a Ray checkpoint: a seeder.policy.checkpoint training checkpoint
SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"  # Ray Train V2's record of a run's checkpoints
EXIT_AFTER_EPOCH_ENV = "SEEDER_TRAIN_EXIT_AFTER_EPOCH"  # test hook: rank 0 dies after this epoch's checkpoint


# -- Ray-free preparation (runs before Ray starts, so bad input fails fast) ---------------------------


@dataclass
class TrainingJob:
    config: SeederConfig
    artifacts: str  # as given: a local path or a URI every worker fetches
    out: Path
    storage: str  # absolute local path or URI
    name: str
    trainable: int  # trainable training queries
    val_queries: int


def experiment_path(storage: str, name: str) -> str:
    return join(storage, name)


def run_exists(storage: str, name: str) -> bool:
    """Whether Ray Train has a checkpoint record for ``name`` under ``storage``."""
    path = join(experiment_path(storage, name), SNAPSHOT_FILE)
    if not is_uri(path):
        return Path(path).is_file()
    import pyarrow.fs as pafs

    fs, inner = pafs.FileSystem.from_uri(path)
    return fs.get_file_info(inner).type == pafs.FileType.File


def open_all(artifacts: str) -> list:
    """The artifacts of a run: one location, or several joined by commas (one model for several graphs)."""
    from seeder.preprocessing.artifacts import open_artifacts

    return [open_artifacts(fetch(location)) for location in artifacts.split(",")]


def query_data(opened: list, split: str):
    """One ``QueryData`` over every graph's ``split`` (``QueryData.concat``)."""
    from seeder.policy.inference import QueryData

    return QueryData.concat([QueryData.from_artifacts(a, split) for a in opened])


def step_budget_of(opened: list) -> dict | None:
    """The derived step budget of one graph; for several, the most steps any needs, each step as large
    as the largest (None when one of them has none: a config file chose its steps)."""
    budgets = [a.step_budget for a in opened]
    if any(b is None for b in budgets):
        return None
    steps = max(len(b["expansion_sizes"]) for b in budgets)
    return {
        key: [max(b[key][t] for b in budgets if t < len(b[key])) for t in range(steps)]
        for key in ("expansion_sizes", "frontier_caps")
    }


def prepare_job(
    artifacts: str | list[str],
    config_path: str | None,
    overrides: list[str],
    out: str,
    num_workers: int,
    storage: str | None = None,
    name: str | None = None,
    resume: bool = False,
) -> TrainingJob:
    """Validate everything a run needs (artifacts, config, splits, sizes, earlier run) without Ray.
    Several artifacts train one model on all their graphs: they need one feature space (each built with
    ``reduce.dim=0`` and the same encoder); the first one's preprocessing config is the model's."""
    from seeder.policy.checkpoint import artifact_feature_space
    from seeder.training.loop import check_config, trainable_queries

    if num_workers < 1:
        raise ConfigError(f"--num-workers {num_workers}: need at least 1")
    locations = [artifacts] if isinstance(artifacts, str) else list(artifacts)
    # Ray Train workers run in their own directories: local paths go to them absolute.
    locations = [a if is_uri(a) else str(Path(a).resolve()) for a in locations]
    for location in locations:
        if "," in location:
            raise DataError(f"--artifacts {location}: a location with a comma; give each with its own --artifacts")
        if not Path(fetch(location)).is_dir():
            raise DataError(f"--artifacts {location}: no such directory; run pipelines/preprocess.py --out {location} first")
    artifacts = ",".join(locations)
    every = open_all(artifacts)
    spaces = {artifact_feature_space(a) for a in every}
    if len(every) > 1 and (None in spaces or len(spaces) > 1):
        raise DataError(
            f"--artifacts {' '.join(locations)}: one model for several graphs needs one feature space; "
            "build each with reduce.dim=0 and the same encoder"
        )
    opened = every[0]
    config = training_config(opened.config, config_path, overrides, step_budget_of(every))
    check_config(config)
    if (
        config.train.init_from
        and not is_uri(config.train.init_from)
        and not config.train.init_from.startswith(("runs:/", "models:/"))
    ):
        start = Path(config.train.init_from).resolve()  # workers do not share the driver's directory
        if not start.is_dir():
            raise DataError(f"train.init_from={config.train.init_from}: no such model directory; pass RUN/model")
        config.train.init_from = str(start)
    train = query_data(every, "train")
    val = query_data(every, "val")
    trainable = len(trainable_queries(train, config))
    usable = min(trainable, config.train.queries_per_epoch or trainable)
    if usable < num_workers:
        raise DataError(
            f"{artifacts}: {usable} trainable training queries for {num_workers} workers; every worker needs "
            "at least one (lower --num-workers or raise train.queries_per_epoch)"
        )
    out_dir = Path(out).resolve()
    storage = storage if storage and is_uri(storage) else str(Path(storage or out_dir / "ray").resolve())
    name = name or "train"
    if run_exists(storage, name) and not resume:
        raise DataError(
            f"{experiment_path(storage, name)} already holds a training run; pass --resume to continue it "
            "from its last checkpoint, or choose another --out/--name"
        )
    return TrainingJob(config, str(artifacts), out_dir, storage, name, trainable, len(val.subgraphs))


# -- the per-worker loop (uses ray.train) -------------------------------------------------------------


class GradientAverage:
    """An optimiser pre-step hook that averages gradients over the ranks in one all-reduce
    (``optimizer.register_step_pre_hook(GradientAverage(model, world, delayed))``).

    The policy is driven through its methods (encode_nodes, propagate, expansion_logits, scores), not
    ``forward``, and DDP only arms its reducer in ``forward``; so gradients are averaged explicitly.
    ``seeder.training.loop.train_step`` clips each rank's gradient before this runs (per-rank clipping; with one
    worker this is exactly the Ray-free run's clipping).

    ``delayed`` (``train.delayed_allreduce``): the step's gradients are all-reduced in the background
    and the step applies the previous step's average instead. A synchronous all-reduce makes every step
    as slow as the slower rank's, and on a shared CPU identical steps vary by about 14%, which costs
    throughput with two ranks (benchmarks/RESULTS.md); with one step of slack a rank only waits when it falls a
    whole step behind. The first step has no average yet: its gradients are cleared, and the optimiser
    skips parameters without one, so it changes nothing. A checkpoint does not keep the gradient in
    flight, so a resumed run skips one step again. ``finish()`` waits for the last all-reduce: a process
    group must not be torn down under one."""

    def __init__(self, model, world: int, delayed: bool):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.world, self.delayed = world, delayed
        self.in_flight = None  # (all-reduce handle, its buffer) of the previous step

    def __call__(self, optimizer, args, kwargs) -> None:
        import torch
        import torch.distributed as dist

        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])
        if not self.delayed:
            dist.all_reduce(flat)
            self._apply(flat)
            return
        averaged = self.finish()
        self.in_flight = (dist.all_reduce(flat, async_op=True), flat)
        if averaged is None:
            for p in self.params:
                p.grad = None
        else:
            self._apply(averaged)

    def finish(self):
        """Wait for the all-reduce in flight, if any; its summed gradients (or None)."""
        if self.in_flight is None:
            return None
        (handle, flat), self.in_flight = self.in_flight, None
        handle.wait()
        return flat

    def _apply(self, summed) -> None:
        summed /= self.world
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = summed[offset : offset + n].view_as(p).clone()
            offset += n


def _mean_over_ranks(values: dict[str, float], device) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, tensor.tolist())}


def _wait_for_registration(experiment_dir: str, checkpoint_dir_name: str, timeout: float = 60.0) -> None:
    """Test hook helper: wait until Ray's snapshot lists the checkpoint, so a kill right after it
    leaves a resumable run (local storage only)."""
    snapshot = Path(experiment_dir) / SNAPSHOT_FILE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if snapshot.is_file() and checkpoint_dir_name in snapshot.read_text():
            return
        time.sleep(0.2)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train worker: restore or build the state, then ``seeder.training.loop.fit`` on this rank's slice of
    each epoch, with the gradient and metric averages over ranks; rank 0 validates, logs to MLflow
    and reports a checkpoint per epoch."""
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    from seeder.policy import checkpoint as ckpt
    from seeder.training import loop as lib

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    config = from_dict(SeederConfig, loop_config["config"])
    if loop_config.get("torch_threads"):
        torch.set_num_threads(int(loop_config["torch_threads"]))  # Ray gives workers OMP_NUM_THREADS=1
    device = ray.train.torch.get_device()
    # Which node each rank runs on, in the job's log: on a cluster, the way to see the work spread.
    print(f"train: rank {rank} of {world} on node {ray.get_runtime_context().get_node_id()}", flush=True)

    every = open_all(loop_config["artifacts"])
    train_data = query_data(every, "train")
    val_data = query_data(every, "val") if rank == 0 else None

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = lib.load_state(Path(directory) / CHECKPOINT_DIR)
        if rank == 0:
            print(f"resumed from checkpoint after epoch {state.epoch} ({checkpoint.path})", flush=True)
    else:
        state = lib.build_state(
            config,
            train_data.feature_dim,
            lib.steps_per_epoch(train_data, config, world),
            ckpt.graphs_record(every, loop_config["artifacts"].split(",")),
        )
    # Device placement only: see GradientAverage for why not DDP's wrapper.
    state.model = ray.train.torch.prepare_model(state.model, parallel_strategy=None)
    for slot in state.optimizer.state.values():  # a restored optimiser's moments follow the model
        for key, value in slot.items():
            if isinstance(value, torch.Tensor) and key != "step":
                slot[key] = value.to(device)
    gradient_average = None
    if world > 1:
        for tensor in state.model.state_dict().values():
            dist.broadcast(tensor, src=0)  # identical start on every rank, whatever the seeding
        gradient_average = GradientAverage(state.model, world, config.train.delayed_allreduce)
        state.optimizer.register_step_pre_hook(gradient_average)

    run = None
    if rank == 0 and loop_config.get("mlflow_run_id"):
        from seeder import tracking

        run = tracking.TrainingRun.attach(loop_config["mlflow_run_id"], loop_config["mlflow_uri"])
    exit_after = int(loop_config.get("exit_after_epoch") or 0)

    def report(state: lib.TrainState, metrics: dict[str, Any], improved: bool) -> None:
        name = f"epoch_{state.epoch:04d}"
        if rank == 0:
            if run is not None:
                run.log_epoch(metrics)
            print(lib.epoch_line(metrics, config.train.epochs), flush=True)
            with tempfile.TemporaryDirectory() as directory:
                lib.save_state(state, Path(directory) / CHECKPOINT_DIR)
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory), checkpoint_dir_name=name)
        else:
            ray.train.report(metrics, checkpoint=None, checkpoint_dir_name=name)
        if exit_after and state.epoch == exit_after and rank == 0:
            if loop_config.get("experiment_dir") and not is_uri(loop_config["experiment_dir"]):
                _wait_for_registration(loop_config["experiment_dir"], name)
            print(f"{EXIT_AFTER_EPOCH_ENV}={exit_after}: exiting after epoch {exit_after}", flush=True)
            os._exit(3)

    average = (lambda values: _mean_over_ranks(values, device)) if world > 1 else None
    progress = lib.epoch_progress(state) if rank == 0 else None  # one line per ~30 s with the epoch's ETA
    lib.fit(state, train_data, val_data, report, rank=rank, world=world, average=average, progress=progress)
    if gradient_average is not None:
        gradient_average.finish()


# -- the driver ---------------------------------------------------------------------------------------


def run_training(
    config: SeederConfig,
    artifacts: str,
    *,
    storage: str,
    name: str,
    num_workers: int = 2,
    use_gpu: bool = False,
    cpus_per_worker: float = 1.0,
    max_failures: int = 0,
    mlflow_run_id: str | None = None,
    mlflow_uri: str | None = None,
    exit_after_epoch: int = 0,
):
    """Run the TorchTrainer and return Ray's ``Result`` (raises ``ray.train.TrainingFailedError``).

    Usable inside a Tune trial (a function trainable that needs several workers starts this; give the
    trial a small CPU share and ``cpus_per_worker`` the rest). Ray must be initialised by the caller."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from pipelines.torch_loopback import LoopbackTorchConfig

    loop_config = {
        "config": to_dict(config),
        "artifacts": artifacts,
        "mlflow_run_id": mlflow_run_id,
        "mlflow_uri": mlflow_uri,
        "exit_after_epoch": exit_after_epoch,
        "experiment_dir": experiment_path(storage, name),
        "torch_threads": max(1, int(cpus_per_worker)),
    }
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        torch_config=LoopbackTorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus_per_worker}),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            # The latest checkpoint carries the best weights so far (seeder.training.loop.save_state), so the
            # two latest are all a run needs, to resume and to export its best model.
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=max_failures),
            # Ray Train's INFO lines (worker group start, process group set-up) stay in its log files.
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )
    return trainer.fit()


def final_state(result, where: str):
    """The training state of a finished Ray Train run's latest checkpoint (it carries the best weights)."""
    from seeder.training import loop as lib

    if result.checkpoint is None:
        raise DataError(f"{where}: the run reported no checkpoint")
    with result.checkpoint.as_directory() as directory:
        return lib.load_state(Path(directory) / CHECKPOINT_DIR)


def finish_run(result, job: TrainingJob, run=None) -> dict[str, Any]:
    """Write the best model to OUT/model, the history and the curve, and hand the model and the plot
    to the MLflow run."""
    from seeder.policy import checkpoint as ckpt
    from seeder.training import loop as lib

    state = final_state(result, experiment_path(job.storage, job.name))
    job.out.mkdir(parents=True, exist_ok=True)
    model_dir = lib.export_best(state, job.out / ckpt.MODEL_DIR)
    (job.out / "history.json").write_text(json.dumps(state.history, indent=2))
    tracking.plot_training_curves(state.history, job.out / "training_curve.png")
    best_row = state.history[state.best_epoch - 1] if state.best_epoch else state.history[-1]
    summary = {
        "best_epoch": state.best_epoch,
        "best_val_recall_at_20": best_row.get("val_recall_at_20", float("nan")),
        "best_val_mrr": best_row.get("val_mrr", float("nan")),
        "epochs": len(state.history),
        "best": str(model_dir),
    }
    if run is not None:
        run.finish(model_dir, state.history)  # the model's description records its epoch and metrics
    return summary


def local_shortfall(resources: dict, num_workers: int, use_gpu: bool, cpus_per_worker: float) -> str | None:
    """Why an embedded local Ray (``resources``: its ``cluster_resources()``) cannot place every worker,
    or None. Ray Train would wait for the missing resources forever; a cluster may still scale up, so
    only the local case is checked."""
    gpus, cpus = int(resources.get("GPU", 0)), float(resources.get("CPU", 0))
    if use_gpu and gpus < num_workers:
        return (
            f"--use-gpu with {num_workers} worker(s) needs {num_workers} GPU(s) and this machine has {gpus}; "
            f"pass --num-workers {gpus}"
            if gpus
            else "--use-gpu: this machine has no GPU that Ray can see; drop --use-gpu"
        )
    if num_workers * cpus_per_worker > cpus:
        return (
            f"{num_workers} worker(s) x {cpus_per_worker:g} CPU(s) need {num_workers * cpus_per_worker:g} CPUs and the "
            f"local Ray has {cpus:g}; lower --num-workers or --cpus-per-worker"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python pipelines/train.py", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--artifacts",
        required=True,
        action="append",
        help="preprocessing artifacts directory or URI; repeat it to train one model on several "
        "graphs (each built with reduce.dim=0 and the same encoder)",
    )
    parser.add_argument("--config", help="YAML config (model/train/eval sections); preprocessing ones come from the artifacts")
    parser.add_argument("--num-workers", type=int, default=2, help="training workers (data-parallel ranks)")
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs reserved per worker (also its torch threads)")
    parser.add_argument("--out", default="runs/train", help="run directory: model/ (the best model), history, plot")
    parser.add_argument("--experiment", default="seeder-train", help="MLflow experiment")
    parser.add_argument("--storage", help="Ray Train storage path or URI (default OUT/ray)")
    parser.add_argument("--name", help="Ray Train run name under the storage (default 'train')")
    parser.add_argument("--resume", action="store_true", help="continue the run under STORAGE/NAME from its last checkpoint")
    parser.add_argument("--max-failures", type=int, default=1, help="worker failures retried from the last checkpoint")
    parser.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    add_ray_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. train.epochs=3 model.hidden_dim=64")
    args = parser.parse_args(argv)
    try:
        job = prepare_job(
            args.artifacts, args.config, args.overrides, args.out, args.num_workers, args.storage, args.name, args.resume
        )
        exit_after = int(os.environ.get(EXIT_AFTER_EPOCH_ENV, "0") or 0)
    except (DataError, ConfigError, ValueError) as exc:
        print(f"pipelines/train.py: error: {exc}", file=sys.stderr)
        return 2
    job.out.mkdir(parents=True, exist_ok=True)
    print(
        f"training on {job.trainable:,} trainable queries ({job.val_queries:,} val), {args.num_workers} "
        f"worker(s), {job.config.train.epochs} epochs; Ray run {experiment_path(job.storage, job.name)}; "
        f"{len(job.config.train.expansion_sizes)} expansion steps of {job.config.train.expansion_sizes} nodes "
        f"(frontier caps {job.config.train.frontier_caps})",
        flush=True,
    )
    run = None
    if not args.no_mlflow:
        run = tracking.TrainingRun.start(
            args.experiment,
            job.out.name,
            job.out,
            args.resume,
            job.config,
            extra={
                "run.driver": "pipelines/train.py",
                "run.num_workers": args.num_workers,
                "run.use_gpu": args.use_gpu,
                "run.artifacts": job.artifacts,
            },
        )
        print(f"MLflow run {run.run_id} in experiment '{args.experiment}' at {tracking.tracking_uri()}", flush=True)
    local = cluster_address(args.ray_address) is None
    try:
        ray = start_ray(args.ray_address, args.num_cpus, who="train")
    except RuntimeError as exc:
        print(f"pipelines/train.py: error: {exc}", file=sys.stderr)
        return 1
    if run is not None:
        try:
            check_tracking_reaches_workers(ray, tracking.tracking_uri())
        except DataError as exc:
            print(f"pipelines/train.py: error: {exc}", file=sys.stderr)
            run.fail(str(exc))
            return 2
    if local:
        problem = local_shortfall(ray.cluster_resources(), args.num_workers, args.use_gpu, args.cpus_per_worker)
        if problem:
            print(f"pipelines/train.py: error: {problem}", file=sys.stderr)
            if run is not None:
                run.fail(problem)
            return 2
    import ray.train

    try:
        result = run_training(
            job.config,
            job.artifacts,
            storage=job.storage,
            name=job.name,
            num_workers=args.num_workers,
            use_gpu=args.use_gpu,
            cpus_per_worker=args.cpus_per_worker,
            max_failures=args.max_failures,
            mlflow_run_id=run.run_id if run else None,
            mlflow_uri=run.uri if run else None,
            exit_after_epoch=exit_after,
        )
    except ray.train.TrainingFailedError as exc:
        print(
            f"pipelines/train.py: training failed: {exc}\nrerun the same command with --resume to continue "
            "from the last checkpoint",
            file=sys.stderr,
        )
        return 1
    summary = finish_run(result, job, run)
    print(
        f"best epoch {summary['best_epoch']} (val recall@20 {summary['best_val_recall_at_20']:.4f}, "
        f"mrr {summary['best_val_mrr']:.4f}) -> "
        f"{summary['best']}; evaluate: seeder evaluate --method seeder --model {summary['best']} --artifacts {job.artifacts.split(',')[0]}"
    )
    if run is not None:
        print(f"MLflow run {run.run_id}: model runs:/{run.run_id}/model; open the UI with: {tracking.ui_hint()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
