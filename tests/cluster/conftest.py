"""A failing cluster test's report gets a "ray cluster" section with the tails of every node's logs, and
the cluster's root directory is left on disk (its path is in that section). The cluster itself (a head
with no CPUs and worker nodes ``a`` and ``b``, see harness.py) is test_pipeline.py's module fixture.
"""

from __future__ import annotations

import pytest

from tests.cluster import harness


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
