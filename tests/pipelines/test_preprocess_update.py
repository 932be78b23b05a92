"""``pipelines/preprocess.py --update`` end to end (on Ray and in the driver, the hash encoder, no PCA): the update of a tiny
graph equals a full run on the new version, also when killed in its subgraphs stage and run again;
it records its parent and what it recomputed, and refuses artifacts that are not the parent's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seeder.preprocessing.stages import TEST_STOP_ENV
from tests.datasets import write_tiny_dataset
from tests.pipelines.test_preprocess import _env
from tests.preprocessing.test_incremental import assert_same_artifacts, write_change

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "pipelines" / "preprocess.py"
FLAGS = ["--ray-address", "local", "--num-cpus", "2", "--shard-rows", "64", "--query-block", "4"]
OVERRIDES = [
    "embed.encoder=hash",
    "embed.hash_dim=32",
    "reduce.dim=0",
    "seed.strategy=dense+entity",
    "seed.k0=2",
    "expand.relation_score=cosine",
    "expand.budget=20",
    "expand.keep_per_hop=[8,10]",
]


def preprocess(dataset: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--dataset", str(dataset), "--out", str(out), *FLAGS, *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env or _env(), timeout=600, cwd=REPO)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("update")
    parent = Path(write_tiny_dataset(root / "v1", 60, seed=11, two_hop_answers=True, id_stride=3))
    child = write_change(root, parent)
    paths = {"parent": parent, "child": child, "a1": root / "a1", "a2": root / "a2", "full": root / "full"}
    for dataset, out in ((parent, paths["a1"]), (child, paths["full"])):
        result = preprocess(dataset, out, *OVERRIDES)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return paths


def test_an_update_killed_and_resumed_equals_a_full_run(runs):
    """Killed on Ray (``--in-process-below 0 --update-in-process-below 0``) in its subgraphs stage, then resumed in this process (a
    tiny graph's default): both ways of running an update's stages, and the result equals a full run."""
    on_ray = ["--in-process-below", "0", "--update-in-process-below", "0", "--update", str(runs["a1"])]
    killed = preprocess(runs["child"], runs["a2"], *on_ray, env=_env(**{TEST_STOP_ENV: "subgraphs:1"}))
    assert killed.returncode != 0 and (runs["a2"] / "seeds" / "manifest.json").exists()
    assert "every stage runs in this process" not in killed.stdout
    assert not (runs["a2"] / "subgraphs").exists()
    result = preprocess(runs["child"], runs["a2"], "--update", str(runs["a1"]))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "subgraphs: resuming" in result.stdout and "every stage runs in this process" in result.stdout
    assert_same_artifacts(runs["a2"], runs["full"])
    summary = json.loads((runs["a2"] / "summary.json").read_text())
    manifest = json.loads((runs["a2"] / "manifest.json").read_text())
    parent = json.loads((runs["a1"] / "manifest.json").read_text())
    assert manifest["update"]["parent"]["dataset_fingerprint"] == parent["dataset_fingerprint"]
    done = summary["update"]["recomputed"]
    queries = summary["counts"]["queries"]
    assert 0 < done["seeded_queries"] < queries and 0 < done["subgraphs"] < queries
    assert 0 < sum(done["embedded_rows"].values()) < summary["counts"]["nodes"]
    assert manifest["update"] == summary["update"]


def test_an_update_refuses_artifacts_that_are_not_the_parents(runs, tmp_path):
    result = preprocess(runs["child"], tmp_path / "out", "--update", str(runs["full"]))
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert "manifest.json: built from dataset fingerprint" in line and "pass the artifacts of that parent" in line
    result = preprocess(runs["child"], tmp_path / "out", "--update", str(runs["a1"]), "expand.budget=25")
    assert result.returncode == 2 and "differs from the config" in result.stderr
    assert not (tmp_path / "out").exists()
