"""Checking the installed Ray against the table: the version, every entry, and the
accessors' common lookups (a missing internal is a ``RayVersionError`` naming it)."""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from typing import Any

from cgc.plan_schema.errors import RayVersionError
from cgc.runtime.ray_internals.table import (
    PRIVATE_API,
    WRITTEN_FOR,
    PatchTarget,
    RayInternal,
    RayVersionWarning,
    Use,
)


def installed_version() -> str:
    """The version of the Ray imported in this process, or ``"(not imported)"``.

    >>> isinstance(installed_version(), str)
    True

    Raises:
        Nothing.
    """
    return str(getattr(sys.modules.get("ray"), "__version__", "(not imported)"))


def version_problem() -> str | None:
    """Why the installed Ray is not the one this registry was written for, or None.

    Example: ``version_problem() is None`` on Ray 2.60.x.

    Raises:
        Nothing.
    """
    version = installed_version()
    if ".".join(version.split(".")[:2]) == WRITTEN_FOR:
        return None
    missing = missing_internals()
    gaps = (f"; it lacks {', '.join(missing)}" if missing else
            "; every internal cgc resolves at import is there, but their behaviour is "
            "unchecked")
    return (f"cgc's use of Ray's internals (cgc.runtime.ray_internals) was written for "
            f"Ray {WRITTEN_FOR}, and the installed Ray is {version}{gaps}; install "
            f"ray=={WRITTEN_FOR}.* if cgc misbehaves")


_version_warned: list[str] = []


def check_version(strict: bool = False) -> None:
    """Warn once per process (``RayVersionWarning``) when the installed Ray is another
    release than ``WRITTEN_FOR``; with ``strict``, raise instead.

    Example: ``check_version()`` (``require()`` and the runtime's ``start()`` call it).

    Raises:
        RayVersionError: ``strict`` and the installed Ray is another release.
    """
    problem = version_problem()
    if problem is None:
        return
    if strict:
        raise RayVersionError(problem)
    if installed_version() not in _version_warned:
        _version_warned.append(installed_version())
        warnings.warn(problem, RayVersionWarning, stacklevel=2)


# Who uses an internal, and what to do instead of changing Ray, for each side of cgc.
ADAPTER = ("cgc's Ray DAG adapter", " or build the graph with cgc's builder API (cgc.actor, "
           "cgc.InputNode)")
RUNTIME = ("cgc's runtime", "")


def mismatch(what: str, side: tuple[str, str] = ADAPTER) -> RayVersionError:
    """The error for an internal of Ray that is missing or changed; ``side`` is
    ``ADAPTER`` (the frontend and the drop-in) or ``RUNTIME``.

    >>> "Ray" in str(mismatch("ray.dag.dag_node.DAGNode._bound_args"))
    True

    Raises:
        Nothing; the caller raises what it returns.
    """
    return RayVersionError(
        f"the installed Ray {installed_version()} has no {what}, which {side[0]} uses (it "
        f"was written for Ray {WRITTEN_FOR}); install ray=={WRITTEN_FOR}.*{side[1]}"
    )


def _resolve(module: str, name: str) -> Any:
    # Why import_module and not sys.modules: a module another thread is importing is in
    # sys.modules before its body ran (its names missing); import_module waits for it.
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _owner_and_attr(use: RayInternal) -> tuple[str, str]:
    """(what to resolve at module level, the instance attribute or "")."""
    if use.use in (Use.READ, Use.WRITE):
        owner, _, attr = use.name.rpartition(".")
        return owner, attr
    return use.name, ""


# Modules whose import is costly and that a graph without collectives never loads:
# ``ray.experimental.collective`` imports ``ray.util.collective``, which imports torch
# (1.4 s of a 2 s compile). ``require()`` checks their entries once something has loaded
# them (a model file whose graph has a Ray collective has); until then no object of
# theirs can be in the graph.
_DEFERRED_MODULES = ("ray.experimental.collective",)


def _deferred(module: str) -> bool:
    return any(module == d or module.startswith(d + ".") for d in _DEFERRED_MODULES)


def _problems_of(uses: tuple[RayInternal, ...]) -> list[str]:
    problems = []
    for use in uses:
        if use.use in (Use.MARK, Use.NAME):
            continue
        name = _owner_and_attr(use)[0]
        try:
            _resolve(use.module, name)
        except (ImportError, AttributeError):
            problems.append(use.module + "." + name)
    return problems


def _module_level_problems() -> list[str]:
    return sorted(set(_problems_of(PRIVATE_API)))


def missing_internals() -> list[str]:
    """The module-level entries of ``PRIVATE_API`` (modules, classes, functions) that the
    installed Ray lacks, ``module.name`` each.

    Example: ``assert not missing_internals()`` on the Ray cgc was written for.

    Raises:
        Nothing.
    """
    return _module_level_problems()


@functools.cache
def _module_level_ok(module: str) -> tuple[str, ...]:
    """The missing module-level entries of ``module`` (cached: Ray does not change while
    a process runs)."""
    return tuple(_problems_of(tuple(u for u in PRIVATE_API if u.module == module)))


def require() -> None:
    """Check that the installed Ray has every module, class, function and constant in
    ``PRIVATE_API`` (instance attributes are checked where they are read), and warn once
    if it is another release than ``WRITTEN_FOR``. Cached per module. Entries of Ray's
    collective modules are checked only once something has imported them (the model file
    does when its graph has a collective): importing them imports torch, which a graph
    without collectives must not pay for.

    Example::

        require()          # before a Ray DAG is converted

    Raises:
        RayVersionError: one is missing; the message names it and the Ray version.
    """
    modules = dict.fromkeys(u.module for u in PRIVATE_API)  # in order, once each
    missing = sorted({p for m in modules if m in sys.modules or not _deferred(m)
                      for p in _module_level_ok(m)})
    if missing:
        raise mismatch(", ".join(missing))
    check_version()


def _set_in_init(owner: Any, attr: str) -> bool:
    """Whether ``owner.__init__`` (a class's own or a base's) assigns ``self.<attr>``."""
    for klass in getattr(owner, "__mro__", ()):
        code = getattr(klass.__dict__.get("__init__"), "__code__", None)
        if code is not None and attr in code.co_names:
            return True
    return False


def _named_in_source(use: RayInternal) -> bool:
    """Whether the module that gives a ``NAME`` entry its meaning still spells it."""
    import inspect

    try:
        return repr(use.name)[1:-1] in inspect.getsource(importlib.import_module(use.module))
    except (ImportError, OSError, TypeError):
        return False


def check_private_api(samples: list[Any]) -> list[str]:
    """Every entry of ``PRIVATE_API`` that the installed Ray lacks, one line each.

    Module-level entries are resolved by import; an instance attribute (``READ``) is
    looked up on each of ``samples`` that is an instance of its class, and reported
    when no sample is one (so a test sees a gap in its samples too); a written one
    (``WRITE``) must be among the names the class's ``__init__`` sets, and a ``NAME``
    must still be spelled in its module's source.

    Example::

        problems = check_private_api([class_node, method_node, inp, live_handle])
        assert not problems, "\\n".join(problems)

    Raises:
        Nothing; problems are returned.
    """
    problems = [str(mismatch(p)) for p in _module_level_problems()]
    for use in PRIVATE_API:
        if use.use is Use.NAME and not _named_in_source(use):
            problems.append(str(mismatch(use.path)))
        if use.use not in (Use.READ, Use.WRITE):
            continue
        owner_name, attr = _owner_and_attr(use)
        try:
            owner = _resolve(use.module, owner_name)
        except (ImportError, AttributeError):
            continue  # reported above
        if hasattr(owner, attr):
            continue  # defined on the class (method, property, class attribute)
        if use.use is Use.WRITE:
            if not _set_in_init(owner, attr):
                problems.append(str(mismatch(use.path)))
            continue
        mine = [s for s in samples if isinstance(s, owner)]
        if not mine:
            problems.append(f"no sample {use.module}.{owner_name} to check .{attr} on")
        elif not all(hasattr(s, attr) for s in mine):
            problems.append(str(mismatch(use.path)))
    return problems


def _get(obj: Any, attr: str, side: tuple[str, str] = ADAPTER) -> Any:
    """``obj.attr`` for an attribute in ``PRIVATE_API``; a RayVersionError if it is gone."""
    try:
        return getattr(obj, attr)
    except AttributeError:
        kind = type(obj)
        raise mismatch(f"{kind.__module__}.{kind.__qualname__}.{attr}", side) from None


def _import(module: str, name: str) -> Any:
    try:
        return _resolve(module, name)
    except (ImportError, AttributeError):
        raise mismatch(f"{module}.{name}") from None


def patch_original(target: PatchTarget, module: Any) -> tuple[Any, Any]:
    """(owner, original function) of a patch target in the loaded ``module``.

    Example::

        owner, orig = patch_original(PATCH_NODE_INIT, sys.modules["ray.dag.dag_node"])

    Raises:
        RayVersionError: the module has no such function.
    """
    try:
        owner = getattr(module, target.owner) if target.owner else module
        # A class's own entry, never one inherited (restoring must not shadow a base's).
        orig = owner.__dict__[target.attr] if isinstance(owner, type) else getattr(
            owner, target.attr
        )
    except (AttributeError, KeyError):
        dotted = ".".join(p for p in (target.module, target.owner, target.attr) if p)
        raise mismatch(dotted) from None
    return owner, orig


