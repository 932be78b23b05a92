"""Fixtures for tests on a real multi-node Ray cluster whose nodes share no disk (see harness.py).

- ``s3_bucket``: a fresh bucket on a local S3 server (``.uri(prefix)``, ``.env``, ``.filesystem()``).
- ``ray_cluster``: a head (no CPUs) and worker nodes ``a`` and ``b`` (1 CPU each), torn down after the
  test. Use it for tests that kill or add nodes.
- ``shared_ray_cluster``: the same, shared by the tests of one module; for tests that leave the nodes
  as they found them.

A failing test's report gets a "ray cluster" section with the tails of every node's logs, and the
cluster's root directory is left on disk (its path is in that section).
"""

from __future__ import annotations

import pytest

from tests.cluster import harness


def _cluster_or_skip():
    reason = harness.cluster_unavailable_reason()
    if reason:
        pytest.skip(f"multi-node Ray cluster: {reason}")


@pytest.fixture
def s3_bucket():
    """A bucket on moto's S3 server (127.0.0.1, a free port), in this process; skipped without moto."""
    reason = harness.s3_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with harness.s3_server() as s3:
        yield s3


def _cluster(request, tmp_path_factory):
    _cluster_or_skip()
    failed_before = request.session.testsfailed
    # Worker nodes must not see pytest's temp dirs either: every tmp_path lives below this one.
    with harness.start_cluster(workers=("a", "b"), hidden=[tmp_path_factory.getbasetemp()]) as cluster:
        yield cluster
        if request.session.testsfailed > failed_before:
            cluster.keep_root = True


@pytest.fixture
def ray_cluster(request, tmp_path_factory):
    """A started Cluster with workers ``a`` and ``b``, for this test alone."""
    yield from _cluster(request, tmp_path_factory)


@pytest.fixture(scope="module")
def shared_ray_cluster(request, tmp_path_factory):
    """A started Cluster with workers ``a`` and ``b``, shared by this module's tests."""
    yield from _cluster(request, tmp_path_factory)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failure, add the tails of the cluster's logs to the test's report: the worker nodes' logs
    live on their private tmpfs and are gone once the cluster is shut down."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when == "call":
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, harness.Cluster):
                try:
                    text = value.debug_report()
                except Exception as exc:  # a broken cluster must not hide the test's own failure
                    text = f"(no report: {exc!r})"
                report.sections.append(("ray cluster", f"root {value.root} (kept)\n{text}"))
