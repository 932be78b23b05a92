"""``make test-quick`` puts this folder first on the path of the test process and of every process it
starts: ``import ray`` still gives the real Ray, but starting or joining a Ray node fails, so a test
that does either must be marked ``e2e``."""

import os
import sys

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
del sys.modules["ray"]
import ray as _ray  # noqa: E402 (the real Ray, found now that this folder is off the path)
import ray._private.node as _node  # noqa: E402


def _refuse(*args, **kwargs):
    raise RuntimeError("make test-quick never starts Ray: mark this test e2e (pytest.mark.e2e), or run make test")


_ray.init = _refuse
_node.Node.__init__ = _refuse
sys.modules["ray"] = _ray
