"""cgc: an ahead-of-time compiler and runtime for static graphs of Ray actor method calls.

Public API (names follow Ray's DAG API, so porting is an import change)::

    import cgc
    from cgc import InputNode, MultiOutputNode

    @cgc.actor(num_cpus=1)
    class Worker:
        def fwd(self, x):
            return x + 1

    w = Worker.bind()
    with InputNode() as inp:
        dag = w.fwd.bind(inp)
    plan = cgc.compile(dag)          # or cgc.load("plan.cgplan")
    with plan.start() as graph:
        assert graph.execute(1).get() == 2

Attributes are loaded lazily so that ``import cgc`` (and ``cgc --help``) stay cheap and
``import cgc.runtime`` never pulls in the compiler. ``__version__`` too: ``import cgc`` imports
nothing of cgc's own, so the ``cgc`` command's entry (``cgc.cli.entry``) takes over Ctrl-C
before any heavy import (protobuf, click) begins.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cgc.plan_schema.version import CGC_VERSION as __version__

__all__ = [
    "__version__",
    "actor",
    "method",
    "InputNode",
    "MultiOutputNode",
    "allreduce",
    "allgather",
    "reducescatter",
    "ReduceOp",
    "WeightSpec",
    "weight_sync",
    "compile",
    "compile_file",
    "trace",
    "load",
    "Plan",
]

_LAZY = {
    "__version__": "cgc.plan_schema.version",
    "actor": "cgc.frontend",
    "method": "cgc.frontend",
    "InputNode": "cgc.frontend",
    "MultiOutputNode": "cgc.frontend",
    "allreduce": "cgc.frontend",
    "allgather": "cgc.frontend",
    "reducescatter": "cgc.frontend",
    "ReduceOp": "cgc.frontend",
    "WeightSpec": "cgc.frontend",
    "weight_sync": "cgc.frontend",
    "compile": "cgc.api",
    "compile_file": "cgc.api",
    "trace": "cgc.traced_step",
    "load": "cgc.runtime",
    "Plan": "cgc.runtime",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cgc' has no attribute {name!r}")
    source = "CGC_VERSION" if name == "__version__" else name
    value = getattr(importlib.import_module(module), source)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
