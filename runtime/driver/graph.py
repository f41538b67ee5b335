"""``CompiledGraph``: the driver side of a started plan (submit, fail, tear down).

Hot path: ``execute()`` checks the argument count, writes each input channel once (a
broadcast to N actors on this node is one write) and returns ``Ref``s; ``ref.get()`` asks
the graph's ``ResultBook`` (``cgc.runtime.driver.result_book``), which reads the output channels
until its execution is complete, holding what it reads for other refs. No Ray RPCs, no
allocation of channels, no imports on either path.

Concerns and where they live:

- **Submitting** (here): argument checks, input writes, capacity (at capacity
  ``execute()`` asks the book to make room: it waits up to the submit timeout,
  ``at_capacity="wait"``, cgc's default, or raises ``CapacityExceededError``, Ray's).
- **Results** (``ResultBook``): fail-fast across one execution's outputs, buffered results
  bounded by ``max_buffered_results`` / ``max_buffered_bytes``, refs dropped unfetched,
  the hang report of a get timeout.
- **Down state** (``GraphState``): ``closing`` and the first failure, shared by both.
- **Teardown** (``cgc.runtime.driver.teardown``), **monitoring** (``cgc.runtime.driver.monitor``), set-up
  (``cgc.runtime.driver.start``, which builds the graph through its set-up steps, each once).

Locks: ``_submit_lock`` (input writes) and the book's lock (output reads, the results),
always taken in that order, so a thread waiting for a result never blocks another
thread's submit.

Example::

    with plan.start() as graph:
        refs = [graph.execute(i) for i in range(4)]
        print([r.get() for r in reversed(refs)])
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import threading
import time
import weakref
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import RunConfig
from cgc.plan_schema.inputs import input_problems, positional_arity
from cgc.runtime.channels.errors import ChannelClosedError, ChannelTimeoutError
from cgc.runtime.driver.graph_ends import AbandonedSubmitError, DriverEndpoints, PartialSubmitError
from cgc.runtime.driver.graph_state import GraphState
from cgc.runtime.driver.refs import Ref, ref_type
from cgc.runtime.driver.result_book import ResultBook
from cgc.runtime.errors import (
    GraphFailedError,
    GraphTornDownError,
    InputMismatchError,
    SubmitTimeoutError,
)

__all__ = ["CompiledGraph", "live_graphs", "teardown_all"]

_LIVE: weakref.WeakSet = weakref.WeakSet()
_atexit_registered = False


def live_graphs(include_closing: bool = False) -> list[CompiledGraph]:
    """The graphs of this process that are started and not torn down (with
    ``include_closing``, also those whose teardown is under way).

    Example: ``assert not live_graphs()`` after every ``with plan.start() as g:`` block.
    """
    return [g for g in list(_LIVE) if include_closing or not g.closing]


def teardown_all() -> None:
    """Tear down every graph of this process (waiting for teardowns already under way).

    Example: ``teardown_all(); assert not live_graphs()``.

    Raises:
        Nothing: a failing teardown is skipped (interpreter exit, ``ray.shutdown()``).
    """
    for g in list(_LIVE):
        try:
            g.teardown()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class CompiledGraph:
    """A running plan. Use it as a context manager, or call ``teardown()`` when done.

    Attributes: ``name``, ``plan`` (the ``cgc.runtime.Plan``), ``config`` (the
    ``RunConfig`` in force), ``actors`` (handles by actor name), ``channel_bindings``
    (channel id -> how it was bound from real placement: "shm", "tcp", "nccl",
    "cuda_ipc", "host_staging", "cpu"), ``comm_bindings`` (communicator id -> its
    ``Binding``: transport and the reason), ``setup_seconds`` (of which
    ``ray_start_seconds`` went to starting or joining Ray); ``capacity``,
    ``submit_timeout``, ``get_timeout``, ``teardown_timeout`` (seconds; None = no limit)
    come from ``config``.

    Built by ``cgc.runtime.driver.start.start_graph``: the constructor, then one call of each
    set-up step (``bind_actors``, ``use_bells``, ``record_nodes``, ``record_bindings``,
    ``watch``, ``started``), the only writers of the fields they name; the Ray drop-in adds
    ``kill_with_session``.
    """

    def __init__(self, plan: Any, gid: str, prefix: str, config: RunConfig, *,
                 ray_session: str = "") -> None:
        self.plan = plan
        self.name: str = plan.name
        self.gid, self.prefix = gid, prefix
        self.config = config
        self.ray_session = ray_session  # cluster.ray_session() when started: whose handles
        self.setup_seconds = 0.0
        self.ray_start_seconds = 0.0  # the part of setup_seconds spent starting/joining Ray
        self.actors: dict[str, Any] = {}
        self.created: set[str] = set()
        self.channel_bindings: dict[int, str] = {}
        self.comm_bindings: dict[int, Any] = {}
        self.actor_nodes: dict[str, str] = {}  # endpoint ("@driver" too) -> Ray node id
        self.monitor: Any = None
        # Actors (handles) to kill when the graph's Ray session ends with the graph still
        # up: the drop-in's live actors, which Ray's ray.shutdown() kills with its graphs.
        self.kill_at_session_end: list[Any] = []
        self.endpoints = DriverEndpoints(plan.proto)
        self.bells: Any = None  # the doorbells when wake-ahead is on (cgc.runtime.driver.wake)
        self.bell_ahead: list[int] = []  # depths the driver rings at each submit
        g = plan.proto.graph
        # Arity of the common call, checked inline on the hot path (see _check_inputs).
        self._fast_npos = positional_arity(g)
        self._kwset = frozenset(g.keyword_fields)
        self._multi = any(n.multi_output for n in g.nodes if n.kind == pb.OUTPUT)
        self._nrefs = len(self.endpoints.out_index) if self._multi else 1
        self._ref_type = ref_type()  # a Ray CompiledDAGRef too where Ray is loaded
        self._raise_at_capacity = config.at_capacity == "raise"
        # (what, execution, t0, t1) of submits and output reads when tracing, else None.
        self.trace_events: list[tuple[str, int, int, int]] | None = (
            [] if config.trace else None)
        self._state = GraphState(self.name, gid, self.teardown)
        self._book = ResultBook(self._state, self.endpoints, config, self._nrefs,
                                self.trace_events, self._executor)
        self._submit_lock = threading.Lock()
        self._submitted = 0
        self._dead: set[str] = set()
        self._teardown_lock = threading.Lock()
        self._torn_down = threading.Event()
        self._pool: Any = None

    # ------------------------------------------------------------------ set-up (start)
    def bind_actors(self, actors: dict[str, Any], created: set[str]) -> None:
        """Set-up step: the graph's actor handles by name, and the names of those the plan
        created (teardown kills these; external actors stay).

        Example: ``graph.bind_actors(*make_actors(plan, drop_gpus, graph.gid))``.
        """
        self.actors, self.created = actors, created

    def use_bells(self, bells: Any, ahead: list[int]) -> None:
        """Set-up step: the doorbells of wake-ahead (``cgc.runtime.channels.bell.Bells``)
        and the depths ``execute()`` rings at each submit.

        Example: ``graph.use_bells(Bells.create(graph.prefix + "bell", 3), [2, 3])``.
        """
        self.bells, self.bell_ahead = bells, ahead

    def record_nodes(self, actor_nodes: dict[str, str]) -> None:
        """Set-up step: where each endpoint landed (Ray node id by name, ``"@driver"`` too;
        teardown's trace uses it to align clocks).

        Example: ``graph.record_nodes({"a": node0, "@driver": node0})``.
        """
        self.actor_nodes = actor_nodes

    def record_bindings(self, channel_bindings: dict[int, str],
                        comm_bindings: dict[int, Any]) -> None:
        """Set-up step: how each channel and communicator was bound from where the
        endpoints landed (see the class attributes).

        Example: ``graph.record_bindings({1: "shm", 2: "nccl"}, {1: binding})``.
        """
        self.channel_bindings = channel_bindings
        self.comm_bindings = comm_bindings

    def watch(self, monitor: Any) -> None:
        """Set-up step: the graph's monitor (``cgc.runtime.driver.monitor.Monitor``, not started
        yet); from now on a get timeout reports where each actor is blocked.

        Example: ``graph.watch(Monitor(graph, waiters))``.
        """
        self.monitor = monitor
        self._book.report_with(self.where_blocked)

    def started(self, setup_seconds: float, ray_start_seconds: float) -> None:
        """Last set-up step: record how long set-up took (and the part spent starting or
        joining Ray) and make interpreter exit tear this graph down.

        Example: ``graph.started(time.perf_counter() - t0, ray_s)``.
        """
        global _atexit_registered
        _LIVE.add(self)
        if not _atexit_registered:
            atexit.register(teardown_all)
            _atexit_registered = True
        self.setup_seconds = setup_seconds
        self.ray_start_seconds = ray_start_seconds

    def kill_with_session(self, handles: list[Any]) -> None:
        """Actors (handles) to kill when the graph's Ray session ends with the graph still
        up, as Ray's ``ray.shutdown()`` kills a compiled graph's actors (the drop-in's).

        Example: ``graph.kill_with_session(list(plan.live_handles.values()))``.
        """
        self.kill_at_session_end = list(handles)

    # ------------------------------------------------------------------ read-only state
    @property
    def capacity(self) -> int:
        """Executions in flight before ``execute()`` waits (or raises)."""
        return self.config.capacity

    @property
    def submit_timeout(self) -> float | None:
        return self.config.submit_timeout

    @property
    def get_timeout(self) -> float | None:
        return self.config.get_timeout

    @property
    def teardown_timeout(self) -> float:
        return self.config.teardown_timeout

    @property
    def num_outputs(self) -> int:
        """Refs per execution (``len(MultiOutputNode)``, else 1)."""
        return self._nrefs

    @property
    def multi_output(self) -> bool:
        """True when the graph ends in a ``MultiOutputNode``: ``execute()`` returns a list
        of refs (even of one), else a single ``Ref``.

        Example: ``refs = graph.execute(1); refs if graph.multi_output else [refs]``.
        """
        return self._multi

    @property
    def submitted(self) -> int:
        """Executions submitted so far (the next ``execute()`` gets this index).

        Example: ``graph.execute(1); assert graph.submitted == 1``.
        """
        return self._submitted

    @property
    def closing(self) -> bool:
        """True once teardown has begun (for any reason)."""
        return self._state.closing

    @property
    def dead_actors(self) -> frozenset[str]:
        """Actors known to be dead (teardown sends them no calls)."""
        return frozenset(self._dead)

    def mark_dead(self, actor: str) -> None:
        """Record that ``actor`` died (the monitor calls this)."""
        self._dead.add(actor)

    @property
    def buffered(self) -> int:
        """Executions with results read from the channels but not fetched or dropped yet."""
        return self._book.buffered

    def in_flight(self) -> int:
        """Executions submitted whose outputs are not all read from the channels yet."""
        pos = self.endpoints.positions
        return self._submitted - (min(pos) if pos else self._submitted)

    @property
    def read_upto(self) -> int:
        """Executions below this index were read completely from the output channels."""
        return min(self.endpoints.positions) if self.endpoints.positions else self._submitted

    def held_results(self) -> dict[int, dict[int, Any]]:
        """Results read from the channels and held for refs: ``{execution: {output index:
        value}}`` (dropped refs are accounted first). For introspection and the drop-in's
        Ray-shaped result buffer.

        Example: ``graph.held_results() == {}`` once every ref was fetched or dropped.
        """
        return self._book.held_results()

    # ------------------------------------------------------------------ submit
    def _check_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        problems = input_problems(self.plan.proto.graph, len(args), kwargs.keys())
        if problems:
            want = ", ".join(
                [f"{self._fast_npos} positional"] + [f"{k}=" for k in sorted(self._kwset)])
            raise InputMismatchError(
                f"graph {self.name!r} takes ({want}); execute() needs " + "; ".join(problems))

    def execute(self, *args: Any, **kwargs: Any) -> Ref | list[Ref]:
        """Submit one execution; return its ``Ref`` (a list of refs for multiple outputs).

        At capacity it waits for room (``at_capacity="wait"``) or raises (``"raise"``).

        Example: ``graph.execute(1, scale=2.0).get()``.

        Raises:
            InputMismatchError: the arguments do not match the graph's inputs.
            InputSerializationError: an argument cannot be sent (it cannot be pickled: a
                lambda, a generator, a lock); the message names it.
            CapacityExceededError: at capacity with ``at_capacity="raise"``.
            SubmitTimeoutError: no room within the submit timeout.
            ActorDiedError / GraphFailedError / GraphTornDownError: the graph is down.
        """
        if len(args) != self._fast_npos or kwargs.keys() != self._kwset:
            self._check_inputs(args, kwargs)
        ends, state, book = self.endpoints, self._state, self._book
        with self._submit_lock:
            # Why failure too: between the monitor recording a failure and its teardown
            # setting closing, a get() may already have raised that failure; no later
            # submit may then succeed.
            if state.closing or state.failure is not None:
                raise state.down_error()
            if self._submitted - min(ends.positions) >= self.config.capacity:
                book.make_room(self._submitted)
            timeout = self.config.submit_timeout
            t0 = time.monotonic_ns() if self.trace_events is not None else 0
            try:
                ends.write_inputs(args, kwargs, timeout)
            except ChannelTimeoutError:
                raise SubmitTimeoutError(
                    f"graph {self.name!r}: no room for execution {self._submitted} "
                    f"within {timeout} s (submit timeout)") from None
            except ChannelClosedError:
                raise state.down_error() from None
            except AbandonedSubmitError as exc:
                # The execution is in flight, failing as a whole: nobody holds its refs.
                e = self._submitted
                self._submitted = e + 1
                for _ in range(self._nrefs):
                    book.release(e)
                raise exc.error from exc.__cause__
            except PartialSubmitError as exc:
                state.fail_soon(GraphFailedError, "an input could not be written after other "
                                f"inputs of the execution were ({exc}); the graph cannot stay "
                                "consistent")
                raise state.down_error() from exc.cause
            for d in self.bell_ahead:  # wake-ahead: the first hops' readers start spinning
                self.bells.ring(d)
            e = self._submitted
            self._submitted = e + 1
            if t0:
                self.trace_events.append(("submit", e, t0, time.monotonic_ns()))  # type: ignore[union-attr]
        if self._multi:
            return [self._ref_type(book, e, i) for i in range(self._nrefs)]
        return self._ref_type(book, e, 0)

    def release_dropped(self) -> None:
        """Read and free the oldest executions whose refs were all dropped, up to the first
        one a ref still wants (waiting for each up to the get timeout): what Ray does after
        each ``get`` and before each ``execute``, so that a dropped execution holds no
        place and no buffer. cgc's own paths do it lazily; the Ray drop-in calls this.

        Example: ``graph.release_dropped(); assert graph.buffered == 0``.

        Raises:
            SubmitTimeoutError: a dropped execution did not finish within the get timeout.
            GraphTornDownError / GraphFailedError: the graph is down.
        """
        if self._state.closing:
            return
        with self._submit_lock:
            self._book.free_dropped(self._submitted)

    async def execute_async(self, *args: Any, **kwargs: Any) -> Ref | list[Ref]:
        """``execute()`` for asyncio: waits for room without blocking the event loop.

        Returns the same ``Ref``s; ``await ref`` gives the value.

        Example: ``value = await (await graph.execute_async(1))``.

        Raises:
            The same errors as ``execute``.
        """
        if self.in_flight() < self.config.capacity or self._raise_at_capacity:
            return self.execute(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor(), functools.partial(self.execute, *args, **kwargs))

    def _executor(self) -> Any:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            with self._teardown_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=max(2, min(self.config.capacity + 1, 16)),
                        thread_name_prefix=f"cgc-async-{self.gid}")
        return self._pool

    def cuda_graph_stats(self, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        """What each captured call did so far (``Program.captured_ops``), by node name:
        ``{"captures", "replays", "eager", "fallbacks": {what: why}}``; empty where the
        plan captures nothing or the actors have no CUDA (then every call is eager).

        Example: ``graph.cuda_graph_stats()["gpt_stage0.forward#0"]["replays"]``.

        Raises:
            GraphTornDownError: after teardown.
        """
        import ray

        from cgc.runtime.actor.entry import cuda_graph_stats
        from cgc.runtime.ray_internals import call_in_actor

        if self._state.closing:
            raise GraphTornDownError(f"graph {self.name!r} was torn down")
        proto = self.plan.proto
        names = [a.name for a, p in zip(proto.graph.actors, proto.lowered.programs,
                                        strict=True) if p.captured_ops]
        refs = [call_in_actor(self.actors[n], cuda_graph_stats, self.gid) for n in names]
        out: dict[str, dict[str, Any]] = {}
        for stats in ray.get(refs, timeout=timeout):
            out.update(stats)
        return out

    def where_blocked(self, timeout: float = 1.0) -> list[dict[str, Any]]:
        """Where each actor's loop is: rows ``{"actor", "execution", "op", "token",
        "waiting"}`` (empty when unknown); actors that do not answer within ``timeout``
        seconds are marked so."""
        if self.monitor is None:
            return []
        try:
            return self.monitor.where_blocked(timeout=max(timeout, 0.01))
        except Exception:  # noqa: BLE001 - a report must not hide the timeout
            return []

    # ------------------------------------------------------------------ failure, teardown
    def fail(self, cls: type, message: str, **kw: Any) -> None:
        """Record why the graph failed (first reason wins) and tear it down.

        Example: ``graph.fail(ActorDiedError, "graph 'g': actor a died")``.
        """
        self._state.record(cls, message, **kw)
        self.teardown()

    def wake_waiters(self) -> None:
        """Wake threads waiting for buffered results to be fetched (teardown calls this)."""
        self._book.wake_waiters()

    def close_endpoints(self) -> None:
        """Close the driver's endpoints once no thread is inside them (teardown step).

        Why the locks: another thread may still be inside a (poisoned) read or write;
        unmapping under it would fail. Poisoned calls return at once, so the wait is short.
        """
        got_submit = self._submit_lock.acquire(timeout=2.0)
        try:
            if got_submit:
                self.endpoints.close_inputs()
            self._book.close(timeout=2.0)
            if got_submit and self.bells is not None:
                self.bell_ahead = []
                self.bells.close()
                self.bells = None
        finally:
            if got_submit:
                self._submit_lock.release()

    def shutdown_pool(self) -> None:
        """Stop the async helper pool (teardown's last step)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            on_pool = threading.current_thread().name.startswith(f"cgc-async-{self.gid}")
            pool.shutdown(wait=not on_pool, cancel_futures=True)

    def teardown(self) -> None:
        """Stop the loops, close channels, kill the actors the plan created; idempotent.

        Pending refs raise ``GraphTornDownError`` (or the failure that caused teardown);
        buffered results can still be fetched. External actors stay alive and reusable.

        Example: ``graph.teardown(); graph.teardown()  # the second call does nothing``.
        """
        from cgc.runtime.driver.interrupts import deferred_interrupts
        from cgc.runtime.driver.teardown import teardown_graph

        with self._teardown_lock:
            first = not self._state.closing
            self._state.closing = True
        if not first:
            # Another thread (often the monitor) is tearing down: wait until it is done,
            # so that "teardown() returned" always means "nothing is left" - unless this is
            # the monitor, which the first caller joins.
            mon = self.monitor
            if mon is None or not mon.is_current_thread():
                self._torn_down.wait(self.config.teardown_timeout + 10)
            return
        # A Ctrl-C in the middle would leave actors and shared memory behind: it is raised
        # once teardown is done (which its timeouts bound).
        with deferred_interrupts():
            try:
                teardown_graph(self)
            finally:
                self._torn_down.set()
                _LIVE.discard(self)

    def __enter__(self) -> CompiledGraph:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.teardown()

    def __repr__(self) -> str:
        state = "torn down" if self._state.closing else "running"
        return (f"<cgc.CompiledGraph {self.name!r} {state}: {len(self.actors)} actors, "
                f"{self._submitted} executions>")
