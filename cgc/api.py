"""The compiler's Python API: ``cgc.compile(dag)`` and ``cgc.compile_file(path)``.

Both run the same pipeline as ``cgc compile``: trace the DAG (frontend) → lower it
(passes: transports, channels, schedule, overlap, capacity) → verify → an in-memory
``cgc.runtime.Plan`` that can be saved or started.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cgc.errors import CompileError
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.values import ValueEncodeError, encode_value

__all__ = ["compile", "compile_file"]


def compile(  # noqa: A001 - the public name mirrors Ray's experimental_compile
    dag: Any,
    *,
    name: str = "graph",
    example_inputs: tuple[Any, ...] | None = None,
    allow_pickle: bool = False,
    overlap: bool | None = None,
    costs: Mapping[str, float] | None = None,
    _model: Any = None,
) -> Any:
    """Compile a DAG into a verified plan in memory.

    ``dag`` is the output of a graph built with cgc's builder or with Ray's DAG API (its
    actors may be lazy ``Cls.bind()`` actors or live handles from ``Cls.remote()``).

    Example::

        plan = cgc.compile(dag)
        with plan.start() as graph:
            print(graph.execute(1).get())

    Raises:
        CompileError: the graph is invalid (the message names the node, actor, method and
            source line).
        cgc.verify.DeadlockError: the lowered programs could deadlock (a compiler bug).
    """
    from cgc import frontend, passes
    from cgc.runtime import Plan

    traced = frontend.trace(
        dag,
        allow_pickle=allow_pickle,
        model_file=_model.path if _model is not None else None,
        model_module=_model.module if _model is not None else None,
    )
    proto = pb.Plan(name=name)
    proto.graph.CopyFrom(traced.graph)
    proto.needs_trust = traced.needs_trust
    if _model is not None:
        proto.source.file = _model.path.name
        proto.source.attr = _model.attr
    if example_inputs is not None:
        proto.has_example_inputs = True
        for i, arg in enumerate(example_inputs):
            try:
                value, pickled = encode_value(
                    arg, allow_pickle=allow_pickle, path=f"example_inputs()[{i}]"
                )
            except ValueEncodeError as exc:
                raise CompileError(str(exc)) from None
            proto.example_args.append(value)
            proto.needs_trust |= pickled
    options = passes.LowerOptions(overlap=overlap, costs=dict(costs or {}))
    lowered = passes.lower(proto, options)
    return Plan(lowered, live_handles=traced.live_handles, classes=traced.classes)


def compile_file(
    target: str | Path,
    attr: str | None = None,
    *,
    allow_pickle: bool = False,
    overlap: bool | None = None,
    costs: Mapping[str, float] | None = None,
) -> Any:
    """Compile a model file (``build_dag()``, or ``attr``) into a plan in memory.

    ``target`` may be ``"model.py"`` or ``"model.py:ATTR"``. The model's
    ``example_inputs()``, if defined, is stored in the plan for ``cgc run``.

    Example: ``cgc.compile_file("examples/chain.py").save("chain.cgplan")``.

    Raises:
        CompileError: the file cannot be imported, defines no graph, or the graph is invalid.
    """
    from cgc import frontend
    from cgc import model_file as mf

    path, parsed_attr = mf.split_target(str(target))
    attr = attr or parsed_attr
    # Ray's DAG nodes do not record where they were bound; note it while the model runs.
    recorder = getattr(frontend, "record_ray_bind_sites", None)
    with recorder() if recorder is not None else contextlib.nullcontext():
        model = mf.load_model_file(path, attr)
        output = mf.graph_output(model)
    inputs = mf.example_inputs(model)
    return compile(
        output,
        name=path.stem,
        example_inputs=inputs,
        allow_pickle=allow_pickle,
        overlap=overlap,
        costs=costs,
        _model=model,
    )
