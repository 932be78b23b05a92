"""Hyperparameter sweep on Ray Tune: Optuna TPE + ASHA, one MLflow parent run, one child run per trial.

    python tune/sweep.py --artifacts A [--config FILE] --num-samples N [--max-concurrent K]
        [--gpus-per-trial G] [--space FILE] [--epochs E] [--name NAME] [--storage PATH_OR_URI]
        [--resume] [KEY=VALUE ...]

Each trial trains the policy epoch by epoch (``seeder.training.sweep.run_trial``) and reports validation
Recall@20 (``seeder.training.sweep.METRIC``) so that ASHA stops weak trials early. At the end, the best trial
by that metric is registered as ``seeder-<artifacts dir name>`` with alias ``champion``, evaluated on
the test split through ``models:/...@champion`` (the same path as ``seeder evaluate``), and the parent
run receives its test metrics, the results table and the plots. ``--resume`` continues an interrupted
sweep of the same ``--name`` without rerunning finished trials. The Ray-free pieces live in
``seeder.training.sweep``; this file only wires them into Ray Tune.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.fs as pafs

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# Persist the experiment state often, so that an interruption loses at most a few seconds of it.
os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")

from pipelines.ray_runtime import add_ray_arguments, check_tracking_reaches_workers, start_ray
from seeder.cli.arguments import HelpFormatter
from seeder.config import ConfigError, SeederConfig, from_dict, to_dict, training_config
from seeder.system.io import DataError
from seeder.system.storage import basename, filesystem, is_uri
from seeder.training import sweep as sw

STATE_FILE = "seeder_sweep.json"  # parent run id, experiment and space of the sweep, for --resume


def ray_space(space: dict[str, sw.Dimension]) -> dict:
    from ray import tune

    out = {}
    for key, dim in space.items():
        if dim.kind == "choice":
            out[key] = tune.choice(list(dim.values))
        elif dim.kind == "uniform":
            out[key] = tune.uniform(dim.low, dim.high)
        elif dim.kind == "loguniform":
            out[key] = tune.loguniform(dim.low, dim.high)
        else:
            out[key] = tune.randint(int(dim.low), int(dim.high) + 1)  # randint's upper end is exclusive
    return out


def tune_state_saved(experiment: str) -> bool:
    """Whether Tune has saved the experiment's state (``experiment_state-*.json``) in its directory (a
    path or URI). A sweep killed before the first save, a few seconds in, has none: ``Tuner.restore``
    would then find its tuner but start over with a searcher that has lost its space."""
    try:
        fs, root = filesystem(experiment)
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except (ValueError, OSError):  # a location pyarrow cannot list: leave the decision to Tune
        return True
    return any(i.base_name.startswith("experiment_state-") and i.base_name.endswith(".json") for i in infos)


def clear_experiment(experiment: str) -> None:
    """Remove what a sweep killed before Tune's first save left in its directory, so that it starts over."""
    fs, root = filesystem(experiment)
    if fs.get_file_info(root).type != pafs.FileType.NotFound:
        fs.delete_dir(root)


def name_of(trial) -> str:
    """``t003-h32-l3-lr1e-3-d0.1``, used as both trial name and trial directory name.

    The number is Tune's running trial counter (the ``3_...`` of ``trial.experiment_tag``; Ray's
    trial ids are random hex), which is saved with the searcher, so a resumed sweep goes on counting.
    Stateless on purpose: Tune calls this on copies of the config.
    """
    head = str(getattr(trial, "experiment_tag", "")).split("_", 1)[0]
    index = int(head) - 1 if head.isdigit() else 0
    return sw.trial_name(index, trial.config)


class InterruptWatch(logging.Handler):
    """Notices Tune's "Experiment has been interrupted" warning: after Ctrl-C, ``Tuner.fit`` returns
    normally and the interrupted trials look terminated, so this is the one reliable sign."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen = False

    def emit(self, record: logging.LogRecord) -> None:
        if "has been interrupted" in record.getMessage():
            self.seen = True


def distributed_trial(
    config: SeederConfig, artifacts_path: str, run, workers: int, use_gpu: bool, cpus_per_worker: float
) -> None:
    """A trial on several workers: Ray Train's TorchTrainer inside the trial (pipelines/train.py).

    Its workers log each epoch to the trial's child run; the epochs reach Tune only when training
    ends (Ray Train keeps them), so ASHA cannot stop such a trial early.
    """
    from ray import tune

    from pipelines import train as ray_train
    from seeder.training import loop as lib

    result = ray_train.run_training(
        config,
        artifacts_path,
        storage=tune.get_context().get_trial_dir(),
        name="train",
        num_workers=workers,
        use_gpu=use_gpu,
        cpus_per_worker=cpus_per_worker,
        mlflow_run_id=run.run_id,
        mlflow_uri=run.uri,
    )
    state = ray_train.final_state(result, "trial")
    with tempfile.TemporaryDirectory() as directory:
        run.log_model(lib.export_best(state, Path(directory) / "model"))
    for row in result.metrics_dataframe.to_dict("records"):
        tune.report(row)


def trainable(
    params: dict, *, artifacts_path: str, base_config: dict, tracking: dict, cpus: float, gpus: float, workers: int = 1
) -> None:
    """One trial: a child MLflow run, then ``run_trial`` reporting each epoch to Tune."""
    import ray
    import torch
    from ray import tune

    from seeder import tracking as mlflow_runs
    from seeder.policy.checkpoint import artifacts_record
    from seeder.policy.inference import QueryData
    from seeder.preprocessing.artifacts import open_artifacts
    from seeder.training import loop as lib

    torch.set_num_threads(max(1, int(cpus)))  # Ray sets OMP_NUM_THREADS=1 in trial actors
    name = tune.get_context().get_trial_name()  # name_of's t003-h32-l3-lr1e-3-d0.1
    run = None
    try:
        config = sw.apply_params(from_dict(SeederConfig, base_config), params)
        run = mlflow_runs.TrainingRun.child(
            tracking["uri"], tracking["experiment_id"], tracking["parent_run_id"], name, config, sw.trial_params(params)
        )
        if workers > 1:
            distributed_trial(config, artifacts_path, run, workers, gpus > 0, cpus)
            run.finish(None, [])
            return
        artifacts = open_artifacts(artifacts_path)
        train_data = QueryData.from_artifacts(artifacts, "train")
        val_data = QueryData.from_artifacts(artifacts, "val")
        checkpoint = tune.get_checkpoint()

        node = ray.get_runtime_context().get_node_id()  # kept in the trial's record: where it ran

        def report(metrics: dict, checkpoint_dir: Path) -> None:
            run.log_epoch(metrics)
            if int(metrics["epoch"]) >= config.train.epochs:
                # Tune ends a trial that reaches max_t inside this last report: mark it finished first,
                # or an interrupted sweep would leave completed trials RUNNING in MLflow.
                run.finish(None, [])
            tune.report({**metrics, "node": node}, checkpoint=tune.Checkpoint.from_directory(str(checkpoint_dir)))

        def log_best(state) -> None:
            with tempfile.TemporaryDirectory() as directory:
                run.log_model(lib.export_best(state, Path(directory) / "model"))

        record = artifacts_record(artifacts)
        if checkpoint is not None:
            with checkpoint.as_directory() as resume_dir:
                sw.run_trial(config, train_data, val_data, report, Path(resume_dir), on_best=log_best, artifacts=record)
        else:
            sw.run_trial(config, train_data, val_data, report, on_best=log_best, artifacts=record)
        run.finish(None, [])
    except BaseException as exc:
        # ASHA stopping a trial ends its thread from inside tune.report: not a failure (the driver
        # marks such runs FINISHED with seeder.stopped_early); anything else is.
        if run is not None and isinstance(exc, Exception):
            run.fail(f"{type(exc).__name__}: {exc}")
        raise


def collect(result_grid, epochs: int) -> list[dict]:
    """One record per trial: name, status (FINISHED / STOPPED_EARLY / FAILED), epochs, best metric, params."""
    records = []
    for result in result_grid:
        frame = result.metrics_dataframe
        done = 0 if frame is None or frame.empty else int(frame["training_iteration"].max())
        best = None
        if frame is not None and not frame.empty and sw.METRIC in frame:
            values = frame[sw.METRIC].dropna()
            best = float(values.max() if sw.MODE == "max" else values.min()) if len(values) else None
        status = "FAILED" if result.error else ("FINISHED" if done >= epochs else "STOPPED_EARLY")
        params = {k: v for k, v in (result.config or {}).items()}
        node = None if frame is None or frame.empty or "node" not in frame else str(frame["node"].dropna().iloc[-1])
        records.append(
            {
                "trial": Path(result.path).name,
                "status": status,
                "epochs": done,
                sw.METRIC: best,
                "error": str(result.error) if result.error else None,
                "node": node,
                **params,
            }
        )
    return records


def finish_child_runs(client, experiment_id: str, parent_run_id: str, records: list[dict]) -> dict[str, str]:
    """Each trial's child run gets its final status; returns trial name -> run id."""
    from seeder.tracking import find_child_runs

    runs = {r.data.tags.get("seeder.trial"): r for r in find_child_runs(client, experiment_id, parent_run_id)}
    ids = {}
    for record in records:
        run = runs.get(record["trial"])
        if run is None:
            continue
        ids[record["trial"]] = run.info.run_id
        client.set_tag(run.info.run_id, "seeder.status", record["status"])
        if record["status"] == "FAILED":
            if run.info.status != "FAILED":
                client.set_terminated(run.info.run_id, status="FAILED")
        elif run.info.status != "FINISHED":
            client.set_terminated(run.info.run_id, status="FINISHED")
    return ids


def mark_interrupted_runs(client, experiment_id: str, parent_run_id: str, result_grid) -> int:
    """After Ctrl-C, make MLflow agree with the state Tune saved; returns the number of trials done.

    A trial closes its child run just before its last report, so Ctrl-C in between leaves a run
    FINISHED that Tune saved as unfinished and will resume from its checkpoint. Such runs, and those
    the interrupt cut short, become KILLED (``seeder.status`` INTERRUPTED) until the sweep resumes.
    The in-memory trials look terminated once Tune has stopped them, so the saved state is read back.
    """
    from ray import tune

    from seeder.tracking import find_child_runs

    saved = tune.ExperimentAnalysis(result_grid.experiment_path, storage_filesystem=result_grid.filesystem).trials
    unfinished = {str(t) for t in saved if t.status not in ("TERMINATED", "ERROR")}
    for run in find_child_runs(client, experiment_id, parent_run_id):
        if run.data.tags.get("seeder.trial") in unfinished and run.info.status != "KILLED":
            client.set_tag(run.info.run_id, "seeder.status", "INTERRUPTED")
            client.set_terminated(run.info.run_id, status="KILLED")
    return sum(t.status == "TERMINATED" for t in saved)


def evaluate_champion(artifacts, champion: str, client, parent_run_id: str, child_run_id: str) -> dict[str, float]:
    """Evaluate ``champion`` on the test split (the val split when the artifacts have no test queries)
    exactly as ``seeder evaluate --method seeder --split S --model models:/NAME@champion`` does, and log
    the overall metrics as ``test_*`` (or ``champion_val_*``) on the parent and the champion's run."""
    from seeder.evaluation.evaluate import format_table, run_evaluation

    split = "test" if len(artifacts.subgraphs("test")) else "val"
    if split == "val":
        print("the artifacts have no test split: the champion is evaluated on the whole val split", file=sys.stderr)
    report = run_evaluation(artifacts, ["seeder"], split, artifacts.config, model=champion)
    prefix = "test_" if split == "test" else "champion_val_"
    overall = report["methods"]["seeder"]["all"]
    metrics = {f"{prefix}{k}": float(v) for k, v in overall.items() if isinstance(v, (int, float)) and k != "queries"}
    for run_id in (parent_run_id, child_run_id):
        for key, value in metrics.items():
            client.log_metric(run_id, key, value)
    client.set_tag(parent_run_id, "seeder.champion_eval_split", split)
    print(format_table(report, artifacts.config.eval.ks))
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tune/sweep.py", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--artifacts", required=True, help="preprocessing artifacts directory or URI (s3://, file://)")
    parser.add_argument("--config", help="YAML config (model/train/eval sections); preprocessing keys come from the artifacts")
    parser.add_argument("--num-samples", type=int, default=8, help="trials to run (default 8)")
    parser.add_argument("--max-concurrent", type=int, default=2, help="trials at a time (default 2)")
    parser.add_argument(
        "--cpus-per-trial", type=float, default=1.0, help="CPUs reserved per trial; torch threads match (default 1)"
    )
    parser.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial; above 1, one Ray Train worker per GPU")
    parser.add_argument(
        "--workers-per-trial",
        type=int,
        default=1,
        help="Ray Train workers per trial (default 1: the trial trains in-process); --gpus-per-trial G > 1 implies G",
    )
    parser.add_argument("--space", help="YAML space file extending the default space (e.g. configs/sweep_space_extended.yaml)")
    parser.add_argument("--epochs", type=int, help="epochs per trial (ASHA's max_t); default train.epochs")
    parser.add_argument("--grace-epochs", type=int, default=1, help="epochs every trial gets before ASHA may stop it")
    parser.add_argument("--queries-per-epoch", type=int, help="train.queries_per_epoch: training queries sampled per epoch")
    parser.add_argument("--val-queries", type=int, help="train.val_queries: validation queries evaluated per epoch")
    parser.add_argument("--name", help="sweep name (default sweep-<artifacts dir name>); also the Ray experiment directory")
    parser.add_argument("--storage", default="runs/sweeps", help="Ray Tune storage path or URI (default runs/sweeps)")
    parser.add_argument("--experiment", default="seeder-sweeps", help="MLflow experiment (default seeder-sweeps)")
    parser.add_argument("--model-name", help="registered model name (default seeder-<artifacts dir name>)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Optuna sampler")
    parser.add_argument("--resume", action="store_true", help="continue the interrupted sweep --name in --storage")
    add_ray_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. train.batch_size=8")
    args = parser.parse_args(argv)
    try:
        return run_sweep(args)
    except (DataError, ConfigError) as exc:
        print(f"tune/sweep.py: error: {exc}", file=sys.stderr)
        return 2


def run_sweep(args: argparse.Namespace) -> int:
    from seeder import tracking
    from seeder.preprocessing.artifacts import open_artifacts

    artifacts = open_artifacts(args.artifacts)
    # Trials run in their own directories and open the artifacts again: absolute, or the URI as given.
    artifacts_path = args.artifacts if is_uri(args.artifacts) else str(Path(args.artifacts).resolve())
    dataset_name = basename(args.artifacts)
    overrides = list(args.overrides)
    if args.epochs:
        overrides.append(f"train.epochs={args.epochs}")
    if args.queries_per_epoch is not None:
        overrides.append(f"train.queries_per_epoch={args.queries_per_epoch}")
    if args.val_queries is not None:
        overrides.append(f"train.val_queries={args.val_queries}")
    config = training_config(artifacts.config, args.config, overrides, artifacts.step_budget)
    space = sw.load_space(args.space)
    name = args.name or f"sweep-{dataset_name}"
    model_name = args.model_name or f"seeder-{dataset_name}"
    storage = args.storage if "://" in args.storage else str(Path(args.storage).resolve())
    experiment_dir = Path(storage) / name if "://" not in storage else None

    experiment_id = tracking.setup(args.experiment)
    uri = tracking.tracking_uri()
    client = tracking.client(uri)
    state_path = experiment_dir / STATE_FILE if experiment_dir else None

    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    check_tracking_reaches_workers(start_ray(args.ray_address, args.num_cpus, who="sweep"), uri)
    experiment = str(experiment_dir) if experiment_dir else f"{storage}/{name}"
    resuming = args.resume and tune.Tuner.can_restore(experiment) and tune_state_saved(experiment)
    if args.resume and not resuming:
        print(f"nothing to resume at {storage}/{name}; starting the sweep", file=sys.stderr)
        if state_path and state_path.is_file():  # the parent run of a sweep that died before saving anything
            client.update_run(json.loads(state_path.read_text())["parent_run_id"], status="KILLED")
        clear_experiment(experiment)
    if resuming and state_path and state_path.is_file():
        state = json.loads(state_path.read_text())
        parent_run_id = state["parent_run_id"]
        client.update_run(parent_run_id, status="RUNNING")
        print(f"resuming sweep {name} (MLflow parent run {parent_run_id})", file=sys.stderr)
    else:
        if experiment_dir and experiment_dir.exists() and not args.resume:
            raise ConfigError(f"sweep {name} already exists in {storage}; pass --resume to continue it or another --name")
        parent = client.create_run(
            experiment_id, run_name=name, tags={"seeder.kind": "sweep", "seeder.preprocessing.artifacts": artifacts_path}
        )
        parent_run_id = parent.info.run_id
        client.log_param(parent_run_id, "num_samples", args.num_samples)
        client.log_param(parent_run_id, "max_concurrent", args.max_concurrent)
        client.log_param(parent_run_id, "epochs", config.train.epochs)
        client.log_param(parent_run_id, "metric", f"{sw.METRIC} ({sw.MODE})")
        client.log_param(
            parent_run_id, "space", json.dumps({k: [d.kind, list(d.values) or [d.low, d.high]] for k, d in space.items()})[:6000]
        )
        if state_path:
            state_path.parent.mkdir(parents=True, exist_ok=True)
            state_path.write_text(json.dumps({"parent_run_id": parent_run_id, "experiment_id": experiment_id}))

    workers = max(args.workers_per_trial, int(args.gpus_per_trial) if args.gpus_per_trial > 1 else 1)
    if workers > 1:
        # The trial itself only waits on its TorchTrainer, whose workers reserve their own CPUs/GPUs
        # (a trial given {"cpu": 0} fails: STACK.md).
        resources = {"cpu": 0.1}
    else:
        resources = {"cpu": args.cpus_per_trial}
        if args.gpus_per_trial:
            resources["gpu"] = args.gpus_per_trial
    fn = tune.with_resources(
        tune.with_parameters(
            trainable,
            artifacts_path=artifacts_path,
            base_config=to_dict(config),
            tracking={"uri": uri, "experiment_id": experiment_id, "parent_run_id": parent_run_id},
            cpus=args.cpus_per_trial,
            gpus=args.gpus_per_trial,
            workers=workers,
        ),
        resources,
    )
    started = time.perf_counter()
    if resuming:
        tuner = tune.Tuner.restore(
            experiment,
            trainable=fn,
            resume_errored=False,
            restart_errored=False,
        )
    else:
        searcher = ConcurrencyLimiter(OptunaSearch(seed=args.seed), max_concurrent=args.max_concurrent)
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=config.train.epochs,
            grace_period=max(1, min(args.grace_epochs, config.train.epochs)),
            reduction_factor=2,
        )
        tuner = tune.Tuner(
            fn,
            param_space=ray_space(space),
            tune_config=tune.TuneConfig(
                metric=sw.METRIC,
                mode=sw.MODE,
                search_alg=searcher,
                scheduler=scheduler,
                num_samples=args.num_samples,
                max_concurrent_trials=args.max_concurrent,
                trial_name_creator=name_of,
                trial_dirname_creator=name_of,
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=storage,
                failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                verbose=1,
            ),
        )
    interrupted = InterruptWatch()
    logging.getLogger("ray.tune.tune").addHandler(interrupted)
    result_grid = tuner.fit()
    seconds = time.perf_counter() - started
    if interrupted.seen or result_grid.num_terminated + result_grid.num_errors < max(len(result_grid), args.num_samples):
        # Ctrl-C (or SIGTERM): Tune saved its state; finished trials are kept and are not rerun.
        done = mark_interrupted_runs(client, experiment_id, parent_run_id, result_grid)
        print(
            f"sweep {name} interrupted after {seconds:.0f} s with {done} trials done; "
            f"continue it with: python tune/sweep.py --artifacts {args.artifacts} --name {name} "
            f"--storage {storage} --resume",
            file=sys.stderr,
        )
        ray.shutdown()
        return 130
    records = collect(result_grid, config.train.epochs)
    run_ids = finish_child_runs(client, experiment_id, parent_run_id, records)
    for record in records:
        record["mlflow_run_id"] = run_ids.get(record["trial"])
    counts = {s: sum(r["status"] == s for r in records) for s in ("FINISHED", "STOPPED_EARLY", "FAILED")}
    client.log_metric(parent_run_id, "sweep_seconds", seconds)
    for status, count in counts.items():
        client.log_metric(parent_run_id, f"trials_{status.lower()}", count)
    print(f"sweep {name}: {len(records)} trials in {seconds:.0f} s: " + ", ".join(f"{v} {k.lower()}" for k, v in counts.items()))
    for record in records:
        print(f"trial {record['trial']} ran on node {record['node']}")

    with tempfile.TemporaryDirectory() as tmp:
        report = sw.write_report(records, space, Path(tmp))
        print(sw.to_markdown(report["table"]))
        if report["importances"]:
            print("parameter importances: " + ", ".join(f"{k} {v:.2f}" for k, v in report["importances"].items()))
        client.log_artifacts(parent_run_id, tmp, "sweep")

    candidates = [r for r in records if r["status"] != "FAILED" and r[sw.METRIC] is not None and r["mlflow_run_id"]]
    if not candidates:
        client.set_terminated(parent_run_id, status="FAILED")
        print("no trial completed an epoch: nothing to register", file=sys.stderr)
        return 1
    best = max(candidates, key=lambda r: r[sw.METRIC] if sw.MODE == "max" else -r[sw.METRIC])
    version = tracking.register_model(best["mlflow_run_id"], model_name, alias="champion")
    champion = f"models:/{model_name}@champion"
    client.set_tag(parent_run_id, "seeder.champion_trial", best["trial"])
    client.set_tag(parent_run_id, "seeder.champion_run_id", best["mlflow_run_id"])
    client.set_tag(parent_run_id, "seeder.champion_model", f"{champion} (version {version})")
    client.log_metric(parent_run_id, f"best_{sw.METRIC}", best[sw.METRIC])
    print(
        f"champion: {best['trial']} ({sw.METRIC} {best[sw.METRIC]:.4f}) registered as {model_name} version {version}, alias champion"
    )

    evaluate_champion(artifacts, champion, client, parent_run_id, best["mlflow_run_id"])
    client.set_terminated(parent_run_id, status="FINISHED")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
