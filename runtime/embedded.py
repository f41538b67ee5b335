"""Model modules that travel inside a plan, importable by name in every process of a graph.

A class defined in the model file refers to a module the plan carries as source
(``Graph.modules``, under a name such as ``cgcmodel_chain``). Values of other
classes from the same file (a dataclass a method returns, say) are pickled by reference to
that module, so the driver and every actor must be able to import it, not only the actor
that hosts the class. ``register`` installs a finder that builds such a module from its
source the first time anything imports it, so nothing runs a model file that no value
needs.

Trust: registering a module is approving its source to run in this process. The driver
registers a plan's modules only after ``Plan.start()``'s trust gate
(``cgc.runtime.driver.trust_gate.require_trusted``) passed; actors register only what the driver
sends them through Ray's own calls, after that gate. Nothing else in cgc registers, and
``cgc inspect``/``check``/``viz``/``load`` never do.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import linecache
import sys
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["plan_modules", "register"]

_SOURCES: dict[str, tuple[str, str]] = {}  # module name -> (source, file name)
_LOCK = threading.Lock()


class _EmbeddedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the registered embedded modules (and nothing else)."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 - importlib's protocol
        entry = _SOURCES.get(fullname)
        if entry is None:
            return None
        # A package (its __init__.py travelled) gets a search path, so its submodules,
        # registered under their dotted names, are found here too.
        is_pkg = entry[1].replace("\\", "/").endswith("__init__.py")
        return importlib.util.spec_from_loader(fullname, self, origin=entry[1],
                                               is_package=is_pkg)

    def create_module(self, spec: Any) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        source, filename = _SOURCES[module.__name__]
        module.__file__ = filename
        # Tracebacks from user methods show their source lines, file on disk or not.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102


_FINDER = _EmbeddedFinder()


def plan_modules(plan: pb.Plan) -> dict[str, tuple[str, str]]:
    """The embedded modules a plan carries: name -> (source, file name)."""
    return {
        m.name: (m.source, m.source_file or f"<cgc {m.name}>") for m in plan.graph.modules
    }


def register(modules: Mapping[str, tuple[str, str]]) -> None:
    """Make ``modules`` importable in this process (built from source on first import).

    Call only for a plan whose trust decision allows it to run (see the module docstring):
    importing a registered module executes its source.

    Example: ``register(plan_modules(plan)); importlib.import_module("cgcmodel_chain")``.
    """
    if not modules:
        return
    with _LOCK:
        _SOURCES.update(modules)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
