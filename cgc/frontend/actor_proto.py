"""Encoding actors into ``pb.Actor``: class reference (with embedded model source), options.

A class defined in the model file itself is not importable on the actors' machines, so
its module's whole source travels in the plan (``Graph.modules``, once) and the
runtime loads it under ``ClassRef.module``.

A class of ``__main__`` (a script, ``python -c``, stdin, a notebook cell) travels by value
instead, pickled with cloudpickle into ``ClassRef.pickled_class``, as Ray carries such
classes: executing the script again in every actor would re-run whatever it does at the
top level (compile, overwrite files, start graphs), and ``-c``/stdin/notebooks have no file
to execute. The plan then needs trust (unpickling runs code).
"""

from __future__ import annotations

import json
import os
import re
import sys
from types import ModuleType
from typing import Any

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["class_ref", "pickle_class", "options_proto", "derive_names"]


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def pickle_class(cls: type) -> bytes:
    """``cls`` pickled by value (cloudpickle, the copy Ray ships, which the runtime has too).

    Example: ``ClassRef(module="__main__", qualname="W", pickled_class=pickle_class(W))``.

    Raises:
        pickle.PicklingError, TypeError: something the class refers to cannot be pickled.
    """
    from ray import cloudpickle

    return cloudpickle.dumps(cls)


def class_ref(
    module: str,
    qualname: str,
    *,
    model_file: str | os.PathLike[str] | None,
    model_module: ModuleType | None,
    cls: type | None = None,
) -> tuple[pb.ClassRef, str | None, pb.EmbeddedModule | None]:
    """The ClassRef of a class, a problem text when it cannot be re-imported, and the
    module to embed when the actors cannot import it. A class of ``__main__`` (``cls``
    given) is pickled into the ClassRef instead.

    Example: a class ``Worker`` in the model module gets an ``EmbeddedModule`` holding the
    model file.

    Raises:
        OSError: the model file cannot be read.
    """
    ref = pb.ClassRef(module=module, qualname=qualname)
    if module == "__main__":
        return _by_value(ref, cls)
    if "<locals>" in qualname:
        return ref, (
            f"class {qualname} is defined inside a function, so the actors cannot "
            "import it; define it at module level"
        ), None
    source_path: str | None = None
    in_model = model_module is not None and module == model_module.__name__
    if not in_model and model_file is not None:
        mod = sys.modules.get(module)
        mod_file: str | None = getattr(mod, "__file__", None)
        if mod_file:
            in_model = os.path.abspath(mod_file) == os.path.abspath(model_file)
    if in_model:
        source_path = (
            os.fspath(model_file)
            if model_file is not None
            else getattr(model_module, "__file__", None)
        )
    if source_path:
        embedded = pb.EmbeddedModule(
            name=ref.module, source=_read(source_path), source_file=os.path.basename(source_path)
        )
        return ref, None, embedded
    return ref, None, None


def _by_value(ref: pb.ClassRef, cls: type | None) -> tuple[pb.ClassRef, str | None, None]:
    """A ``__main__`` class carried by value (see the module docstring)."""
    if cls is None:
        return ref, (
            f"class {ref.qualname} of __main__ is not at hand to carry by value (only its "
            "name is known); bind the class itself"
        ), None
    try:
        ref.pickled_class = pickle_class(cls)
    except Exception as exc:  # noqa: BLE001 - cloudpickle raises many kinds
        return ref, (
            f"class {ref.qualname} of __main__ cannot be pickled to carry it to the actors "
            f"({type(exc).__name__}: {exc}); move it to a module the actors can import"
        ), None
    return ref, None, None


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def options_proto(options: dict[str, Any]) -> tuple[pb.ActorOptions, str | None]:
    """Encode actor options; returns (options, problem text or None).

    >>> options_proto({"num_gpus": 1})[0].num_gpus
    1.0
    >>> options_proto({"num_cpus": "many"})[1]
    "actor options cannot be stored in a plan: could not convert string to float: 'many'"

    Raises:
        Nothing; bad values come back as the problem text.
    """
    out = pb.ActorOptions()
    try:
        for key in ("num_cpus", "num_gpus", "memory"):
            if options.get(key) is not None:
                setattr(out, key, float(options[key]))
        resources = options.get("resources") or {}
        for name in sorted(resources):
            out.resources.add(name=str(name), amount=float(resources[name]))
        env = options.get("runtime_env")
        if env:
            out.runtime_env_json = _canonical_json(dict(env))
        if options.get("max_concurrency") is not None:
            out.max_concurrency = int(options["max_concurrency"])
        out.actor_name = options.get("name") or ""
        out.namespace = options.get("namespace") or ""
    except (TypeError, ValueError) as exc:
        return out, f"actor options cannot be stored in a plan: {exc}"
    return out, None


def _snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s)
    s = re.sub(r"\W", "_", s).strip("_").lower()
    return s if s and not s[0].isdigit() else f"a_{s}"


def _ident(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else f"a_{s}"


def derive_names(actors: list[tuple[str, str]]) -> list[str]:
    """Stable unique identifier names for actors given as (user name or "", class name).

    User names are kept (made identifiers); others are the class name in snake case, with
    an index when the class has several actors: ``worker0``, ``worker1``.

    >>> derive_names([("", "Worker"), ("", "Worker"), ("trainer", "Worker"), ("", "KVCache")])
    ['worker0', 'worker1', 'trainer', 'kv_cache']

    Raises:
        Nothing.
    """
    taken = {_ident(u) for u, _ in actors if u}
    bases = [_snake(c) for _, c in actors]
    counts: dict[str, int] = {}
    for (user, _), base in zip(actors, bases, strict=True):
        if not user:
            counts[base] = counts.get(base, 0) + 1
    next_index: dict[str, int] = {}
    names = []
    for (user, _), base in zip(actors, bases, strict=True):
        if user:
            names.append(_ident(user))
            continue
        if counts[base] == 1 and base not in taken:
            names.append(base)
            taken.add(base)
            continue
        sep = "_" if base[-1].isdigit() else ""
        i = next_index.get(base, 0)
        while f"{base}{sep}{i}" in taken:
            i += 1
        next_index[base] = i + 1
        names.append(f"{base}{sep}{i}")
        taken.add(names[-1])
    return names
