"""The compiler's Python API: ``cgc.compile(dag)``, ``cgc.compile(step, example_inputs=)``
and ``cgc.compile_file(path)`` (``@cgc.trace`` is in ``cgc.traced_step``).

All run the same pipeline as ``cgc compile``: trace the DAG or the step (frontend) → lower it
(``cgc.passes.PIPELINE``) → verify → an in-memory ``cgc.runtime.Plan`` that can be saved
or started.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cgc.errors import CompileError
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import ConfigError
from cgc.plan_schema.values import ValueEncodeError, encode_value

__all__ = ["compile", "compile_file"]


def _encode(obj: Any, allow_pickle: bool, path: str) -> tuple[pb.Value, bool]:
    try:
        return encode_value(obj, allow_pickle=allow_pickle, path=path)
    except ValueEncodeError as exc:
        raise CompileError(str(exc)) from None


def _store_examples(
    proto: pb.Plan,
    args: tuple[Any, ...] | None,
    kwargs: Mapping[str, Any] | None,
    allow_pickle: bool,
) -> None:
    """Store one execution's example arguments in the plan (for ``cgc run``)."""
    if args is None and kwargs is None:
        return
    proto.has_example_inputs = True
    for i, arg in enumerate(args or ()):
        value, pickled = _encode(arg, allow_pickle, f"example_inputs()[{i}]")
        proto.example_args.append(value)
        proto.needs_trust |= pickled
    for name, obj in sorted((kwargs or {}).items()):
        if not isinstance(name, str) or not name.isidentifier():
            raise CompileError(f"example keyword {name!r} is not an identifier")
        value, pickled = _encode(obj, allow_pickle, f"example_kwargs()[{name!r}]")
        proto.example_kwargs.add(name=name).value.CopyFrom(value)
        proto.needs_trust |= pickled


def _embed_siblings(proto: pb.Plan, model: Any) -> None:
    """Carry the local modules the model file imports from its folder (``helpers.py``),
    so the plan runs from any folder. Only when the plan embeds the model already, or an
    actor's class lives in such a module: otherwise no plan code imports them, and a plan
    of installed classes stays one that needs no trust."""
    from cgc import model_file as mf

    g = proto.graph
    siblings = mf.sibling_modules(model)
    local = {n.split(".")[0] for n, _, _ in siblings}
    if not g.modules and not any(a.cls.module.split(".")[0] in local for a in g.actors
                                 if not a.external.name and not a.external.actor_id):
        return
    have = {m.name for m in g.modules}
    extra = [pb.EmbeddedModule(name=n, source=src, source_file=f)
             for n, src, f in siblings if n not in have]
    proto.needs_trust = True
    if extra:
        every = sorted([*g.modules, *extra], key=lambda m: m.name)
        del g.modules[:]
        g.modules.extend(every)


def used_examples(
    step: Any, args: tuple[Any, ...] | None, kwargs: Mapping[str, Any] | None
) -> tuple[tuple[Any, ...] | None, dict[str, Any] | None]:
    """The example arguments a traced step's graph reads (an argument that no call uses
    is no input of the graph, so the plan does not store it)."""
    n, keys = step.inputs
    return (None if args is None else tuple(args)[:n],
            None if kwargs is None else {k: kwargs[k] for k in keys})


def _capacity(capacity: int | None, max_inflight: int | None) -> int | None:
    if max_inflight is None:
        return capacity
    if capacity is not None and capacity != max_inflight:
        raise ConfigError(
            f"capacity={capacity} and _max_inflight_executions={max_inflight} disagree "
            "(they are the same setting; give one)"
        )
    return max_inflight


def _check_examples(step: Any, name: str, example_inputs: tuple[Any, ...] | None,
                    example_kwargs: Mapping[str, Any] | None) -> None:
    """Refuse example arguments the step cannot be called with, saying what to pass."""
    from cgc.errors import StepArgumentsError
    from cgc.frontend.locations import capture_loc
    from cgc.frontend.step_tracer import bind_problem, step_parameters

    problem = bind_problem(step, tuple(example_inputs or ()), dict(example_kwargs or {}))
    if problem is None:
        return
    params = step_parameters(step)
    kinds = inspect.Parameter
    positional = [p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY,
                                                       kinds.POSITIONAL_OR_KEYWORD)
                  and p.default is kinds.empty]
    keywords = [p.name for p in params if p.kind is kinds.KEYWORD_ONLY
                and p.default is kinds.empty]
    what = [f"example_inputs=({', '.join(positional)}{',' if len(positional) == 1 else ''})"
            ] if positional else []
    what += [f"example_kwargs={{{', '.join(repr(k) + ': ...' for k in keywords)}}}"
             ] if keywords else []
    loc = capture_loc().short()
    raise StepArgumentsError(
        f"{loc}: cgc.compile({name}): {problem}; a step is traced by calling it once with "
        "example arguments (values of the types and shapes it will get): pass "
        + (" and ".join(what) or "example_inputs=(...) matching its parameters"),
        loc=loc)


def compile(  # noqa: A001 - the public name mirrors Ray's experimental_compile
    dag: Any,
    *,
    name: str = "graph",
    example_inputs: tuple[Any, ...] | None = None,
    example_kwargs: Mapping[str, Any] | None = None,
    allow_pickle: bool = False,
    overlap: bool | None = None,
    costs: Mapping[str, float] | None = None,
    capacity: int | None = None,
    at_capacity: str = "wait",
    _max_inflight_executions: int | None = None,
    _model: Any = None,
    _gpu_hint_without_gpu: str = "refuse",
) -> Any:
    """Compile a DAG into a verified plan in memory.

    ``dag`` is the output of a graph built with cgc's builder or with Ray's DAG API (its
    actors may be lazy ``Cls.bind()`` actors or live handles from ``Cls.remote()``), or a
    *step*: a function of plain Ray actor calls (``h = a.fwd.remote(x)``), traced once
    with ``example_inputs``/``example_kwargs`` as its arguments (see ``docs/tracing.md``:
    each argument is a graph input, the refs it returns are the outputs).

    ``example_inputs`` / ``example_kwargs``: one execution's positional and keyword
    arguments, stored for ``cgc run``. ``capacity``: executions in flight (None: from the
    pipeline depth, at most 8); Ray's ``_max_inflight_executions`` is accepted as its
    other name. ``at_capacity``: what ``execute()`` does when that many are in flight,
    ``"wait"`` for room (cgc's default) or ``"raise"`` at once (Ray's behaviour).

    Example::

        plan = cgc.compile(dag)
        with plan.start() as graph:
            print(graph.execute(1).get())

        def step(x):                      # plain Ray actor calls on live actors
            return b.fwd.remote(a.fwd.remote(x))
        plan = cgc.compile(step, example_inputs=(torch.ones(4),))

    Raises:
        CompileError: the graph is invalid (the message names the node, actor, method and
            source line), an example value cannot be stored, or ``capacity`` is outside
            ``1..Limits.capacity``.
        cgc.errors.TraceError: (a CompileError) the step cannot be a static graph:
            ``ray.get`` in it, a ref used as a value, a task, an actor made in it, a ref
            kept past it; the message starts with the user's ``file:line``.
        ConfigError: ``at_capacity`` is not ``"wait"``/``"raise"``, or ``capacity`` and
            ``_max_inflight_executions`` disagree.
        cgc.plan_schema.verify.DeadlockError: the lowered programs could deadlock (a compiler bug).
    """
    from cgc import frontend, passes
    from cgc.frontend.step_tracer import is_step_function, trace_step
    from cgc.runtime import Plan

    if is_step_function(dag):
        if name == "graph":
            name = getattr(dag, "__name__", name)
        _check_examples(dag, name, example_inputs, example_kwargs)
        step = trace_step(dag, tuple(example_inputs or ()), dict(example_kwargs or {}))
        dag = step.output
        example_inputs, example_kwargs = used_examples(step, example_inputs, example_kwargs)
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
        _embed_siblings(proto, _model)
    _store_examples(proto, example_inputs, example_kwargs, allow_pickle)
    options = passes.LowerOptions(
        overlap=overlap,
        costs=dict(costs or {}),
        capacity=_capacity(capacity, _max_inflight_executions),
        at_capacity=at_capacity,
        gpu_hint_without_gpu=_gpu_hint_without_gpu,  # "run": cgc.ray_compat (Ray's rule)
    )
    lowered = passes.lower(proto, options)
    return Plan(lowered, live_handles=traced.live_handles, classes=traced.classes)


def compile_file(
    target: str | Path,
    attr: str | None = None,
    *,
    allow_pickle: bool = False,
    overlap: bool | None = None,
    costs: Mapping[str, float] | None = None,
    capacity: int | None = None,
    at_capacity: str = "wait",
) -> Any:
    """Compile a model file (``build_dag()``, or ``attr``) into a plan in memory.

    ``target`` may be ``"model.py"`` or ``"model.py:ATTR"``. The model's
    ``example_inputs()`` and ``example_kwargs()``, if defined, are stored in the plan for
    ``cgc run``. ``capacity`` and ``at_capacity`` as in ``compile``. ``ATTR`` may name a
    step function of ``.remote()`` calls: it is traced with the example inputs as its
    arguments, and, with no Ray running, the actors the file makes with ``Cls.remote()``
    are the plan's own (as ``Cls.bind()``): no cluster at compile time.

    Example: ``cgc.compile_file("examples/chain.py").save("chain.cgplan")``.

    Raises:
        CompileError: the file cannot be imported, defines no graph, or the graph is invalid.
    """
    from cgc import frontend
    from cgc import model_file as mf

    path, parsed_attr = mf.split_target(str(target))
    attr = attr or parsed_attr
    # Ray's DAG nodes do not record where they were bound; note it while the model runs.
    from cgc.frontend.offline_actors import offline_actors

    source = path.read_text(encoding="utf-8") if path.is_file() else ""
    from cgc.frontend.unused_actors import record_bound_actors, warn_unused_actors

    with frontend.record_ray_bind_sites(), record_bound_actors() as bound:
        with offline_actors(source):
            model = mf.load_model_file(path, attr)
        output = mf.graph_output(model)
    examples, keywords = mf.example_inputs(model), mf.example_kwargs(model)
    if model.step is not None:
        examples, keywords = used_examples(model.step, examples, keywords)
    plan = compile(
        output,
        name=path.stem,
        example_inputs=examples,
        example_kwargs=keywords,
        allow_pickle=allow_pickle,
        overlap=overlap,
        costs=costs,
        capacity=capacity,
        at_capacity=at_capacity,
        _model=model,
    )
    warn_unused_actors(plan.proto, bound)  # an actor the graph never reaches: say so
    return plan
