"""The one registry of Ray's internals (``cgc.runtime.ray_internals``): every package's
source touches Ray's private names only through it, every entry resolves on the installed
Ray, and another Ray release is reported clearly, naming the internal and the version.

(The frontend's reads of instance attributes on sample Ray DAG objects are checked in
``tests/frontend/test_ray_private.py``; this file needs no Ray cluster.)"""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest
import ray

from cgc.errors import CompileError, RayVersionError
from cgc.runtime import ray_internals as ri
from cgc.runtime.ray_internals import check as ri_check

ROOT = Path(ri.__file__).resolve().parents[2]
PACKAGES = ("cgc", "runtime", "plan_schema")  # every package cgc installs
REGISTRY = ROOT / "runtime" / "ray_internals"

# Ray's dunders (``__ray_call__``, ``__ray_metadata__``): cgc names nothing of its own so.
RAY_DUNDER = re.compile(r"^__ray_\w+__$")
GETATTR_FAMILY = {"getattr", "setattr", "hasattr", "delattr"}


def _sources() -> dict[Path, str]:
    return {
        p: p.read_text()
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if REGISTRY not in p.parents
    }


def _own_names(trees: list[ast.AST]) -> set[str]:
    """Names cgc defines itself (``self.x = ...``, functions, class attributes): a Ray
    private name cgc also uses for its own object (its builder's ``_options``) is not
    flagged by name alone."""
    own = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        targets = item.targets if isinstance(item, ast.Assign) else (
                            [item.target] if isinstance(item, ast.AnnAssign) else [])
                        own.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                            and t.value.id == "self"):
                        own.add(t.attr)
    return own


def _ray_class_names() -> set[str]:
    """The underscored attributes of every Ray class the table names (``ActorHandle``,
    ``DAGNode``, ``CompiledDAGRef``...): what the class and its bases define, and what
    their ``__init__`` sets. Why: a touch of one of Ray's private attributes that the table
    does not list (``handle._actor_id`` beside the listed ``_ray_actor_id``) is found too."""
    plain = set(dir(object)) | set(dir(type))
    names: set[str] = set()
    for use in ri.PRIVATE_API:
        parts = use.name.split(".")
        for i in range(1, len(parts) + 1):
            try:
                obj = ri_check._resolve(use.module, ".".join(parts[:i]))
            except (ImportError, AttributeError):
                break
            if not isinstance(obj, type) or not obj.__module__.startswith("ray"):
                continue
            for klass in obj.__mro__:
                if not klass.__module__.startswith("ray"):
                    continue
                names.update(n for n in vars(klass) if n.startswith("_"))
                code = getattr(vars(klass).get("__init__"), "__code__", None)
                names.update(n for n in (code.co_names if code else ()) if n.startswith("_"))
    return names - plain


def private_names(own: set[str]) -> set[str]:
    """Every underscored name of Ray's in the registry's table and of the Ray classes it
    names, less cgc's own."""
    names = _ray_class_names()
    for use in ri.PRIVATE_API:
        names.update(part for part in use.name.split(".") if part.startswith("_"))
    names.discard("__init__")
    return {n for n in names if RAY_DUNDER.match(n) or n not in own}


def _is_private_ray_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "ray" and any(p.startswith("_") for p in parts[1:])


def scan(path: str, text: str, names: set[str]) -> list[str]:
    """``path:line: what`` for each touch of Ray's private API in ``text``: an import of a
    private Ray module (``ray._private``, ``ray._raylet``) or of an underscored name from
    Ray (``from ray.dag.compiled_dag_node import _compiled_dags``), an attribute access or
    a ``getattr``-family string of a private name, a ``ray._x`` attribute, and a string
    that is one of Ray's ``_ray`` names (``"_ray_system"``)."""
    tree = ast.parse(text)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    hits = []

    def hit(node: ast.AST, what: str) -> None:
        hits.append(f"{path}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_private_ray_module(alias.name):
                    hit(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray":
            module = node.module or ""
            if _is_private_ray_module(module):
                hit(node, f"from {module} import ...")
            for alias in node.names:
                if alias.name.startswith("_"):
                    hit(node, f"from {module} import {alias.name}")
        elif isinstance(node, ast.Attribute):
            if node.attr in names or RAY_DUNDER.match(node.attr):
                hit(node, f".{node.attr}")
            elif (isinstance(node.value, ast.Name) and node.value.id == "ray"
                  and node.attr.startswith("_")):
                hit(node, f"ray.{node.attr}")
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else (
                fn.attr if isinstance(fn, ast.Attribute) else "")
            first = node.args[0] if node.args else None
            second = node.args[1] if len(node.args) > 1 else None
            if (name in GETATTR_FAMILY and isinstance(second, ast.Constant)
                    and second.value in names):
                hit(node, f"{name}(..., {second.value!r})")
            if (name == "import_module" and isinstance(first, ast.Constant)
                    and isinstance(first.value, str) and _is_private_ray_module(first.value)):
                hit(node, f"import_module({first.value!r})")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings and node.value in names
              and node.value.startswith(("_ray", "__ray"))):
            hit(node, repr(node.value))
    return hits


def _scan_all() -> list[str]:
    sources = _sources()
    names = private_names(_own_names([ast.parse(t) for t in sources.values()]))
    return [h for p, t in sources.items() for h in scan(str(p.relative_to(ROOT)), t, names)]


def test_no_package_touches_ray_internals_outside_the_registry():
    sources = _sources()
    assert {p.relative_to(ROOT).parts[0] for p in sources} == set(PACKAGES)
    names = private_names(_own_names([ast.parse(t) for t in sources.values()]))
    # The scan knows the names the issue found touched directly (not shadowed by cgc's own).
    assert {"_bound_args", "_PyObjScanner", "__ray_metadata__", "_ray_actor_id",
            "__ray_call__", "_ray_system", "_compiled_dags",
            "_channel_index"} <= names
    found = _scan_all()
    assert not found, (
        "use Ray's internals through cgc.runtime.ray_internals (add an entry to its "
        "PRIVATE_API and an accessor):\n" + "\n".join(found))


PROBE = '''\
"""Docstrings may say __ray_call__ and "_ray_system"."""
import ray._private.worker
from ray._raylet import PythonFunctionDescriptor
from ray.dag.compiled_dag_node import _compiled_dags
import importlib


def f(h, node, ref):
    h.__ray_call__.remote(f)
    h.__ray_call__.options(concurrency_group="_ray_system")
    x = node._bound_args
    y = getattr(node, "_bound_kwargs")
    ref._execution_index = 3
    importlib.import_module("ray._private.utils")
    return ray._raylet, h._ray_actor_id, h._actor_id
'''


def test_the_scan_finds_every_kind_of_touch_in_a_probe(tmp_path: Path):
    # The scan above must be able to fail: each touch of the probe is named with its line.
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    names = private_names(set())
    found = scan("probe.py", probe.read_text(), names)
    expected = [
        "probe.py:2: import ray._private.worker",
        "probe.py:3: from ray._raylet import ...",
        "probe.py:4: from ray.dag.compiled_dag_node import _compiled_dags",
        "probe.py:9: .__ray_call__",
        "probe.py:10: .__ray_call__",
        "probe.py:10: '_ray_system'",
        "probe.py:11: ._bound_args",
        "probe.py:12: getattr(..., '_bound_kwargs')",
        "probe.py:13: ._execution_index",
        "probe.py:14: import_module('ray._private.utils')",
        "probe.py:15: ray._raylet",
        "probe.py:15: ._ray_actor_id",
        "probe.py:15: ._actor_id",  # Ray's, though the table lists only _ray_actor_id
    ]
    assert sorted(found) == sorted(expected)
    # cgc's own attribute of a Ray private name is not flagged by name alone...
    own = scan("own.py", "def g(self):\n    return self._bound_args\n",
               private_names({"_bound_args"}))
    assert own == []
    # ...but Ray's dunders always are.
    assert private_names({"__ray_call__"}) >= {"__ray_call__"}


def test_every_registry_entry_resolves_on_the_installed_ray():
    assert ray.__version__.startswith(ri.WRITTEN_FOR + "."), (
        f"the registry was written for Ray {ri.WRITTEN_FOR}; Ray {ray.__version__} is "
        "installed: check every entry of cgc.runtime.ray_internals.PRIVATE_API, then "
        "update WRITTEN_FOR")
    assert ri.missing_internals() == []
    # Module-level entries, written attributes, names (instance reads on sample objects:
    # tests/frontend/test_ray_private.py).
    assert [p for p in ri.check_private_api([]) if not p.startswith("no sample")] == []
    assert ri.version_problem() is None
    ri.check_version(strict=True)
    for use in ri.PRIVATE_API:
        assert use.why and hasattr(ri, use.accessor), use
        assert use.accessor in ri.__all__, use
    # Ray's registry, record type and ref types are what the accessors give.
    assert ri.compiled_dag_registry() is not None
    assert ri.executable_task_record().__name__ == "_ExecutableTaskRecord"


@pytest.fixture
def fake_ray_version(monkeypatch):
    monkeypatch.setattr(ray, "__version__", "9.1.0")
    monkeypatch.setattr(ri_check, "_version_warned", [])
    ri_check._module_level_ok.cache_clear()
    yield
    ri_check._module_level_ok.cache_clear()


def test_another_ray_release_is_reported_once_naming_both_versions(fake_ray_version):
    with pytest.raises(RayVersionError) as info:
        ri.check_version(strict=True)
    msg = str(info.value)
    assert isinstance(info.value, CompileError) and info.value.exit_code == 3
    assert "Ray 2.60" in msg and "installed Ray is 9.1.0" in msg
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ri.check_version()
        ri.check_version()
        ri.require()  # the frontend's check warns through the same one-shot
    got = [w for w in caught if issubclass(w.category, ri.RayVersionWarning)]
    assert len(got) == 1 and "9.1.0" in str(got[0].message)


def test_another_release_missing_an_internal_names_it(fake_ray_version, monkeypatch):
    import ray.dag.compiled_dag_node as cdn

    monkeypatch.delattr(cdn, "_compiled_dags")
    problem = ri.version_problem()
    assert problem is not None
    assert "9.1.0" in problem and "ray.dag.compiled_dag_node._compiled_dags" in problem
    with pytest.raises(RayVersionError,
                       match=r"Ray 9\.1\.0 has no ray\.dag\.compiled_dag_node\._compiled_dags"):
        ri.require()
    # Where the internal only serves a feature, the accessor degrades instead.
    assert ri.compiled_dag_registry() is None


def test_a_runtime_accessor_on_a_changed_ray_names_the_internal_and_the_runtime():
    class OldHandle:  # an actor handle of a Ray release without __ray_call__
        pass

    with pytest.raises(RayVersionError, match=r"has no .*OldHandle\.__ray_call__, which "
                                              r"cgc's runtime uses .*written for Ray 2\.60"):
        ri.call_in_actor(OldHandle(), print, system_group=True)
    with pytest.raises(RayVersionError, match=r"OldHandle\._ray_actor_id, which cgc's runtime"):
        ri.handle_id(OldHandle())
