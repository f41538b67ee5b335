"""Loading a model file and finding its graph and example inputs.

A model file is a Python file that builds a DAG. ``cgc compile model.py`` imports it and
takes the graph from ``build_dag()``; ``model.py:ATTR`` names another function, a DAG
node, or a step function of ``.remote()`` calls (traced with the example inputs). If it defines ``example_inputs()``, that returns one execution's positional arguments
(a tuple); ``example_kwargs()``, its keyword arguments (a dict).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cgc.errors import CompileError
from cgc.frontend.ray_private import is_ray_dag_object
from cgc.plan_schema.requirements import imported_names

__all__ = [
    "ModelFile",
    "load_model_file",
    "split_target",
    "module_name_for",
    "graph_output",
    "example_inputs",
    "example_kwargs",
    "sibling_modules",
]

DEFAULT_ATTR = "build_dag"


@dataclass
class ModelFile:
    """A loaded model file: its path, module, and the attribute naming the graph."""

    path: Path
    module: ModuleType
    attr: str
    step: Any = None  # the StepTrace when the attribute is a traced step


def split_target(target: str) -> tuple[Path, str | None]:
    """Split ``FILE[:ATTR]`` into the path and the attribute (None when absent).

    >>> split_target("models/m.py:make")
    (PosixPath('models/m.py'), 'make')
    >>> split_target("models/m.py")
    (PosixPath('models/m.py'), None)
    """
    path, sep, attr = target.rpartition(":")
    if sep and path and attr.isidentifier():
        return Path(path), attr
    return Path(target), None


def module_name_for(path: Path) -> str:
    """The module name a model file is loaded under, here and on the actors.

    Prefixed so that a model called ``queue.py`` never shadows the standard library
    inside an actor process that loads its embedded source.
    """
    stem = re.sub(r"\W", "_", path.stem)
    return f"cgcmodel_{stem}"


def load_model_file(path: Path, attr: str | None = None) -> ModelFile:
    """Import a model file as a fresh module.

    Raises:
        CompileError: the file is missing, is not Python, or raises while importing.
    """
    if not path.is_file():
        raise CompileError(f"{path}: no such model file")
    if path.suffix != ".py":
        raise CompileError(f"{path}: a model file must be a Python file (.py)")
    name = module_name_for(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CompileError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    folder = str(path.resolve().parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)  # let the model import its sibling modules
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise CompileError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise CompileError(
            f"{user_frame(exc, path)}: importing the model file raised {type(exc).__name__}: {exc}"
            + actor_hint(exc)
        ) from exc
    finally:
        if added:
            sys.path.remove(folder)
    return ModelFile(path=path, module=module, attr=attr or DEFAULT_ATTR)


def actor_hint(exc: BaseException) -> str:
    """A hint when ``exc`` is ``Cls.bind`` (or ``.remote``/``.options``) looked up on a plain
    class: the class lacks ``@cgc.actor``; ``""`` for any other exception.

    Example: for ``Worker.bind()`` on an undecorated ``class Worker`` the text is
    ``"; class Worker is not an actor class: decorate it with @cgc.actor (or @ray.remote)"``.
    """
    if not isinstance(exc, AttributeError) or exc.name not in ("bind", "remote", "options"):
        return ""
    obj = getattr(exc, "obj", None)
    if not isinstance(obj, type):
        return ""
    return (f"; class {obj.__name__} is not an actor class: decorate it with @cgc.actor "
            f"(or @ray.remote) to call {obj.__name__}.{exc.name}()")


def user_frame(exc: BaseException, path: Path) -> str:
    """``file:line`` of the deepest traceback frame inside the model file, else the file."""
    where = str(path)
    target = str(path.resolve())
    for frame in traceback.extract_tb(exc.__traceback__):
        if str(Path(frame.filename).resolve()) == target:
            where = f"{path}:{frame.lineno}"
    return where


def graph_output(model: ModelFile) -> Any:
    """Call (or fetch) the model's graph attribute and return the DAG output node.

    Raises:
        CompileError: the attribute is missing, or calling it raises.
    """
    obj = getattr(model.module, model.attr, None)
    if obj is None:
        hint = f"; name the graph with {model.path}:ATTR" if model.attr == DEFAULT_ATTR else ""
        raise CompileError(f"{model.path} defines no {model.attr}(){hint}")
    if not callable(obj) or _is_dag_node(obj):
        return obj
    from cgc.frontend.step_tracer import trace_step

    # A function of no arguments may build a DAG (build_dag) or be a step of .remote()
    # calls without inputs; one with arguments is a step, traced with the examples.
    obj = getattr(obj, "__cgc_step_fn__", obj)  # a @cgc.trace step: its function
    takes_args = _required_params(obj) > 0
    args = (example_inputs(model) or ()) if takes_args else ()
    kwargs = (example_kwargs(model) or {}) if takes_args else {}
    try:
        traced = trace_step(obj, args, kwargs, allow_dag=not takes_args)
        if traced.dag is not None:
            return traced.dag
        model.step = traced
        return traced.output
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(
            f"{user_frame(exc, model.path)}: {model.attr}() raised {type(exc).__name__}: {exc}"
            + actor_hint(exc)
        ) from exc


def _required_params(fn: Any) -> int:
    """How many parameters ``fn`` needs (0 when its signature cannot be read)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(1 for p in params if p.default is p.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def example_inputs(model: ModelFile) -> tuple[Any, ...] | None:
    """The model's ``example_inputs()`` as a tuple, or None when it defines none.

    Raises:
        CompileError: it raises, or does not return a tuple.
    """
    fn = getattr(model.module, "example_inputs", None)
    if fn is None:
        return None
    try:
        value = fn()
    except Exception as exc:
        raise CompileError(
            f"{user_frame(exc, model.path)}: example_inputs() raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(value, tuple):
        raise CompileError(
            f"{model.path}: example_inputs() must return a tuple of one execution's positional "
            f"arguments, got {type(value).__name__} (write `return (x,)` for one argument)"
        )
    return value


def example_kwargs(model: ModelFile) -> dict[str, Any] | None:
    """The model's ``example_kwargs()`` as a dict, or None when it defines none.

    Example: a model file with ``def example_kwargs(): return {"scale": 3}``.

    Raises:
        CompileError: it raises, or does not return a dict with identifier keys.
    """
    fn = getattr(model.module, "example_kwargs", None)
    if fn is None:
        return None
    try:
        value = fn()
    except Exception as exc:
        raise CompileError(
            f"{user_frame(exc, model.path)}: example_kwargs() raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k.isidentifier() for k in value
    ):
        raise CompileError(
            f"{model.path}: example_kwargs() must return a dict of one execution's keyword "
            f"arguments (names as keys), got {type(value).__name__}"
        )
    return value


def _is_dag_node(obj: Any) -> bool:
    # Ray's DAG nodes and cgc's nodes are callable-free objects, but be explicit: a node
    # is never called to produce the graph.
    return type(obj).__module__.startswith("cgc.frontend") or is_ray_dag_object(obj)


def sibling_modules(model: ModelFile) -> list[tuple[str, str, str]]:
    """The local modules a model file imports from its own folder, for the plan to carry:
    ``(module name, source, file name relative to the folder)``, sorted by name. Followed
    transitively; a package is taken whole.

    Why: the plan embeds the model file, and the actors (or ``cgc run`` started in another
    folder) cannot import ``helpers.py`` that only sits next to it.

    Example: a model doing ``import helpers`` gives ``[("helpers", "<source>", "helpers.py")]``.

    Raises:
        CompileError: an imported local module cannot travel as source (an extension
            module, or a folder without ``__init__.py``); the message names it.
    """
    folder = model.path.resolve().parent
    found: dict[str, tuple[str, str]] = {}
    todo = [(model.path.read_text(encoding="utf-8"), model.path.name, "")]
    while todo:
        source, filename, package = todo.pop()
        for dotted in sorted(imported_names(source, filename, package)):
            top = dotted.split(".")[0]
            if not top or top in found or top == model.path.stem and not package:
                continue
            for path, name, pkg in _local_files(folder, top, model.path):
                text = path.read_text(encoding="utf-8")
                found[name] = (text, str(path.relative_to(folder)))
                todo.append((text, found[name][1], pkg))
    return [(name, *found[name]) for name in sorted(found)]


def _local_files(folder: Path, top: str, model_path: Path) -> list[tuple[Path, str, str]]:
    """(file, module name, package) for a top-level name found in ``folder``; [] if none."""
    single = folder / f"{top}.py"
    if single.is_file() and single.resolve() != model_path.resolve():
        return [(single, top, "")]
    pkg_dir = folder / top
    if (pkg_dir / "__init__.py").is_file():
        out = []
        for path in sorted(pkg_dir.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(folder).with_suffix("").parts
            is_init = rel[-1] == "__init__"
            name = ".".join(rel[:-1] if is_init else rel)
            out.append((path, name, name if is_init else ".".join(rel[:-1])))
        return out
    native = sorted(p.name for p in folder.glob(f"{top}.*")
                    if p.suffix in (".so", ".pyd") or p.name.endswith(".pyc"))
    if native or pkg_dir.is_dir() and any(pkg_dir.glob("*.py")):
        what = native[0] if native else f"{top}/ (a folder without __init__.py)"
        raise CompileError(
            f"{model_path}: imports the local module {top!r} ({what}), which cannot travel "
            "inside the plan as source; install it as a package (pip install -e) or turn it "
            "into a .py file / a package with __init__.py")
    return []
