"""Kill -9 at random points of the pipeline, rerun, and compare with an uninterrupted run.

    python benchmarks/bench_kill.py --cycles 20 --seed 0 [--steps import,preprocess,train[,sweep]]
        [--trainer local|ray] [--workdir DIR] [--keep]

A small synthetic graph (``seeder synth``, 300 nodes) is exported as a triples TSV plus a queries TSV.
The reference run does, uninterrupted and timed: ``seeder import triples`` -> ``pipelines/preprocess.py``
(embedded Ray, hash encoder) -> training (``python -m seeder.training.loop`` by default, ``pipelines/train.py``
with ``--trainer ray``) for two short epochs -> optionally a two-trial ``tune/sweep.py``.

Each cycle then picks a step and a delay inside that step's reference duration (both seeded), restores the
reference outputs of the steps before it, starts the step as a subprocess in its own process group and
SIGKILLs the whole group at that delay (then any Ray process the killed driver left). It then reruns the
step the way a user would (the import with ``--overwrite``, preprocessing as is, training with
``--resume``, the sweep with ``--resume``) and the steps after it, all into the same paths as the
reference, and compares:

- import and preprocess: every data file byte for byte (xxh3 of each file; manifests and the run summary,
  which hold timestamps, only by their file records); no partial directory may be left behind;
- training: every tensor of the best model's weights and the per-epoch history (losses and validation
  metrics; timings left out), which are bitwise reproducible on CPU with a fixed seed;
- sweep: not bitwise (trial timing decides what ASHA stops): the rerun must finish every trial and
  register a champion.

Also checked after each kill: a dataset directory that exists has a complete, verifying manifest (a killed
import never looks complete). Prints one line per cycle and ``survived X/N, identical Y/N`` with the number of
kills that landed before their step finished, and the wall time. ``survived``: the rerun finished (rc 0) with nothing left half-written; ``identical``: and the outputs
match the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TIMING_KEYS = {"epoch_seconds", "trajectories_per_second", "val_seconds"}
PREPROCESS = [
    "--ray-address",
    "local",
    "--in-process-below",  # kills land inside Ray's stages, not in a tiny graph's run in the driver
    "0",
    "--num-cpus",
    "2",
    "--shard-rows",
    "100",
    "--query-block",
    "25",
    "embed.encoder=hash",
    "embed.hash_dim=64",
    "embed.cpus_per_actor=1",
    "reduce.dim=16",
    "seed.strategy=dense",
    "expand.relation_score=cosine",
    "expand.budget=30",
    "expand.keep_per_hop=[12,18]",
]
TRAIN = [
    "train.epochs=2",
    "train.batch_size=8",
    "train.num_trajectories=2",
    "train.expansion_sizes=[3,3]",
    "train.frontier_caps=[8,8]",
    "train.warmup_epochs=0",
    "model.hidden_dim=16",
    "model.num_layers=1",
    "train.num_threads=1",
]


def env() -> dict[str, str]:
    e = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        MLFLOW_DISABLE_TELEMETRY="true",
        PYTHONUNBUFFERED="1",
        RAY_AUTH_MODE="disabled",
    )
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    e.pop("RAY_ADDRESS", None)
    for hook in ("SEEDER_TEST_STOP_AFTER_SHARDS", "SEEDER_TRAIN_EXIT_AFTER_EPOCH"):
        e.pop(hook, None)
    return e


# -- the pipeline ---------------------------------------------------------------------------------------


def make_inputs(root: Path) -> None:
    """A small synthetic graph as the TSV files a user would bring: triples.tsv and queries.tsv."""
    from seeder.data.store import open_dataset
    from seeder.generate.synth import SynthConfig, synthesize

    synthesize(
        SynthConfig(
            nodes=300,
            relations=4,
            queries=200,
            max_path_length=1,
            hubs=0,
            multi_answer_frac=0.0,
            val_fraction=0.2,
            test_fraction=0.1,
            seed=3,
        ),
        root / "synth",
    )
    kg = open_dataset(root / "synth")
    names = kg.nodes.column("name").to_pylist()
    rels = kg.relations.column("name").to_pylist()
    e = kg.table("edges").to_pydict()
    with open(root / "triples.tsv", "w", encoding="utf-8") as fh:
        fh.write("head\trelation\ttail\n")
        for s, d, r in zip(e["src"], e["dst"], e["relation"]):
            fh.write(f"{names[s]}\t{rels[r]}\t{names[d]}\n")
    q = kg.queries.to_pydict()
    with open(root / "queries.tsv", "w", encoding="utf-8") as fh:
        fh.write("id\ttext\tanswers\tsplit\n")
        for i, text, answers, split in zip(q["id"], q["text"], q["answers"], q["split"]):
            fh.write(f"{i}\t{text}\t{'|'.join(names[a] for a in answers)}\t{split}\n")
    shutil.rmtree(root / "synth")


def commands(inputs: Path, run: Path, trainer: str, rerun: bool) -> dict[str, list[str]]:
    """The command of every step; ``rerun`` gives the form a user runs after a crash."""
    py = sys.executable
    cmds = {
        "import": [
            py,
            "-m",
            "seeder.cli",
            "import",
            "triples",
            "--triples",
            str(inputs / "triples.tsv"),
            "--queries",
            str(inputs / "queries.tsv"),
            "--out",
            str(run / "dataset"),
        ]
        + (["--overwrite"] if rerun else []),
        "preprocess": [
            py,
            str(REPO / "pipelines" / "preprocess.py"),
            "--dataset",
            str(run / "dataset"),
            "--out",
            str(run / "artifacts"),
            *PREPROCESS,
        ],
    }
    if trainer == "ray":
        cmds["train"] = [
            py,
            str(REPO / "pipelines" / "train.py"),
            "--artifacts",
            str(run / "artifacts"),
            "--out",
            str(run / "train"),
            "--num-workers",
            "1",
            "--no-mlflow",
            "--max-failures",
            "0",
            "--ray-address",
            "local",
            "--num-cpus",
            "2",
            *TRAIN,
        ] + (["--resume"] if rerun else [])
    else:
        cmds["train"] = [
            py,
            "-m",
            "seeder.training.loop",
            "--artifacts",
            str(run / "artifacts"),
            "--out",
            str(run / "train"),
            "--experiment",
            "none",
            *TRAIN,
        ] + (["--resume"] if rerun else [])
    cmds["sweep"] = [
        py,
        str(REPO / "tune" / "sweep.py"),
        "--artifacts",
        str(run / "artifacts"),
        "--num-samples",
        "2",
        "--max-concurrent",
        "1",
        "--epochs",
        "1",
        "--storage",
        str(run / "sweeps"),
        "--name",
        "s",
        "--ray-address",
        "local",
        "--num-cpus",
        "2",
        *TRAIN,
    ] + (["--resume"] if rerun else [])
    return cmds


def step_env(run: Path) -> dict[str, str]:
    return dict(env(), MLFLOW_TRACKING_URI=f"sqlite:///{run / 'mlflow.db'}")


def run_step(cmd: list[str], run: Path, log: Path, timeout: float = 600) -> tuple[int, float]:
    start = time.perf_counter()
    with open(log, "ab") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=step_env(run), cwd=run, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc = -9
    return rc, time.perf_counter() - start


def session_members(sid: int) -> list[int]:
    """Processes whose session id is ``sid`` (a killed driver's children that outlived it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(entry))
    return pids


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the step's process group, then whatever else of its session survived (Ray's daemons),
    then the processes of embedded Ray sessions whose driver is gone (``stop_leftover_ray``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    from pipelines.ray_runtime import stop_leftover_ray

    stop_leftover_ray("bench_kill", grace_s=2.0)


def kill_at(cmd: list[str], run: Path, log: Path, delay: float) -> tuple[int | None, float]:
    """Start ``cmd`` in its own process group and SIGKILL the group after ``delay`` seconds; (rc, seconds):
    rc is None when the kill landed, else the step finished first."""
    with open(log, "ab") as fh:
        fh.write(f"\n$ {' '.join(cmd)}  # killed after {delay:.2f}s\n".encode())
        fh.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=step_env(run), cwd=run, start_new_session=True)
        try:
            rc = proc.wait(timeout=delay)
            return rc, time.perf_counter() - start
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return None, time.perf_counter() - start


# -- what a step produced -------------------------------------------------------------------------------

METADATA = {"manifest.json", "summary.json"}


def file_hashes(root: Path) -> dict[str, str]:
    """xxh3 of every file under ``root`` except metadata that holds timestamps (and hidden names)."""
    from seeder.system.io import checksum_file

    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and path.name not in METADATA and not any(p.startswith(".") for p in rel.parts):
            out[rel.as_posix()] = checksum_file(path)
    return out


def leftovers(root: Path) -> list[str]:
    """Hidden partial or temporary entries an interrupted writer left that a finished rerun should not."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob(".*")
        if ".partial" in p.name or ".tmp" in p.name or p.name.endswith(".old")
    )


def stage_records(artifacts: Path) -> dict[str, dict]:
    records = {}
    for manifest in sorted(artifacts.glob("*/manifest.json")):
        data = json.loads(manifest.read_text())
        records[manifest.parent.name] = {
            "fingerprint": data.get("fingerprint"),
            "files": {k: v.get("xxh3") for k, v in (data.get("files") or {}).items()},
        }
    return records


def training_outputs(out: Path) -> dict:
    import torch

    weights = torch.load(out / "model" / "weights.pt", map_location="cpu", weights_only=True)
    history = json.loads((out / "history.json").read_text())
    return {"weights": weights, "history": [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in history]}


def snapshot(run: Path, step: str) -> dict:
    if step == "import":
        manifest = json.loads((run / "dataset" / "manifest.json").read_text())
        return {"files": file_hashes(run / "dataset"), "fingerprints": manifest["fingerprints"], "counts": manifest["counts"]}
    if step == "preprocess":
        return {"files": file_hashes(run / "artifacts"), "stages": stage_records(run / "artifacts")}
    if step == "train":
        return training_outputs(run / "train")
    trials = sorted(p.name for p in (run / "sweeps" / "s").glob("t0*")) if (run / "sweeps" / "s").is_dir() else []
    return {"trials": len(trials)}


def same(step: str, a: dict, b: dict) -> str:
    """'' when equal, else what differs (one line)."""
    if step == "train":
        import torch

        if a["history"] != b["history"]:
            return "training history differs"
        bad = [k for k in a["weights"] if k not in b["weights"] or not torch.equal(a["weights"][k], b["weights"][k])]
        return f"weights differ: {', '.join(bad[:3])}" if bad or set(a["weights"]) != set(b["weights"]) else ""
    if step == "sweep":
        return "" if a == b else f"sweep trials {b} != {a}"
    for key in a:
        if a[key] != b.get(key):
            if key == "files":
                diff = sorted(k for k in set(a[key]) | set(b[key]) if a[key].get(k) != b[key].get(k))
                return f"{step}: {len(diff)} files differ, e.g. {', '.join(diff[:3])}"
            return f"{step}: {key} differ"
    return ""


def check_dataset_not_half_complete(run: Path) -> str:
    """After a kill in the import: an existing dataset directory must be complete and verify."""
    from seeder.system.io import fingerprint_file, read_manifest

    ds = run / "dataset"
    if not ds.exists():
        return ""
    manifest = read_manifest(ds)
    if manifest is None:
        return "dataset/ exists without a manifest"
    for rel, fp in manifest["fingerprints"].items():
        if not (ds / rel).is_file() or fingerprint_file(ds / rel) != fp:
            return f"dataset/ looks complete but {rel} does not match its manifest"
    return ""


# -- the benchmark --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="kill-and-rerun cycles (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the steps and delays chosen")
    parser.add_argument("--steps", default="import,preprocess,train", help="steps in order; add sweep for a tiny sweep")
    parser.add_argument(
        "--trainer",
        choices=("local", "ray"),
        default="local",
        help="local: python -m seeder.training (seconds); ray: pipelines/train.py on Ray Train (~40 s)",
    )
    parser.add_argument("--workdir", help="where to work (default: a temporary directory, removed at the end)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = set(steps) - {"import", "preprocess", "train", "sweep"}
    if unknown or not steps or steps[0] != "import":
        parser.error("--steps: a comma-separated list starting with import, from import,preprocess,train,sweep")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_kill-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    inputs, run, ref, log = work / "inputs", work / "run", work / "reference", work / "steps.log"
    wall = time.perf_counter()
    inputs.mkdir(exist_ok=True)
    make_inputs(inputs)

    # The uninterrupted reference, in the same paths the cycles use (paths are recorded in manifests).
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    durations, expected = {}, {}
    first = commands(inputs, run, args.trainer, rerun=False)
    for step in steps:
        rc, seconds = run_step(first[step], run, log)
        if rc != 0:
            print(f"reference {step} failed (rc {rc}); see {log}", file=sys.stderr)
            return 1
        durations[step] = seconds
        expected[step] = snapshot(run, step)
        print(f"reference {step}: {seconds:.1f}s", flush=True)
    shutil.rmtree(ref, ignore_errors=True)
    shutil.copytree(run, ref, symlinks=True)

    outputs = {"import": ["dataset"], "preprocess": ["artifacts"], "train": ["train"], "sweep": ["sweeps", "mlflow.db"]}
    rng = random.Random(args.seed)
    survived = identical = landed = 0
    again = commands(inputs, run, args.trainer, rerun=True)
    for cycle in range(1, args.cycles + 1):
        start = time.perf_counter()
        index = rng.randrange(len(steps))
        step = steps[index]
        # Inside the reference duration, short of its end: a step that finishes first is no kill at all.
        delay = rng.uniform(0.05, 0.9 * durations[step])
        # The state before the step: the reference outputs of the steps before it, nothing of the others.
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir()
        for earlier in steps[:index]:
            for name in outputs[earlier]:
                src = ref / name
                (shutil.copytree if src.is_dir() else shutil.copy2)(src, run / name)
        rc, at = kill_at(first[step], run, log, delay)
        what = f"killed at {delay:.2f}s" if rc is None else f"finished before the kill (rc {rc})"
        landed += rc is None
        problem = check_dataset_not_half_complete(run) if step == "import" else ""
        ok, differs = not problem, []
        for later in steps[index:]:
            if not ok:
                break
            rc2, _ = run_step(again[later], run, log)
            if rc2 != 0:
                problem, ok = f"rerun of {later} failed (rc {rc2})", False
                break
            if later == "import":
                left = sorted(p.name for p in run.glob(".dataset.*") if ".partial-" in p.name or ".old-" in p.name)
            else:
                left = leftovers(run / outputs[later][0]) if later == "preprocess" else []
            if left:
                problem, ok = f"{later} left {', '.join(left[:2])} behind", False
                break
            diff = same(later, expected[later], snapshot(run, later))
            if diff:
                differs.append(diff)
        survived += ok
        identical += ok and not differs
        status = "identical" if ok and not differs else ("DIFFERENT: " + "; ".join(differs) if ok else f"FAILED: {problem}")
        print(
            f"cycle {cycle:2d}/{args.cycles}: {step:<10} {what:<28} rerun {', '.join(steps[index:])}: {status} "
            f"({time.perf_counter() - start:.1f}s)",
            flush=True,
        )
    total = time.perf_counter() - wall
    print(
        f"survived {survived}/{args.cycles}, identical {identical}/{args.cycles} "
        f"({landed} kills landed inside their step; steps {','.join(steps)}, trainer {args.trainer}, seed {args.seed}; wall {total:.0f}s)",
        flush=True,
    )
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    elif args.keep:
        print(f"kept {work}; step output in {log}")
    return 0 if identical == args.cycles else 1


if __name__ == "__main__":
    sys.exit(main())
