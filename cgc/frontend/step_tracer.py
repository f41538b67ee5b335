"""Tracing a step of plain Ray actor calls into builder nodes (then ``trace()`` as usual).

A *step* is a Python function that calls methods of actors with ``.remote(...)``, passes
the refs it gets to other calls, and returns refs (one, a list or tuple, or a dict).
``trace_step`` runs it once, with one ``TracedRef`` per argument, while Ray's
``ActorMethod._remote`` is replaced (only in this thread, restored on exit): each call
becomes a ``CallNode`` on the same ``LazyActor`` the Ray DAG adapter makes for that live
handle (or, for a model file's ``Cls.remote()`` compiled offline, a plan actor), with the
call's ``num_returns``, keyword arguments and constants, and its Ray Direct Transport hint
(``tensor_transport``) as the edge's transport hint. Program order is call order.
``ray.experimental.collective.allreduce.bind([r0, r1])`` (and ``reducescatter``) on traced
refs becomes a collective among their actors, as the adapter makes one from Ray's DAG.

The rule, as torch.fx states its own: a step is a static graph. Its Python runs once, at
trace time; only the ``.remote()`` calls are recorded. What would need a value at run time
is refused at trace time with a ``TraceError`` naming the line: ``ray.get``/``ray.wait``
on a traced ref, a ref used as a Python value, a task, an actor created in the step, a
ref nested in a container argument (Ray would pass it unresolved), a ref kept past the
trace.

Example::

    def step(x):
        h = stage0.fwd.remote(x)
        return stage1.fwd.remote(h)

    traced = trace_step(step, (torch.zeros(4),), {})
    graph = trace(traced.output).graph
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cgc.errors import (
    ActorInStepError,
    GetInStepError,
    TaskInStepError,
    TraceError,
)
from cgc.frontend import ray_private as rp
from cgc.frontend.actors import LazyActor
from cgc.frontend.locations import RawLoc, capture_loc
from cgc.frontend.nodes import CallNode, DAGNode, HintSpec, InputNode, MultiOutputNode, OutputRef
from cgc.frontend.step_escape import check_escapes
from cgc.frontend.step_refs import ArgRef, StepState, TracedRef

__all__ = ["StepTrace", "trace_step", "RDT_TRANSPORTS", "is_step_function", "current_session",
           "bind_problem", "step_parameters", "PlainRayRefusesWarning"]

# Ray Direct Transport's tensor_transport (Ray's upper-case names) -> cgc's hint transport.
RDT_TRANSPORTS = {
    "NCCL": "nccl",      # NCCL between GPU actors; CUDA IPC where two share one GPU
    "CUDA_IPC": "nccl",  # the same binding: CUDA IPC on a shared GPU, NCCL across GPUs
    "GLOO": "host",      # CPU tensors: cgc's host channel (shared memory, TCP across nodes)
    "NIXL": "auto",      # the best cgc has: NCCL/CUDA IPC between GPU actors, else host
}

# Ray Direct Transports that eager Ray runs only among actors of a collective group.
_GROUP_TRANSPORTS = ("GLOO", "NCCL")


class PlainRayRefusesWarning(UserWarning):
    """A traced call that cgc runs but plain (eager) Ray would refuse: its Ray Direct
    Transport hint needs what the actor lacks (``enable_tensor_transport``, a collective
    group). The step is then not the Ray program it reads as."""


_LOCK = threading.Lock()
# One trace at a time in a process: Ray's functions are replaced process-wide (the thread
# check keeps other threads on Ray's own), and patches must come off in the order they
# went on. Re-entrant: a step may compile another step while it is traced.
_TRACE_LOCK = threading.RLock()


@dataclass
class StepTrace:
    """A traced step: the graph's output node and how to rebuild the step's return value.

    ``layout`` is ``("one",)``, ``("list",)``, ``("tuple",)`` or ``("dict", keys)``;
    ``output`` is the node (one) or a ``MultiOutputNode`` of the returned refs, in order.
    ``dag`` is set instead when the function built a DAG (``build_dag()``) rather than
    calling ``.remote()``. ``num_positional``/``keywords``: the traced call's arguments;
    ``inputs``: those the graph reads (an argument no call uses is no graph input).
    """

    output: Any
    layout: tuple[Any, ...]
    num_positional: int = 0
    keywords: tuple[str, ...] = ()
    dag: Any = None
    calls: int = 0
    # what the graph takes: (positional arguments, keyword names); unused ones are dropped
    inputs: tuple[int, tuple[str, ...]] = (0, ())


def is_step_function(obj: Any) -> bool:
    """Whether ``cgc.compile`` should trace ``obj`` as a step (a callable that is no DAG).

    >>> is_step_function(lambda x: x), is_step_function(3)
    (True, False)

    Raises:
        Nothing.
    """
    from cgc.frontend.actors import ActorClass

    return callable(obj) and not isinstance(obj, (DAGNode, ActorClass, type)) and \
        not rp.is_ray_dag_object(obj)


def step_parameters(fn: Any) -> list[inspect.Parameter]:
    """The parameters of step ``fn`` (a ``@cgc.trace`` step: its function's); [] if unknown.

    >>> [p.name for p in step_parameters(lambda x, y=1: x)]
    ['x', 'y']

    Raises:
        Nothing.
    """
    fn = getattr(fn, "__cgc_step_fn__", fn)
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return []


def bind_problem(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why calling step ``fn`` with ``args``/``kwargs`` fails, as Python says it (None: it fits).

    >>> bind_problem(lambda x, y: x, (1,), {})
    "missing a required argument: 'y'"

    Raises:
        Nothing.
    """
    fn = getattr(fn, "__cgc_step_fn__", fn)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # nothing to check against: calling it will tell
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


class _Session:
    """One trace: the refs' shared state, the actors called, the nodes made."""

    def __init__(self, step_name: str) -> None:
        from cgc.frontend.ray_adapter import LiveActors

        self.state = StepState(step_name)
        self.thread = threading.get_ident()
        self.live = LiveActors()
        self.offline: dict[int, LazyActor] = {}
        self.calls = 0
        self.get_orig: Any = None

    # ------------------------------------------------------------------ calls
    def live_call(self, method: Any, args: Any, kwargs: Any, options: dict[str, Any]) -> Any:
        loc = capture_loc()
        info = rp.method_call(method)
        actor = self.live.handle_actor(info.handle)
        self.live.first_use.setdefault(rp.handle_id(info.handle), loc)
        num = options.get("num_returns")
        if num is None:
            num = info.num_returns
        transport = options.get("tensor_transport") or info.tensor_transport
        if transport is not None:
            _warn_if_ray_refuses(info.handle, str(transport),
                                 f"{actor._describe()}.{info.method}", loc)
        return self.call(actor, info.method, args, kwargs, num, transport, loc)

    def offline_call(self, owner: Any, method: str, args: Any, kwargs: Any,
                     options: dict[str, Any]) -> Any:
        from cgc.frontend.ray_adapter import class_node_actor
        from cgc.frontend.ray_graph import ray_num_returns

        loc = capture_loc()
        actor = self.offline.get(id(owner))
        if actor is None:
            actor = class_node_actor(owner._cgc_class_node, owner._cgc_loc)
            self.offline[id(owner)] = actor
        body = rp.actor_body(owner._cgc_class_node)
        num = ray_num_returns(body, method, options)
        transport = options.get("tensor_transport") or rp.declared_tensor_transport(
            getattr(body, method, None))
        return self.call(actor, method, args, kwargs, num, transport, loc)

    def call(self, actor: LazyActor, method: str, args: Any, kwargs: Any, num: Any,
             transport: str | None, loc: RawLoc) -> Any:
        what = f"{actor._describe()}.{method}"
        if isinstance(num, bool) or not isinstance(num, int) or num < 1:
            raise TraceError(
                f"{loc.short()}: {what}: num_returns={num!r} (a generator or dynamic "
                "returns) cannot be a static graph's edge; return a fixed number of values",
                method=method, loc=loc.short())
        if transport is not None and num != 1:
            raise TraceError(  # as Ray: RDT methods return one value
                f"{loc.short()}: {what}: tensor_transport={transport!r} needs num_returns=1 "
                f"(Ray's rule for Ray Direct Transport), got {num}",
                method=method, loc=loc.short())
        bound = tuple(self._arg(v, loc, what, f"argument {i}") for i, v in enumerate(args or ()))
        kw = {k: self._arg(v, loc, what, f"keyword {k!r}") for k, v in (kwargs or {}).items()}
        node = CallNode(actor, method, bound, kw, num, loc)
        self.calls += 1
        if transport is not None:
            node._set_hint(HintSpec(transport=_cgc_transport(transport, loc, what), loc=loc,
                                    requested=str(transport).lower()))
        if num == 1:
            return TracedRef(node, self.state, loc, what)
        return [TracedRef(OutputRef(node, i, loc), self.state, loc, f"{what}[{i}]")
                for i in range(num)]

    def collective(self, inputs: Any, op: Any, transport: Any) -> Any:
        """``ray.experimental.collective.allreduce.bind([r0, r1])`` (or reducescatter) on
        traced refs: a collective among their actors, one result ref per member."""
        from cgc.frontend.collectives import ReduceOp, bind_collective

        loc = capture_loc()
        kind = rp.collective_kind(op)
        if kind not in ("allreduce", "reducescatter"):
            raise TraceError(
                f"{loc.short()}: ray.experimental.collective.{kind}: Ray returns one tensor "
                "(the members' tensors concatenated) and cgc's allgather returns the list "
                "of them, so a step cannot keep Ray's result; use cgc.allgather in a DAG",
                loc=loc.short())
        red = rp.reduce_op(op)
        nested = isinstance(inputs[0], (list, tuple))
        rows = [list(b) for b in inputs] if nested else [list(inputs)]
        nodes = [[self._arg(v, loc, kind, f"member {i}") for i, v in enumerate(row)]
                 for row in rows]
        if any(not isinstance(n, DAGNode) for row in nodes for n in row):
            raise TraceError(f"{loc.short()}: {kind}: every member must be a ref of an actor "
                             "call in this step", loc=loc.short())
        hint = None if transport is None or isinstance(transport, str) and \
            transport.lower() in ("accelerator", "nccl") else transport
        if hint is not None:
            raise TraceError(
                f"{loc.short()}: {kind}: transport={transport!r} cannot be kept in a plan; "
                "cgc binds its own communicator among the members (NCCL between GPUs, else "
                "the CPU communicator): drop the argument", loc=loc.short())
        out = bind_collective(kind, nodes if nested else nodes[0],
                              ReduceOp[red.name] if red is not None else None, None, loc)
        self.calls += 1

        def ref(n: Any, rank: int) -> TracedRef:
            return TracedRef(n, self.state, loc, f"{kind}[{rank}]")

        if nested:
            return [[ref(n, r) for n in member] for r, member in enumerate(out)]
        return [ref(n, r) for r, n in enumerate(out)]

    def _arg(self, value: Any, loc: RawLoc, what: str, path: str) -> Any:
        if isinstance(value, TracedRef):
            return value._node_for(self.state, f"passed to {what}")
        if isinstance(value, DAGNode) or rp.is_ray_dag_object(value):
            raise TraceError(
                f"{loc.short()}: {what} ({path}): a DAG node ({type(value).__name__}) in a "
                "traced step; a step calls .remote() only (build DAGs with .bind() apart)",
                loc=loc.short())
        if _is_object_ref(value):
            # A ray.put object (or any finished ref) passed in: Ray resolves a top-level
            # ref to its value, and its value never changes, so it is a constant.
            return self.get_orig(value)
        nested = _find_ref(value)
        if nested is not None:
            raise TraceError(
                f"{loc.short()}: {what} ({path}): {nested._origin()} is nested inside a "
                f"{type(value).__name__}; Ray passes a ref nested in a container unresolved "
                "(the method would get the ref, not its value), which a graph cannot do: "
                "pass it as an argument of its own",
                loc=loc.short())
        return value


def _ray_refusal(handle: Any, transport: str) -> str | None:
    """Why eager Ray would refuse a call with ``tensor_transport=transport`` on ``handle``
    (the checks of Ray's ``ActorMethod._remote``), None if it would not."""
    if not rp.enables_tensor_transport(handle):
        return ("the actor's class has no @ray.remote(enable_tensor_transport=True)")
    name = transport.upper()
    if name not in _GROUP_TRANSPORTS:
        return None
    try:
        from ray.experimental.collective import get_collective_groups

        groups = get_collective_groups([handle], backend=name)
    except Exception:  # noqa: BLE001 - no answer: say nothing rather than guess
        return None
    if groups:
        return None
    return (f"the actor is in no {name.lower()} collective group "
            "(ray.experimental.collective.create_collective_group)")


def _warn_if_ray_refuses(handle: Any, transport: str, what: str, loc: RawLoc) -> None:
    """Warn that plain Ray would refuse this traced RDT call (cgc runs it anyway)."""
    why = _ray_refusal(handle, transport)
    if why is not None:
        warnings.warn(
            f"{loc.short()}: {what}: tensor_transport={transport.lower()!r}: plain Ray would "
            f"refuse this call ({why}); cgc runs it (the hint only chooses its channel), so "
            "this step does not run as written without cgc", PlainRayRefusesWarning,
            stacklevel=2)


def _cgc_transport(transport: str, loc: RawLoc, what: str) -> str:
    name = str(transport).upper()
    if name not in RDT_TRANSPORTS:
        raise TraceError(
            f"{loc.short()}: {what}: tensor_transport={transport!r} is not one cgc maps "
            f"({', '.join(t.lower() for t in RDT_TRANSPORTS)})", loc=loc.short())
    return RDT_TRANSPORTS[name]


def _is_object_ref(value: Any) -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and isinstance(value, ray.ObjectRef)


def _find_ref(value: Any, depth: int = 0) -> TracedRef | None:
    if isinstance(value, TracedRef):
        return value
    if depth > 8 or not isinstance(value, (list, tuple, set, frozenset, dict)):
        return None
    items = list(value.keys()) + list(value.values()) if isinstance(value, dict) else value
    for item in items:
        found = _find_ref(item, depth + 1)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------- the patches
_ACTIVE: dict[int, _Session] = {}  # thread id -> its session


def _session() -> _Session | None:
    return _ACTIVE.get(threading.get_ident()) if _ACTIVE else None


def current_session() -> Any:
    """The trace running in this thread (None when none): offline actors record into it.

    Raises:
        Nothing.
    """
    return _session()


def _method_remote(orig: Any) -> Any:
    def _remote(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        s = _session()
        if s is None:
            return orig(self, args, kwargs, **options)
        return s.live_call(self, args, kwargs, options)

    return _remote


def _actor_remote(orig: Any) -> Any:
    def _remote(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        if _session() is None:
            return orig(self, args, kwargs, **options)
        loc = capture_loc()
        raise ActorInStepError(
            f"{loc.short()}: an actor of {_class_name(self)} is created inside the step; a "
            "graph's actors exist before it runs: create it before tracing (outside the "
            "step) and call its methods in the step", loc=loc.short())

    return _remote


def _task_remote(orig: Any) -> Any:
    def _remote(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _session() is None:
            return orig(self, *args, **kwargs)
        loc = capture_loc()
        # Ray wraps .remote with functools.wraps(function): it carries the function's name
        name = getattr(getattr(self, "remote", None), "__name__", "a remote function")
        raise TaskInStepError(
            f"{loc.short()}: {name}.remote(): a Ray remote function (a task) in a traced "
            "step; graphs are built from actor method calls: make the function a method "
            "of an actor", method=str(name), loc=loc.short())

    return _remote


def _collective_bind(orig: Any) -> Any:
    def _bind(inputs: Any, op: Any, transport: Any = None) -> Any:
        s = _session()
        if s is None or _find_ref(inputs) is None:
            return orig(inputs, op, transport)
        return s.collective(inputs, op, transport)

    return _bind


def _class_name(actor_cls: Any) -> str:
    try:
        return str(rp.remote_class(actor_cls).__qualname__)
    except Exception:  # noqa: BLE001 - only for the message
        return "a @ray.remote class"


def _refuse_get(orig: Any, fname: str) -> Any:
    def wrapper(refs: Any, *args: Any, **kwargs: Any) -> Any:
        s = _session()
        found = _find_ref(refs) if s is not None else None
        if found is not None:
            loc = capture_loc()
            raise GetInStepError(
                f"{loc.short()}: ray.{fname}() on {found._origin()} inside the traced step; "
                "its value exists only when the graph runs: return the ref from the step "
                "and ray.get the step's result, or pass the ref to the next .remote() call",
                loc=loc.short())
        return orig(refs, *args, **kwargs)

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


@contextlib.contextmanager
def _patched(session: _Session) -> Iterator[None]:
    import ray
    import ray.actor
    import ray.remote_function

    undo: list[tuple[Any, str, Any]] = []
    with _LOCK:
        try:
            for target, make in ((rp.PATCH_METHOD_REMOTE, _method_remote),
                                 (rp.PATCH_ACTOR_REMOTE, _actor_remote),
                                 (rp.PATCH_TASK_REMOTE, _task_remote),
                                 (rp.PATCH_COLLECTIVE_BIND, _collective_bind)):
                if target.module not in sys.modules:
                    # Ray's collectives (they import torch) only matter to a step that
                    # imported them already; the rest are loaded by any Ray program
                    if target is rp.PATCH_COLLECTIVE_BIND:
                        continue
                    importlib.import_module(target.module)
                owner, orig = rp.patch_original(target, sys.modules[target.module])
                undo.append((owner, target.attr, orig))
                setattr(owner, target.attr, make(orig))
            for fname in ("get", "wait"):
                orig = getattr(ray, fname)
                undo.append((ray, fname, orig))
                setattr(ray, fname, _refuse_get(orig, fname))
                if fname == "get":
                    session.get_orig = orig
            outer = _ACTIVE.get(session.thread)
            _ACTIVE[session.thread] = session
        except BaseException:
            for owner, attr, orig in reversed(undo):
                setattr(owner, attr, orig)
            raise
    try:
        yield
    finally:
        with _LOCK:
            if outer is None:
                _ACTIVE.pop(session.thread, None)
            else:
                _ACTIVE[session.thread] = outer
            for owner, attr, orig in reversed(undo):
                setattr(owner, attr, orig)


# ---------------------------------------------------------------------- tracing
def _def_loc(fn: Callable[..., Any]) -> RawLoc:
    target = getattr(fn, "__func__", fn)
    code = getattr(target, "__code__", None)
    if code is None:
        return capture_loc()
    return RawLoc(code.co_filename, code.co_firstlineno, code.co_name)


def _layout(result: Any, loc: RawLoc, name: str, state: StepState) -> tuple[tuple[Any, ...],
                                                                              list[Any]]:
    def node(v: Any, where: str) -> Any:
        if not isinstance(v, TracedRef):
            raise TraceError(
                f"{loc.short()}: {name}() returns {where} {type(v).__name__} ({v!r:.60}); a "
                "step returns refs of its .remote() calls (one, a list or tuple, or a dict)",
                loc=loc.short())
        return v._node_for(state, "returned")

    if isinstance(result, TracedRef):
        return ("one",), [node(result, "")]
    if isinstance(result, (list, tuple)) and result:
        kind = "list" if isinstance(result, list) else "tuple"
        return (kind,), [node(v, f"in its {kind} a") for v in result]
    if isinstance(result, dict) and result:
        return ("dict", tuple(result)), [node(v, f"under {k!r} a") for k, v in result.items()]
    return ("one",), [node(result, "a")]


def trace_step(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    allow_dag: bool = False,
) -> StepTrace:
    """Run ``fn`` once with traced arguments and record its ``.remote()`` calls.

    ``args``/``kwargs`` are one execution's example arguments: each becomes the graph
    input of its position (or keyword); their values are not read. ``allow_dag``: when
    ``fn`` calls nothing and returns a DAG (``build_dag()``), return that DAG as ``dag``.

    Example: ``trace_step(step, (x,)).output`` is the step's graph output node.

    Raises:
        TraceError: (and its subclasses) something in the step cannot be a static graph;
            the message starts with the user's ``file:line``.
        CompileError: a live actor is dead or does not answer (``live_actors.observe``).
    """
    fn = getattr(fn, "__cgc_step_fn__", fn)  # a @cgc.trace step: trace its function
    kwargs = dict(kwargs or {})
    name = getattr(fn, "__name__", type(fn).__name__)
    loc = _def_loc(fn)
    session = _Session(name)
    inp = InputNode()
    inp._loc = loc
    whole = len(args) == 1 and not kwargs  # one argument: the input itself, as Ray's inp
    t_args = [ArgRef(inp, None if whole else i, session.state, loc,
                     f"argument {i} of {name}()") for i in range(len(args))]
    t_kwargs = {k: ArgRef(inp, k, session.state, loc, f"argument {k!r} of {name}()")
                for k in sorted(kwargs)}
    with _TRACE_LOCK, _patched(session):
        result = fn(*t_args, **t_kwargs)
    try:
        if allow_dag and session.calls == 0 and (isinstance(result, DAGNode)
                                                 or rp.is_ray_dag_object(result)):
            return StepTrace(output=None, layout=(), dag=result)
        check_escapes(fn, session.state)
        layout, nodes = _layout(result, loc, name, session.state)
    finally:
        session.state.closed = True
    session.live.observe_live()
    output = nodes[0] if layout == ("one",) else MultiOutputNode(nodes)
    if isinstance(output, MultiOutputNode):
        output._loc = loc
    used = [0 if a._key is None else a._key
            for a in (*t_args, *t_kwargs.values()) if a._node is not None]
    ints = [k for k in used if isinstance(k, int)]
    return StepTrace(output=output, layout=layout, num_positional=len(args),
                     keywords=tuple(sorted(kwargs)), calls=session.calls,
                     inputs=(max(ints) + 1 if ints else 0,
                             tuple(sorted(k for k in used if isinstance(k, str)))))
