"""Ray Train against one process, per core: the training command's trajectories/s on W one-thread
workers over the single-process trainer's on W threads, the same cores, config and questions.

    python benchmarks/bench_ray_train.py --artifacts runs/metaqa/artifacts --config configs/metaqa.yaml [--rounds 3]

Each round runs the two, one after the other, so that a machine whose speed drifts weighs on both alike:

- ``pipelines/train.py --num-workers W --cpus-per-worker 1 --no-mlflow train.epochs=E``: its epochs'
  trajectories/s from ``OUT/history.json`` (measured inside each epoch: Ray's start-up, validation and
  checkpoints are left out);
- ``benchmarks/bench_train.py --artifacts A --threads W --steps S``: the trainer's step in one process.

Both use W cores, so the ratio of their trajectories/s is the per-core ratio. The benchmark prints every
round and the median of the rounds' ratios (goal >= 1.0: the workers at least as fast per core). The
commands' full output goes to a log folder whose path is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from measure import run_logged

from seeder.system.progress import Progress

GOAL = 1.0


def ray_rate(args, workdir: Path, log: Path) -> list[float]:
    """Trajectories/s of each epoch of one ``pipelines/train.py`` run (all workers together)."""
    out = workdir / "train"
    command = [
        sys.executable,
        "pipelines/train.py",
        "--artifacts",
        args.artifacts,
        "--out",
        str(out),
        "--no-mlflow",
        "--num-workers",
        str(args.workers),
        "--cpus-per-worker",
        "1",
    ]
    command += (["--config", args.config] if args.config else []) + [f"train.epochs={args.epochs}", *args.overrides]
    run_logged(command, log)
    history = json.loads((out / "history.json").read_text())
    return [float(row["trajectories_per_second"]) for row in history]


def process_rate(args, workdir: Path, log: Path) -> float:
    """Trajectories/s of the trainer's step in one process on ``--workers`` threads."""
    figures = workdir / "bench_train.json"
    command = [
        sys.executable,
        "benchmarks/bench_train.py",
        "--artifacts",
        args.artifacts,
        "--threads",
        str(args.workers),
        "--steps",
        str(args.steps),
        "--reference-queries",
        "0",
        "--json",
        str(figures),
    ]
    command += (["--config", args.config] if args.config else []) + list(args.overrides)
    run_logged(command, log)
    return float(json.loads(figures.read_text())["trajectories_per_second"][0])


def summary(rounds: list[tuple[list[float], float]]) -> tuple[float, list[float]]:
    """The median over the rounds of (mean epoch trajectories/s of the Ray run) / (the process's), and
    each round's ratio."""
    ratios = [float(np.mean(epochs)) / single for epochs, single in rounds]
    return float(np.median(ratios)), ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", required=True, help="preprocessing artifacts directory")
    parser.add_argument("--config", help="YAML config with model/train keys (both commands get it)")
    parser.add_argument(
        "--workers", type=int, default=2, help="Ray Train workers of one CPU and thread each; the process gets as many threads"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of one Ray run and one process run")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each Ray run (each one's figure counts)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each process run")
    parser.add_argument("--logs", help="folder for the commands' output (default: a new temporary folder)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for both, e.g. train.batch_size=16")
    args = parser.parse_args()
    if not Path(args.artifacts).is_dir():
        raise SystemExit(
            f"--artifacts {args.artifacts}: no such directory; run pipelines/preprocess.py --out {args.artifacts} first"
        )
    args.artifacts = str(Path(args.artifacts).resolve())
    args.config = str(Path(args.config).resolve()) if args.config else None
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="bench_ray_train_"))
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"{args.workers} Ray Train workers x 1 thread against one process x {args.workers} threads; "
        f"{args.rounds} rounds; the commands' output: {logs}",
        flush=True,
    )
    rounds = []
    start = time.perf_counter()
    with Progress(2 * args.rounds, "Ray run and process run in turn", unit="run") as bar:
        for r in range(1, args.rounds + 1):
            with tempfile.TemporaryDirectory(prefix="bench_ray_train_") as workdir:
                epochs = ray_rate(args, Path(workdir), logs / f"round{r}_ray.log")
                bar.update()
                single = process_rate(args, Path(workdir), logs / f"round{r}_process.log")
                bar.update()
            rounds.append((epochs, single))
            print(
                f"round {r}: Ray epochs {' / '.join(f'{e:.0f}' for e in epochs)} trajectories/s, one process "
                f"{single:.0f}; ratio {summary(rounds[-1:])[0]:.2f}",
                flush=True,
            )
    median, ratios = summary(rounds)
    print(f"done in {time.perf_counter() - start:.0f} s")
    print(
        f"per core, {args.workers} Ray Train workers / one process: median {median:.2f} "
        f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}; goal >= {GOAL:.1f}: {'met' if median >= GOAL else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
