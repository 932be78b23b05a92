"""Fault injection: kill -9 at random (seeded) points of the import, an update, each preprocessing stage and
training, then rerun the way a user would and compare with an uninterrupted run. (A sweep killed with -9:
tests/tune/test_sweep.py.)

The quick tests kill the import (at random delays and at the two windows that matter: just before the
manifest is written and between the renames of an overwrite) and training inside its checkpoint save. The
slow ones run the whole pipeline on Ray. The helpers (the pipeline's commands, the kill of a whole
process group, the comparisons) are those of ``benchmarks/bench_kill.py``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seeder.preprocessing.stages import TEST_STOP_ENV
from tests.processes import bench_kill as bench

SEED = int(os.environ.get("FAULT_SEED", 0))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    bench.make_inputs(root)
    return root


def _run(cmd, cwd: Path, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env={**bench.step_env(cwd), **extra_env}, capture_output=True, text=True, timeout=600)


def _killed_python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (it is expected to SIGKILL itself at the point it patches in)."""
    return _run([sys.executable, "-c", code, *args], cwd)


def kill_after_rename(module: str, condition: str, main: str) -> str:
    """Code that runs ``main``'s CLI with ``module``'s ``os.replace`` SIGKILLing the process right after a
    rename for which ``condition`` (on ``src``, ``dst``) holds."""
    return (
        f"import os, signal, sys, {module} as target\n"
        "class Os:\n"
        "    def __getattr__(self, name): return getattr(os, name)\n"
        "    @staticmethod\n"
        "    def replace(src, dst):\n"
        "        os.replace(src, dst)\n"
        f"        if {condition}: os.kill(os.getpid(), signal.SIGKILL)\n"
        "target.os = Os()\n"
        f"from {main} import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )


# Code that SIGKILLs an import at the two windows that matter: before the manifest exists, and between the
# renames of an overwrite (the old dataset moved aside, the new one not yet in place).
KILL_BEFORE_MANIFEST = (
    "import os, signal, sys, seeder.data.store as s\n"
    "def die(*a, **k): os.kill(os.getpid(), signal.SIGKILL)\n"
    "s.write_manifest = die\n"
    "from seeder.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
KILL_BETWEEN_RENAMES = kill_after_rename("seeder.system.io", "'.old-' in str(dst)", "seeder.cli.main")


def kill_and_rerun(first: list[str], again: list[str], run: Path, log: Path, delays: list[float], reference: dict) -> int:
    """Kill the import ``first`` (writing ``run / "dataset"``) at the two windows and after each of
    ``delays`` seconds; after each kill nothing looks complete that is not, and ``again`` (the rerun a
    user types) equals ``reference`` with no leftovers. Returns how many kills landed before the end."""
    kills = [("before the manifest", KILL_BEFORE_MANIFEST, first), ("between the renames", KILL_BETWEEN_RENAMES, again)]
    kills += [(f"after {d:.2f}s", None, first) for d in delays]
    landed = 0
    for what, code, cmd in kills:
        if code is not None:
            if "renames" in what:  # an overwrite needs a dataset to replace
                assert _run(first, run).returncode == 0
            killed = _killed_python(code, run, *cmd[3:])
            assert killed.returncode == -9, f"{what}: {killed.returncode} {killed.stderr[-2000:]}"
            landed += 1
        else:
            rc, _ = bench.kill_at(cmd, run, log, float(what.split()[1][:-1]))
            landed += rc is None
        # Never something that looks complete but is not.
        assert bench.check_dataset_not_half_complete(run) == "", what
        if code is not None:
            assert not (run / "dataset" / "manifest.json").exists(), what
        rerun = _run(again, run)
        assert rerun.returncode == 0, f"{what}: {rerun.stderr[-2000:]}"
        assert bench.same("import", reference, bench.snapshot(run, "import")) == "", what
        assert not [p for p in run.iterdir() if ".partial-" in p.name or ".old-" in p.name], what
        shutil.rmtree(run / "dataset")
    return landed


def _warm_seconds(command: list[str], cwd: Path) -> float:
    """Seconds of an uninterrupted run of ``command`` after a first one, over which a test spreads its
    kills: the first run, whose start also warms the caches, could take longer than the killed runs, and
    then most kills came after their end."""
    start = time.perf_counter()
    done = _run(command, cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    return time.perf_counter() - start


# -- import ----------------------------------------------------------------------------------------------


def test_a_killed_import_never_looks_complete_and_its_rerun_is_identical(inputs, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    first = bench.commands(inputs, run, "local", rerun=False)["import"]
    again = bench.commands(inputs, run, "local", rerun=True)["import"]
    done = _run(first, run)
    assert done.returncode == 0, done.stderr[-2000:]
    reference = bench.snapshot(run, "import")
    shutil.rmtree(run / "dataset")

    rng = random.Random(SEED)
    kill_and_rerun(first, again, run, tmp_path / "steps.log", sorted(rng.uniform(0.3, 2.0) for _ in range(2)), reference)


@pytest.mark.slow
def test_a_killed_update_never_looks_complete_and_its_rerun_is_identical(inputs, tmp_path):
    """``seeder import triples --update``, killed 10 times (before its manifest, between the renames of an
    overwrite, and at 8 random delays): the new version is never half there, and the rerun equals an
    uninterrupted update, file by file. The parent is never touched."""
    parent_run, run = tmp_path / "parent", tmp_path / "run"
    parent_run.mkdir(), run.mkdir()
    assert _run(bench.commands(inputs, parent_run, "local", rerun=False)["import"], parent_run).returncode == 0
    parent = bench.snapshot(parent_run, "import")
    lines = (inputs / "triples.tsv").read_text().splitlines()[1:]
    change = tmp_path / "change.tsv"
    change.write_text(
        "head\trelation\ttail\top\n"
        + "".join(f"{line}\tremove\n" for line in lines[::40])
        + "".join(f"new node {i}\t{lines[i].split(chr(9))[1]}\t{lines[i].split(chr(9))[2]}\tadd\n" for i in range(0, 200, 10))
    )
    update = [sys.executable, "-m", "seeder.cli", "import", "triples", "--update", str(parent_run / "dataset")]
    first = [*update, "--triples", str(change), "--out", str(run / "dataset")]
    again = [*first, "--overwrite"]
    done = _run(first, run)
    assert done.returncode == 0, done.stderr[-2000:]
    reference = bench.snapshot(run, "import")
    shutil.rmtree(run / "dataset")
    spans = []
    for _ in range(2):  # the faster of two: one slowed by other work would spread the kills past the end
        spans.append(_warm_seconds(first, run))
        shutil.rmtree(run / "dataset")
    took = min(spans)

    rng = random.Random(SEED + 1)
    delays = sorted(rng.uniform(0.2, took) for _ in range(8))
    landed = kill_and_rerun(first, again, run, tmp_path / "steps.log", delays, reference)
    assert landed >= 6, f"only {landed} of 10 kills landed before the update finished"
    assert bench.same("import", parent, bench.snapshot(parent_run, "import")) == ""


def _stages_that_look_complete_verify(artifacts: Path) -> str:
    """'' when every stage with a manifest verifies file by file, and a summary exists only with them all."""
    from seeder.system.io import read_manifest, verify_outputs

    if not artifacts.exists():
        return ""
    for stage in sorted(p for p in artifacts.iterdir() if p.is_dir() and not p.name.startswith(".")):
        manifest = read_manifest(stage)
        if manifest is not None and (problems := verify_outputs(stage, manifest, deep=True)):
            return f"{stage.name} looks complete but: {problems[0]}"
    done = {p.parent.name for p in artifacts.glob("*/manifest.json")}
    if (artifacts / "summary.json").exists() and not {"embed", "features", "seeds", "subgraphs"} <= done:
        return f"summary.json written with only {sorted(done)} complete"
    return ""


@pytest.mark.slow
def test_kills_at_random_points_of_an_update_preprocessing_resume_to_the_same_artifacts(inputs, tmp_path):
    """``pipelines/preprocess.py --update``, killed (its process group, -9) at 10 random delays: nothing
    looks complete that is not, and each rerun of the same command equals an uninterrupted update file
    by file. The parent's artifacts are never touched."""
    run = tmp_path / "run"
    run.mkdir()
    cmds = bench.commands(inputs, run, "ray", rerun=False)
    for step in ("import", "preprocess"):
        done = _run(in_the_driver(cmds[step]), run)
        assert done.returncode == 0, f"{step}: {done.stderr[-2000:]}"
    parent = bench.file_hashes(run / "artifacts")
    lines = (inputs / "triples.tsv").read_text().splitlines()[1:]
    change = tmp_path / "change.tsv"
    change.write_text(
        "head\trelation\ttail\top\n"
        + "".join(f"{line}\tremove\n" for line in lines[::40])
        + "".join(f"new node {i}\t{lines[i].split(chr(9))[1]}\t{lines[i].split(chr(9))[2]}\tadd\n" for i in range(0, 200, 10))
    )
    imported = _run(
        [
            sys.executable,
            "-m",
            "seeder.cli",
            "import",
            "triples",
            "--update",
            str(run / "dataset"),
            "--triples",
            str(change),
            "--out",
            str(run / "v2"),
        ],
        run,
    )
    assert imported.returncode == 0, imported.stderr[-2000:]

    def update(out: Path) -> list[str]:
        script = str(bench.REPO / "pipelines" / "preprocess.py")
        return [
            sys.executable,
            script,
            "--dataset",
            str(run / "v2"),
            "--out",
            str(out),
            "--update",
            str(run / "artifacts"),
            "--query-block",
            "25",
        ]

    done = _run(update(run / "reference"), run)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    reference = {"files": bench.file_hashes(run / "reference"), "stages": bench.stage_records(run / "reference")}
    took = _warm_seconds(update(run / "timed"), run)
    shutil.rmtree(run / "timed")

    rng = random.Random(SEED + 2)
    landed = 0
    for delay in sorted(rng.uniform(0.3, took) for _ in range(10)):
        out = run / "a2"
        rc, _ = bench.kill_at(update(out), run, tmp_path / "steps.log", delay)
        landed += rc is None
        assert _stages_that_look_complete_verify(out) == "", f"killed after {delay:.2f}s"
        rerun = _run(update(out), run)
        assert rerun.returncode == 0, f"killed after {delay:.2f}s: {rerun.stdout[-2000:]} {rerun.stderr[-2000:]}"
        found = {"files": bench.file_hashes(out), "stages": bench.stage_records(out)}
        assert bench.same("preprocess", reference, found) == "", f"killed after {delay:.2f}s"
        assert bench.leftovers(out) == [], f"killed after {delay:.2f}s"
        shutil.rmtree(out)
    assert landed >= 6, f"only {landed} of 10 kills landed before the update finished"
    assert bench.file_hashes(run / "artifacts") == parent


# A process that loads a model on one version and switches it to the next (``Retriever.reload``, what
# ``seeder serve``'s admin route calls), then prints the new version's answers.
SWITCH = (
    "import json, sys\n"
    "from seeder import Retriever\n"
    "old = Retriever.load(sys.argv[1], artifacts=sys.argv[2])\n"
    "new = old.reload(sys.argv[3])\n"
    "hits = new.retrieve(json.loads(sys.argv[4]), k=5)\n"
    "print(json.dumps([[h.dataset, [n.id for n in h.nodes], [n.score for n in h.nodes]] for h in hits]))\n"
)


@pytest.mark.slow
def test_kills_at_random_points_of_a_switch_leave_both_versions_as_they_were(tmp_path):
    """A switch of versions killed with -9 at 10 random points: it writes nothing, so neither version's
    files change, and the switch run again answers exactly as an uninterrupted one. (A switch that
    would go to artifacts still being written is refused: ``tests/serving/test_retriever.py``.)"""
    from tests.pipelines.test_serve_switch import _versions

    model, v1, v2, questions, _ = _versions(tmp_path)
    versions = {v: bench.file_hashes(Path(v)) for v in (v1, v2)}
    switch = [sys.executable, "-c", SWITCH, str(model), str(v1), str(v2), json.dumps(questions[:4])]
    done = _run(switch, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    reference = done.stdout
    took = _warm_seconds(switch, tmp_path)

    rng = random.Random(SEED + 3)
    landed = 0
    for delay in sorted(rng.uniform(0.3, took) for _ in range(10)):
        rc, _ = bench.kill_at(switch, tmp_path, tmp_path / "steps.log", delay)
        landed += rc is None
        assert {v: bench.file_hashes(Path(v)) for v in versions} == versions, f"killed after {delay:.2f}s"
        again = _run(switch, tmp_path)
        assert again.returncode == 0 and again.stdout == reference, f"killed after {delay:.2f}s: {again.stderr[-2000:]}"
    assert landed >= 6, f"only {landed} of 10 kills landed before the switch finished"


# -- training --------------------------------------------------------------------------------------------

from tests.pipelines.test_train import artifacts  # noqa: E402,F401  (hand-written artifacts, no Ray)

KILL_INSIDE_SAVE = kill_after_rename("seeder.policy.checkpoint", "str(dst).endswith('.last.old')", "seeder.training.loop")


def _train_cmd(artifacts: Path, out: Path, resume: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "seeder.training.loop",
        "--artifacts",
        str(artifacts),
        "--out",
        str(out),
        "--experiment",
        "none",
        *bench.TRAIN,
    ] + (["--resume"] if resume else [])


def test_a_kill_inside_the_checkpoint_save_resumes_to_the_same_model(artifacts, tmp_path):  # noqa: F811
    reference = tmp_path / "reference"
    done = _run(_train_cmd(artifacts, reference, False), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "killed"
    # The second epoch's save: the first epoch's checkpoint moved aside, the new one not yet in place.
    killed = _killed_python(KILL_INSIDE_SAVE, tmp_path, *_train_cmd(artifacts, out, False)[3:])
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not (out / "last").exists() and (out / ".last.old").is_dir()
    resumed = _run(_train_cmd(artifacts, out, True), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "put back" in resumed.stdout and "resumed from" in resumed.stdout and "after epoch 1" in resumed.stdout
    assert bench.same("train", bench.training_outputs(reference), bench.training_outputs(out)) == ""
    assert not list(out.glob(".last*"))


@pytest.mark.slow
def test_kills_at_random_points_of_training_resume_to_the_same_model(artifacts, tmp_path):  # noqa: F811
    reference = tmp_path / "reference"
    start = time.perf_counter()
    assert _run(_train_cmd(artifacts, reference, False), tmp_path).returncode == 0
    duration = time.perf_counter() - start
    expected = bench.training_outputs(reference)
    rng = random.Random(SEED)
    for i in range(3):
        out = tmp_path / f"killed{i}"
        delay = rng.uniform(0.5, duration)
        bench.kill_at(_train_cmd(artifacts, out, False), tmp_path, tmp_path / "steps.log", delay)
        resumed = _run(_train_cmd(artifacts, out, True), tmp_path)
        assert resumed.returncode == 0, f"killed after {delay:.2f}s: {resumed.stderr[-3000:]}"
        assert bench.same("train", expected, bench.training_outputs(out)) == "", f"killed after {delay:.2f}s"


# -- the pipeline on Ray -----------------------------------------------------------------------------------


def in_the_driver(cmd: list[str]) -> list[str]:
    """``cmd`` without the flags that send a tiny graph's preprocessing to Ray."""
    on_ray = {"--ray-address", "--in-process-below"}
    return [arg for i, arg in enumerate(cmd) if arg not in on_ray and (i == 0 or cmd[i - 1] not in on_ray)]


@pytest.fixture(scope="module")
def reference_pipeline(inputs, tmp_path_factory):
    """The uninterrupted import -> preprocess -> train (Ray Train, one worker), kept for comparison. Its
    preprocessing runs in the driver alone (a tiny graph's default), so the killed runs on Ray are compared
    with artifacts that Ray never touched, and the reference spares a Ray start."""
    ref = tmp_path_factory.mktemp("reference") / "run"
    ref.mkdir()
    cmds = bench.commands(inputs, ref, "ray", rerun=False)
    cmds["preprocess"] = in_the_driver(cmds["preprocess"])
    durations, snapshots = {}, {}
    for step in ("import", "preprocess", "train"):
        start = time.perf_counter()
        done = _run(cmds[step], ref)
        assert done.returncode == 0, f"{step}: {done.stdout[-2000:]} {done.stderr[-3000:]}"
        durations[step] = time.perf_counter() - start
        snapshots[step] = bench.snapshot(ref, step)
    return ref, durations, snapshots


def _fresh_run(ref: Path, tmp_path: Path, steps: list[str]) -> Path:
    """A copy of the reference run at the reference's own path (paths are recorded in manifests), holding
    only the outputs of ``steps``."""
    shutil.rmtree(ref.with_name("saved"), ignore_errors=True)
    os.replace(ref, ref.with_name("saved"))
    ref.mkdir()
    names = {"import": "dataset", "preprocess": "artifacts", "train": "train"}
    for step in steps:
        shutil.copytree(ref.with_name("saved") / names[step], ref / names[step])
    return ref


def _restore(ref: Path) -> None:
    shutil.rmtree(ref, ignore_errors=True)
    os.replace(ref.with_name("saved"), ref)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            return True
        time.sleep(0.01)
    return False


# The stages a chain of killed runs dies in, in pipeline order; each run resumes what the one before left.
KILLED_IN = ("embed", "features", "seeds", "subgraphs")


def _kill_inside(stage: str, cmd: list[str], run: Path, log: Path) -> None:
    """Start preprocessing and SIGKILL it (its whole process group, Ray included) inside ``stage``."""
    env = bench.step_env(run)
    if stage == "subgraphs":
        # Its eight blocks take milliseconds in all, less than a timed kill can aim at, so the driver dies
        # (os._exit, no clean-up) once a seeded number of them were written, and its Ray workers with it.
        shards = random.Random(f"{SEED}-{stage}").randint(1, 7)
        env[TEST_STOP_ENV] = f"subgraphs:{shards}"
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=run, start_new_session=True)
        if stage == "subgraphs":
            reached = proc.wait(timeout=600) == 137
        else:
            # The embedding stage runs for seconds: killed inside it after a random delay of up to 1 s.
            # The next two take milliseconds, so they are caught as the stage before them completes, then
            # after up to 0.05 s: well inside the few tenths of a second that the rest of the job takes.
            trigger = {"embed": ".embed.partial", "features": "embed/manifest.json", "seeds": "features/manifest.json"}[stage]
            reached = _wait_for(run / "artifacts" / trigger, proc)
            time.sleep(random.Random(f"{SEED}-{stage}").uniform(0.0, 1.0 if stage == "embed" else 0.05))
        bench.kill_group(proc)
    assert reached, f"preprocess ended before reaching {stage}: " + log.read_text()[-2000:]
    assert not (run / "artifacts" / "subgraphs" / "manifest.json").exists(), f"killed in {stage}, yet marked complete"
    if stage == "subgraphs":
        assert len(list((run / "artifacts" / ".subgraphs.partial").glob("part-*.parquet"))) >= shards


@pytest.mark.e2e
@pytest.mark.slow
def test_a_kill_inside_each_preprocessing_stage_resumes_to_the_same_artifacts(reference_pipeline, inputs, tmp_path):
    """Killed inside embed, then (resuming) inside features, then seeds, then subgraphs: the run that
    finishes equals the uninterrupted one file for file. One chain, not a kill and a rerun per stage:
    every resume point is still exercised, for five Ray jobs instead of eight."""
    ref, _, snapshots = reference_pipeline
    run = _fresh_run(ref, tmp_path, ["import"])
    try:
        cmd = bench.commands(inputs, run, "ray", rerun=False)["preprocess"]
        for stage in KILLED_IN:
            _kill_inside(stage, cmd, run, tmp_path / "steps.log")
        rerun = _run(cmd, run)
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
        assert "subgraphs: resuming" in rerun.stdout, rerun.stdout[-2000:]
        assert bench.same("preprocess", snapshots["preprocess"], bench.snapshot(run, "preprocess")) == ""
        assert bench.leftovers(run / "artifacts") == []
    finally:
        _restore(ref)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_kill_during_ray_training_resumes_to_the_same_model(reference_pipeline, inputs, tmp_path):
    from pipelines.train import SNAPSHOT_FILE  # imports Ray Train: only in this end-to-end test

    ref, _, snapshots = reference_pipeline
    run = _fresh_run(ref, tmp_path, ["import", "preprocess"])
    try:
        # Killed as soon as Ray Train has registered the first epoch's checkpoint (of two): a point in
        # the run's progress, not a delay, which a loaded machine once pushed past the end of training.
        cmd = bench.commands(inputs, run, "ray", rerun=False)["train"]
        with open(tmp_path / "steps.log", "ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=bench.step_env(run), cwd=run, start_new_session=True
            )
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline and not list((run / "train").rglob(SNAPSHOT_FILE)):
                time.sleep(0.01)
            finished = proc.poll() is not None
            bench.kill_group(proc)
        assert not finished, "training finished before its first checkpoint was seen"
        assert not (run / "train" / "model").exists() or not (run / "train" / "history.json").exists()
        resumed = _run(bench.commands(inputs, run, "ray", rerun=True)["train"], run)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
        assert bench.same("train", snapshots["train"], bench.snapshot(run, "train")) == ""
    finally:
        _restore(ref)


@pytest.mark.e2e
@pytest.mark.slow
def test_ray_free_and_one_worker_ray_train_runs_agree(reference_pipeline, inputs, tmp_path):
    """The same loop behind both drivers: the reference's one-worker Ray Train run and the Ray-free loop
    on the same artifacts give the same metrics epoch by epoch (one worker trains on exactly the Ray-free
    run's queries, with the same random streams). Here because the reference has the Ray run already."""
    ref, _, _ = reference_pipeline
    plain = bench.commands(inputs, ref, "plain", rerun=False)["train"]
    plain[plain.index("--out") + 1] = str(tmp_path / "plain")
    done = _run(plain, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    ray_rows = json.loads((ref / "train" / "history.json").read_text())
    plain_rows = json.loads((tmp_path / "plain" / "history.json").read_text())
    assert set(ray_rows[0]) == set(plain_rows[0])
    assert len(ray_rows) == len(plain_rows) == 2
    for ray_row, plain_row in zip(ray_rows, plain_rows, strict=True):
        for key in set(ray_row) - bench.TIMING_KEYS:
            assert ray_row[key] == pytest.approx(plain_row[key], abs=1e-6), key
