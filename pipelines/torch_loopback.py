"""Ray Train's torch process group without a socket on all interfaces when its workers meet on loopback.

Ray Train sets ``MASTER_ADDR`` to the node's address (127.0.0.1 on the embedded Ray of
pipelines/ray_runtime.py) and torch's rank 0 then starts a ``TCPStore`` server for the rendezvous. That
server listens on every interface whatever ``MASTER_ADDR`` says (``ss -ltnp`` shows ``*:PORT`` owned by
``ray::RayTrainWorker``). ``LoopbackTorchConfig`` makes rank 0 bind the store's socket to ``MASTER_ADDR``
itself when that is a loopback address, and hands it to ``TCPStore(master_listen_fd=...)``. On a cluster
(``MASTER_ADDR`` is a routable address) nothing changes.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from ray.train.torch import TorchConfig
from ray.train.torch.config import _TorchBackend

_MARK = "_seeder_loopback_store"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def bind_store_to_loopback() -> None:
    """In a Ray Train worker, before Ray Train calls ``init_process_group``: rank 0's rendezvous store
    listens on ``MASTER_ADDR`` alone when that is a loopback address. Idempotent."""
    import importlib

    from torch.distributed import TCPStore

    # Not ``import torch.distributed.rendezvous as ...``: torch.distributed's function of that name shadows it.
    rendezvous = importlib.import_module("torch.distributed.rendezvous")

    original = rendezvous._create_c10d_store
    if getattr(original, _MARK, False):
        return

    def create_store(hostname, port, rank, world_size, timeout, use_libuv=True):
        if rank != 0 or not is_loopback(hostname) or rendezvous._torchelastic_use_agent_store():
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        family = socket.AF_INET6 if ":" in hostname else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((hostname, port))
            sock.listen(socket.SOMAXCONN)
        except OSError:
            sock.close()
            raise
        # The store owns the descriptor from here on (libuv backend: the only one taking a bound socket).
        return TCPStore(
            host_name=hostname,
            port=port,
            world_size=world_size,
            is_master=True,
            timeout=timeout,
            multi_tenant=True,
            master_listen_fd=sock.detach(),
            use_libuv=True,
        )

    setattr(create_store, _MARK, True)
    rendezvous._create_c10d_store = create_store


class _LoopbackTorchBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config):
        worker_group.execute(bind_store_to_loopback)
        super().on_start(worker_group, backend_config)


@dataclass
class LoopbackTorchConfig(TorchConfig):
    """``TorchConfig`` whose rank 0 rendezvous store binds a loopback ``MASTER_ADDR`` only (see above)."""

    @property
    def backend_cls(self):
        return _LoopbackTorchBackend
