"""Joining or starting Ray, shared by every entry point in pipelines/ and tune/.

An explicit address (``--ray-address``) or ``RAY_ADDRESS`` (which ``ray job submit`` sets) joins that
cluster. Otherwise the entry point starts an embedded local Ray bound to the loopback interface,
without a dashboard: it never silently joins an unrelated cluster that happens to run on the machine
(whose CPUs may all be taken, which would leave this job waiting forever).
"""

from __future__ import annotations

import argparse
import os
import sys

STARTUP_ATTEMPTS = 3
ADDRESS_HELP = (
    "Ray cluster to join (HOST:PORT or ray://HOST:PORT); 'local' starts an embedded Ray. Default: RAY_ADDRESS "
    "(ray job submit sets it), else an embedded local Ray on 127.0.0.1; a cluster already running on this "
    "machine is never joined unasked"
)
NUM_CPUS_HELP = "CPUs of an embedded local Ray (default: all of this machine's)"
# Ray's own loggers that flood the terminal without saying anything a user can act on: the placement
# group cleaner polls the State API, which needs the dashboard the embedded Ray runs without, and warns
# every few seconds that it cannot. (Ray Train's per-report INFO lines are not reachable this way: Ray
# Train configures its workers' logging after this hook runs.)
QUIET_LOGGERS = {
    "ray.train.v2._internal.execution.controller.placement_group_cleaner": "ERROR",
}


def quiet_ray_loggers() -> None:
    """``worker_process_setup_hook``: runs in every Ray worker process before it does any work."""
    import logging

    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)


RUNTIME_ENV = {"worker_process_setup_hook": "pipelines.ray_runtime.quiet_ray_loggers"}


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ray-address`` and ``--num-cpus``, spelled and explained alike in every entry point."""
    parser.add_argument("--ray-address", help=ADDRESS_HELP)
    parser.add_argument("--num-cpus", type=int, help=NUM_CPUS_HELP)


# Ray 2.60 turns the loopback address asked of it (``_node_ip_address="127.0.0.1"``, ``ray start
# --node-ip-address=127.0.0.1``) into the machine's own address unless this is set to 0 (its name is
# historical: on Linux it defaults to 1). With the node address 127.0.0.1, GCS, the raylet, the workers,
# the dashboard and runtime-env agents and the metrics exporter all bind 127.0.0.1 instead of all
# interfaces (tests/pipelines/test_ray_runtime.py checks it with ``ss``).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_only(ray) -> None:
    """Make the Ray about to start embedded here bind the loopback interface only.

    The variable is read when ``ray`` is imported, which may have happened already (``from ray import
    serve``), so the constant it sets is set too. It is inherited by every process the embedded Ray
    starts. Never used when joining a cluster: a driver that joins one must advertise a reachable address.
    """
    os.environ[LOOPBACK_ENV] = "0"
    # Gloo (Ray Train's CPU process group) listens on the address the host name resolves to unless told
    # which interface to use; the workers of a local Ray meet on loopback.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def start_ray(address: str | None = None, num_cpus: int | None = None, who: str = "seeder"):
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        ray.init(address=address, log_to_driver=True, runtime_env=RUNTIME_ENV)
        return ray
    loopback_only(ray)
    # Ray gives its raylet a fixed time to register; on an overloaded machine that can fail once.
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                     log_to_driver=True, runtime_env=RUNTIME_ENV)
            return ray
        except Exception as exc:  # Ray raises a bare Exception for a startup timeout
            ray.shutdown()
            if "timed out" not in str(exc) or attempt == STARTUP_ATTEMPTS:
                raise RuntimeError(
                    f"{who}: a local Ray did not start ({exc}); the machine may be overloaded: retry, raise "
                    "RAY_raylet_start_wait_time_s, or pass the address of a running cluster"
                ) from exc
            print(f"{who}: Ray did not start ({exc}); retrying", file=sys.stderr, flush=True)
