"""``@cgc.trace``: a step function of plain Ray actor calls that runs as a cgc graph.

The first call traces the step with its arguments (``cgc.frontend.step_tracer``), compiles
it with the decorator's options and starts it; every call (the first included) submits one
execution and returns what the step returns, with each ref replaced by a ``StepRef``:
``ray.get(ref)``, ``await ref`` and ``ref.get()`` take it, as they take Ray's refs.

Example::

    @cgc.trace
    def step(x):
        return stage1.fwd.remote(stage0.fwd.remote(x))

    y = ray.get(step(torch.ones(4)))   # traced, compiled, started; then one execution
    step.plan.save("step.cgplan")
    step.teardown()
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable, Generator
from typing import Any

from ray.experimental.compiled_dag_ref import CompiledDAGRef

from cgc.errors import StepArgumentsError
from cgc.frontend.locations import capture_loc
from cgc.runtime.driver.refs import RefType

__all__ = ["trace", "TracedStep", "StepRef"]


class StepRef(CompiledDAGRef, metaclass=RefType):
    """One result of one execution of a traced step: ``ray.get(ref)``, ``ref.get()`` or
    ``await ref``, once. (A ``CompiledDAGRef`` so that ``ray.get`` takes it; Ray's own
    fields are not used: the value comes from the cgc graph.)"""

    def __init__(self, ref: Any) -> None:  # Ray's __init__ reads Ray's channels: skipped
        self._cgc_ref = ref

    def get(self, timeout: float | None = None) -> Any:
        """The value; ``timeout`` in seconds (None: the graph's get timeout).

        Raises:
            RemoteError: the method raised (also an instance of its exception type).
            GetTimeoutError, RefConsumedError, ActorDiedError: see ``cgc.runtime.Ref``.
        """
        return self._cgc_ref.get(timeout)

    def __await__(self) -> Generator[Any, None, Any]:
        return self._cgc_ref.__await__()

    def __del__(self) -> None:
        pass  # the wrapped cgc Ref frees an unfetched result itself

    def __repr__(self) -> str:
        return f"StepRef({self._cgc_ref!r})"

    __str__ = __repr__


class TracedStep:
    """A step function decorated with ``@cgc.trace``; call it like the function.

    ``plan`` is the compiled plan (None before the first call), ``graph`` the running
    graph; ``teardown()`` stops it for good: a later call raises ``GraphTornDownError`` at
    once, naming the step's actors, and starts nothing (decorate the function again for a
    new graph). So does a call after ``ray.shutdown()``, which ends the graph with its Ray.
    """

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self.fn = fn
        self.options = {k: v for k, v in options.items() if k != "start_options"}
        self.options.setdefault("name", getattr(fn, "__name__", "step"))
        self.start_options = dict(options.get("start_options") or {})
        self.plan: Any = None
        self.graph: Any = None
        self._layout: tuple[Any, ...] = ()
        self._arity: tuple[int, tuple[str, ...]] = (0, ())
        self._inputs: tuple[int, tuple[str, ...]] = (0, ())
        self._lock = threading.Lock()
        self._stopped = False  # teardown() ran: no later call starts anything
        self._ray_session = ""  # the Ray connection the torn-down graph ran in
        functools.update_wrapper(self, fn)

    @property
    def __cgc_step_fn__(self) -> Callable[..., Any]:
        """The step function: what ``cgc.compile`` and ``cgc compile`` trace."""
        return self.fn

    def _start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import cgc
        from cgc.frontend.step_tracer import trace_step

        traced = trace_step(self.fn, args, kwargs)
        self.plan = cgc.compile(traced.output, **self.options)
        self._layout = traced.layout
        self._arity = (traced.num_positional, traced.keywords)
        self._inputs = traced.inputs
        self.graph = self.plan.start(**self.start_options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run one execution; the first call traces, compiles and starts the graph.

        A keyword whose parameter has a default may be left out or passed on later calls
        as on the first: left out, the default is passed; passed although the first call
        left it out, it must be the default (the graph holds it).

        Raises:
            StepArgumentsError: (a TypeError too) the arguments do not fit the function, or
                differ in number or names from the traced call's; names the caller's line.
            TraceError: (first call) the step cannot be traced, naming the line.
            GraphTornDownError: after ``teardown()`` or ``ray.shutdown()`` (names the
                step's actors; nothing is started).
            CompileError, cgc.runtime errors: compiling or starting failed.
        """
        with self._lock:
            if self._stopped or (self.graph is not None and self.graph.closing):
                raise self._down_error()
            if self.graph is None:
                self._check_first_call(args, kwargs)
                self._start(args, kwargs)
        if tuple(sorted(kwargs)) != self._arity[1]:
            kwargs = self._with_defaults(args, kwargs)
        if (len(args), tuple(sorted(kwargs))) != self._arity:
            loc = capture_loc()  # the caller's line (cgc's frames skipped)
            raise StepArgumentsError(
                f"{loc.short()}: {self._name()}() was traced with "
                f"{self._arity[0]} positional argument(s) and keywords {list(self._arity[1])}, "
                f"and is now called with {len(args)} and {sorted(kwargs)}; a traced step's "
                "inputs are fixed: trace another step for another signature", loc=loc.short())
        # Only the arguments the graph reads (an unused one is no input of it).
        args = tuple(_resolve(a) for a in args[:self._inputs[0]])
        kwargs = {k: _resolve(kwargs[k]) for k in self._inputs[1]}
        out = self.graph.execute(*args, **kwargs)
        refs = [StepRef(r) for r in (out if isinstance(out, list) else [out])]
        kind = self._layout[0]
        if kind == "one":
            return refs[0]
        if kind == "tuple":
            return tuple(refs)
        if kind == "dict":
            return dict(zip(self._layout[1], refs, strict=True))
        return refs

    def _name(self) -> str:
        """The step function's name, for messages."""
        return getattr(self.fn, "__name__", "step")

    def _check_first_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Refuse a first call the function cannot take (before anything is traced)."""
        from cgc.frontend.step_tracer import bind_problem

        problem = bind_problem(self.fn, args, kwargs)
        if problem is not None:
            loc = capture_loc()
            raise StepArgumentsError(f"{loc.short()}: {self._name()}(): {problem}",
                                     loc=loc.short())

    def _with_defaults(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` fitted to the traced call's keywords where parameters have defaults."""
        from cgc.frontend.step_tracer import step_parameters

        traced = set(self._arity[1])
        out = dict(kwargs)
        for i, p in enumerate(step_parameters(self.fn)):
            if p.default is inspect.Parameter.empty or p.kind in (
                    inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL,
                    inspect.Parameter.VAR_KEYWORD):
                continue
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and i < len(args):
                continue  # given by position
            if p.name in traced and p.name not in out:
                out[p.name] = p.default  # an input of the graph: its default is the value
            elif p.name not in traced and p.name in out:
                if not _is_default(out[p.name], p.default):
                    loc = capture_loc()
                    raise StepArgumentsError(
                        f"{loc.short()}: {self._name()}() was traced without {p.name}= (so "
                        f"its default {p.default!r:.60} is built into the graph) and is now "
                        f"called with {p.name}={out[p.name]!r:.60}; pass {p.name}= at the "
                        "first call to make it an input of the graph", loc=loc.short())
                del out[p.name]
        return out

    def teardown(self) -> None:
        """Stop the running graph (its live actors stay the user's).

        Raises:
            Nothing new; the runtime's teardown errors propagate.
        """
        with self._lock:
            graph, self.graph = self.graph, None
            self._stopped = self._stopped or graph is not None
            self._ray_session = graph.ray_session if graph is not None else ""
        if graph is not None:
            graph.teardown()

    def _down_error(self) -> Exception:
        """The ``GraphTornDownError`` of a call after teardown or ``ray.shutdown()``."""
        from cgc.runtime.driver.cluster import ray_session
        from cgc.runtime.errors import GraphTornDownError

        name = getattr(self.fn, "__name__", "step")
        graph = self.graph
        started_in = graph.ray_session if graph is not None else self._ray_session
        actors = ", ".join(f"{a.name} ({a.cls.qualname.rsplit('.', 1)[-1] or '?'})"
                           for a in self.plan.proto.graph.actors)
        if started_in and ray_session() != started_in:
            state = (f"Ray has shut down since it started, so its actors are dead: {actors}")
        else:
            state = f"its actors ({actors}) are left as they are"
        how = "after teardown()" if self._stopped else "by ray.shutdown()"
        return GraphTornDownError(
            f"{name}() was torn down {how}: {state}; a torn-down step starts nothing "
            "again: decorate the function anew (cgc.trace(fn)) for a new graph")


def _is_default(value: Any, default: Any) -> bool:
    """Whether ``value`` is a parameter's ``default`` (the same object, or an equal plain value)."""
    plain = (bool, int, float, str, bytes, type(None))
    return value is default or (type(value) is type(default) and isinstance(value, plain)
                                and value == default)


def _resolve(value: Any) -> Any:
    """A Ray ObjectRef passed as a step argument is its value (as Ray resolves it)."""
    ray = sys.modules.get("ray")
    if ray is not None and isinstance(value, ray.ObjectRef):
        return ray.get(value)
    return value


def trace(_fn: Callable[..., Any] | None = None, **compile_options: Any) -> Any:
    """Decorate a step function of plain Ray actor calls; it then runs as a cgc graph.

    ``compile_options`` are ``cgc.compile``'s (``capacity``, ``overlap``, ``allow_pickle``,
    ``name``, ...) plus ``start_options``: a dict for ``plan.start()``.

    Example::

        @cgc.trace(capacity=4)
        def step(x):
            h = stage0.fwd.remote(x)
            return stage1.fwd.remote(h)

        out = ray.get(step(x))          # or: step(x).get(), await step(x)

    Raises:
        TypeError: an unknown option (when the first call compiles).
        TraceError: (first call) the step cannot be a static graph; see ``cgc.compile``.
    """
    def deco(fn: Callable[..., Any]) -> TracedStep:
        return TracedStep(fn, compile_options)

    return deco(_fn) if _fn is not None else deco
