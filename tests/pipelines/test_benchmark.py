"""pipelines/benchmark.py: seeder benchmark's query blocks ranked on Ray Data give the same metrics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.evaluation.test_benchmark import REPO, _env, artifacts_dir, run_cli  # noqa: F401 (artifacts_dir is a fixture)

SCRIPT = REPO / "pipelines" / "benchmark.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=_env(), timeout=600, cwd=REPO)


def test_bad_input_is_a_one_line_error_before_ray(tmp_path):
    result = run_script(
        "--artifacts", str(tmp_path / "missing"), "--method", "dense", "--experiment", "none", "--ray-address", "local"
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"pipelines/benchmark.py: error: {tmp_path / 'missing'}: no artifacts manifest; run "
        f"`python pipelines/preprocess.py --dataset DIR --out {tmp_path / 'missing'}` first"
    ]
    assert "Started a local Ray instance" not in result.stdout + result.stderr


@pytest.mark.slow
def test_ray_path_gives_the_same_metrics(artifacts_dir, tmp_path):  # noqa: F811
    common = [
        "--artifacts",
        str(artifacts_dir),
        "--method",
        "dense,ppr",
        "--split",
        "test",
        "--latency-queries",
        "2",
        "--budgets",
        "none",
        "--experiment",
        "none",
        "--block-queries",
        "7",
    ]
    local = run_cli(*common, "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr[-3000:]
    on_ray = run_script(*common, "--out", str(tmp_path / "ray"), "--ray-address", "local", "--num-cpus", "2")
    assert on_ray.returncode == 0, on_ray.stdout[-3000:] + on_ray.stderr[-3000:]
    a = json.loads((tmp_path / "local" / "report.json").read_text())
    b = json.loads((tmp_path / "ray" / "report.json").read_text())
    assert b["engine"] == "ray" and a["engine"] == "in-process"
    assert a["methods"] == b["methods"]
