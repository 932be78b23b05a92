"""Every cluster config validates offline with Ray's own validator and passes the project's checks.

`ray up` is never called here: it reaches the cloud.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

CLUSTER_DIR = Path(__file__).resolve().parents[2] / "cluster"
CONFIGS = sorted(CLUSTER_DIR.glob("*.yaml"))


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _all_commands(cfg: dict) -> list[str]:
    keys = [
        "initialization_commands",
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    ]
    return [c for k in keys for c in cfg.get(k) or []]


def test_there_are_configs():
    assert {p.name for p in CONFIGS} >= {"gpu.yaml", "cpu.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_ray_validator_accepts(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(_load(path)))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_ray_validator_would_reject_a_broken_copy(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = _load(path)
    cfg["head_node_type"] = "no.such.type"
    with pytest.raises(Exception):
        validate_config(prepare_config(cfg))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_nothing_is_exposed_publicly(path):
    cfg = _load(path)
    text = " ".join(_all_commands(cfg))
    assert "0.0.0.0" not in path.read_text()
    assert "--dashboard-host=127.0.0.1" in text
    for match in re.finditer(r"mlflow (?:server|ui)\b(.*?)(?:>|&|$)", text):
        assert "--host 127.0.0.1" in match.group(1), match.group(0)
    # No extra inbound rules: the launcher's default security group only opens SSH.
    for node_type in cfg["available_node_types"].values():
        assert "SecurityGroupIds" not in node_type["node_config"]
    assert not any("-p " in opt or "--publish" in opt for opt in cfg.get("docker", {}).get("run_options", []))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_setup_installs_this_project(path):
    cfg = _load(path)
    mounts = cfg["file_mounts"]
    target = next(remote for remote, local in mounts.items() if local == ".")
    setup = cfg["setup_commands"]
    assert any(re.search(rf"pip install .*-e {re.escape(target)}\b", c) for c in setup)
    torch_step = next(i for i, c in enumerate(setup) if "torch==" in c)
    project_step = next(i for i, c in enumerate(setup) if target in c)
    assert torch_step < project_step, "torch must be installed (pinned) before the project"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_image_matches_the_project_stack(path):
    import ray

    image = _load(path)["docker"]["image"]
    assert image.startswith(f"rayproject/ray:{ray.__version__}-py311")


def test_gpu_config_declares_gpu_workers_that_autoscale_from_zero():
    cfg = _load(CLUSTER_DIR / "gpu.yaml")
    head = cfg["head_node_type"]
    workers = {name: t for name, t in cfg["available_node_types"].items() if name != head}
    assert workers
    for node_type in workers.values():
        assert node_type["resources"].get("GPU", 0) >= 1
        assert node_type.get("min_workers", 0) == 0
    assert cfg["available_node_types"][head]["resources"].get("GPU", 0) == 0
    assert cfg["docker"]["image"].endswith("-gpu")
    assert cfg["idle_timeout_minutes"] > 0
