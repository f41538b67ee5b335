"""``CompiledGraph``: the driver side of a started plan (submit, fetch, fail, tear down).

Hot path: ``execute()`` checks the argument count, writes each input channel once (a
broadcast to N actors on this node is one write) and returns ``Ref``s; ``get()`` reads the
output channels until its execution is complete, buffering what it reads for other refs.
No Ray RPCs, no allocation of channels, no imports on either path.

Semantics (Ray Compiled Graph's where they are right):

- **Fail-fast across one execution's outputs.** An execution is complete when every output
  has been read or when one of them is an error; then every ref of that execution raises
  that error (the siblings' values are still read later, so positions never shift).
  While several outputs of an execution are pending, the driver waits on the first and
  polls the others between short slices, so an error in any output is seen within
  ``_SLICE_MAX`` (20 ms) however slow its siblings are.
- **Capacity.** At most ``capacity`` executions are in flight (submitted, with some output
  not read yet). At capacity ``execute()`` either reads the oldest result into the buffer,
  waiting up to the submit timeout (``at_capacity="wait"``, cgc's default), or raises
  ``CapacityExceededError`` at once (``"raise"``, Ray's behaviour).
- **Buffered results** (read for refs not fetched yet) are bounded by
  ``max_buffered_results`` on every path, counting the execution being read (Ray's
  count): ``get()`` of execution N raises ``ResultBufferFullError`` instead of buffering
  without bound; ``execute()`` waits.

Locks: ``_submit_lock`` (input writes) and ``_read_lock`` (output reads, the result
buffer), always taken in that order, so a thread waiting for a result never blocks another
thread's submit.

Example::

    with plan.start() as graph:
        refs = [graph.execute(i) for i in range(4)]
        print([r.get() for r in reversed(refs)])
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import functools
import threading
import time
import weakref
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import RunConfig
from cgc.plan_schema.inputs import input_problems, positional_arity
from cgc.runtime.channels.errors import (
    ChannelClosedError,
    ChannelSequenceError,
    ChannelTimeoutError,
    ErrorValue,
)
from cgc.runtime.driver_io import AbandonedSubmitError, DriverEndpoints, PartialSubmitError
from cgc.runtime.errors import (
    CapacityExceededError,
    GetTimeoutError,
    GraphFailedError,
    GraphTornDownError,
    InputMismatchError,
    ResultBufferFullError,
    SubmitTimeoutError,
    format_blocked,
    to_exception,
)
from cgc.runtime.refs import Ref

__all__ = ["CompiledGraph", "live_graphs", "teardown_all"]

_LIVE: weakref.WeakSet = weakref.WeakSet()
_atexit_registered = False
_MISSING = object()
# While several outputs of one execution are pending, the driver waits on the first for a
# slice of time this long (doubling from MIN) and then polls the others: an error in any
# output is noticed within _SLICE_MAX however slow its siblings are.
_SLICE_MIN = 0.001
_SLICE_MAX = 0.02
# The hang report of a get() timeout is made within the timeout: its last quarter, between
# 0.1 and 0.5 s (and at most half of it).
_REPORT_SHARE = 0.25
_REPORT_MIN = 0.1
_REPORT_MAX = 0.5


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


class _Exec:
    """One execution's outputs as read so far, and its refs not fetched or dropped yet."""

    __slots__ = ("vals", "missing", "error", "refs", "nbytes")

    def __init__(self, n_readers: int, refs: int) -> None:
        self.vals: list[Any] = [_MISSING] * n_readers
        self.missing = n_readers
        self.error: Any = None
        self.refs = refs
        self.nbytes = 0

    @property
    def done(self) -> bool:
        return self.missing == 0 or self.error is not None


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
    """

    def __init__(self, plan: Any, gid: str, prefix: str, config: RunConfig) -> None:
        self.plan = plan
        self.name: str = plan.name
        self.gid, self.prefix = gid, prefix
        self.config = config
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
        self.ray_session = ""  # cluster.ray_session() when started: whose handles these are
        self.endpoints = DriverEndpoints(plan.proto)
        self.bells: Any = None  # the doorbells when wake-ahead is on (cgc.runtime.wake)
        self.bell_ahead: list[int] = []  # depths the driver rings at each submit
        g = plan.proto.graph
        # Arity of the common call, checked inline on the hot path (see _check_inputs).
        self._fast_npos = positional_arity(g)
        self._kwset = frozenset(g.keyword_fields)
        self._multi = any(n.multi_output for n in g.nodes if n.kind == pb.OUTPUT)
        self._nrefs = len(self.endpoints.out_index) if self._multi else 1
        self._raise_at_capacity = config.at_capacity == "raise"
        # (what, execution, t0, t1) of submits and output reads when tracing, else None.
        self.trace_events: list[tuple[str, int, int, int]] | None = (
            [] if config.trace else None)
        self._submit_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._room = threading.Condition(self._read_lock)
        self._room_waiters = 0  # threads in _room.wait (read lock held to change it)
        self._budget_for: float | None = None  # the get timeout _budget was computed for
        self._budget = 0.0
        self._submitted = 0
        self._recs: dict[int, _Exec] = {}
        self._rec_bytes = 0  # payload bytes held by the records
        self._dropped: collections.deque[int] = collections.deque()
        self._dead: set[str] = set()
        self._closing = False
        self._failure: tuple[type, str, dict] | None = None
        self._failed_evt = threading.Event()
        self._teardown_lock = threading.Lock()
        self._torn_down = threading.Event()
        self._pool: Any = None

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
    def closing(self) -> bool:
        """True once teardown has begun (for any reason)."""
        return self._closing

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
        return sum(1 for r in self._recs.values() if r.refs > 0)

    def in_flight(self) -> int:
        """Executions submitted whose outputs are not all read from the channels yet."""
        pos = self.endpoints.positions
        return self._submitted - (min(pos) if pos else self._submitted)

    # ------------------------------------------------------------------ wiring (start)
    def register(self) -> None:
        """Make interpreter exit tear this graph down (``start()`` calls it)."""
        global _atexit_registered
        _LIVE.add(self)
        if not _atexit_registered:
            atexit.register(teardown_all)
            _atexit_registered = True

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
        ends = self.endpoints
        with self._submit_lock:
            # Why _failure too: between the monitor recording a failure and its teardown
            # setting _closing, a get() may already have raised that failure; no later
            # submit may then succeed.
            if self._closing or self._failure is not None:
                raise self._down_error()
            if self._submitted - min(ends.positions) >= self.config.capacity:
                self._make_room()
            timeout = self.config.submit_timeout
            t0 = time.monotonic_ns() if self.trace_events is not None else 0
            try:
                ends.write_inputs(args, kwargs, timeout)
            except ChannelTimeoutError:
                raise SubmitTimeoutError(
                    f"graph {self.name!r}: no room for execution {self._submitted} "
                    f"within {timeout} s (submit timeout)") from None
            except ChannelClosedError:
                raise self._down_error() from None
            except AbandonedSubmitError as exc:
                # The execution is in flight, failing as a whole: nobody holds its refs.
                e = self._submitted
                self._submitted = e + 1
                for _ in range(self._nrefs):
                    self.release(e)
                raise exc.error from exc.__cause__
            except PartialSubmitError as exc:
                self._fail_async(GraphFailedError, "an input could not be written after other "
                                 f"inputs of the execution were ({exc}); the graph cannot stay "
                                 "consistent")
                raise self._down_error() from exc.cause
            for d in self.bell_ahead:  # wake-ahead: the first hops' readers start spinning
                self.bells.ring(d)
            e = self._submitted
            self._submitted = e + 1
            if t0:
                self.trace_events.append(("submit", e, t0, time.monotonic_ns()))  # type: ignore[union-attr]
        if self._multi:
            return [Ref(self, e, i) for i in range(self._nrefs)]
        return Ref(self, e, 0)

    def _make_room(self) -> None:
        """Called with the submit lock held when ``capacity`` executions are in flight."""
        cap, ends = self.config.capacity, self.endpoints
        if self._raise_at_capacity:
            self._reclaim_dropped()
            if self._submitted - min(ends.positions) >= cap:
                n = self.in_flight()
                err = CapacityExceededError(
                    f"graph {self.name!r}: {n} executions are in flight and the "
                    f"capacity is {cap}; get() results before submitting more, or raise the "
                    "capacity when compiling (max_inflight_executions)")
                err.in_flight, err.capacity = n, cap
                raise err
            return
        timeout = self.config.submit_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._room:
            while self._submitted - min(ends.positions) >= cap:
                if self._closing or self._failure is not None:
                    raise self._down_error()
                self._drain_drops()
                k = ends.slowest()
                e = ends.positions[k]
                full = self._buffer_full() if e not in self._recs else ""
                if full:
                    left = None if deadline is None else deadline - time.monotonic()
                    if (left is not None and left <= 0) or not self._wait_for_room(left):
                        raise SubmitTimeoutError(
                            f"graph {self.name!r}: {len(self._recs)} results are buffered "
                            f"unread ({full}); get() or drop older refs")
                    continue
                try:
                    self._read_into(k, deadline)
                except ChannelTimeoutError:
                    raise SubmitTimeoutError(
                        f"graph {self.name!r}: {cap} executions in flight and the oldest did "
                        f"not finish within {timeout} s") from None

    def _wait_for_room(self, left: float | None) -> bool:
        """``_room.wait(left)``, counted: a retired record notifies only when someone waits
        (notifying costs ~0.4 µs of every get() otherwise). Read lock held."""
        self._room_waiters += 1
        try:
            return self._room.wait(left)
        finally:
            self._room_waiters -= 1

    def _reclaim_dropped(self) -> None:
        """At capacity in raise mode: executions whose refs were all dropped hold places only
        until their results are read, so read (and free) them, oldest first, waiting for each
        up to the get timeout as Ray does; stop at the first execution a ref still wants.

        Raises:
            SubmitTimeoutError: a dropped execution did not finish within the get timeout.
        """
        ends = self.endpoints
        rec = self._recs.get(min(ends.positions))
        if not self._dropped and (rec is None or rec.refs > 0):
            return  # nothing dropped: no lock to wait for (a get() may be holding it)
        with self._room:
            self._free_dropped_head(until_room=True)

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
        if self._closing:
            return
        with self._submit_lock, self._room:
            self._free_dropped_head(until_room=False)

    def _free_dropped_head(self, until_room: bool) -> None:
        """Both locks held. Read dropped executions at the head (``until_room``: only while
        the graph is at capacity)."""
        ends = self.endpoints
        timeout = self.config.get_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        self._drain_drops()
        while self._submitted > min(ends.positions):
            if until_room and self._submitted - min(ends.positions) < self.config.capacity:
                return
            if self._closing or self._failure is not None:
                raise self._down_error()
            k = ends.slowest()
            rec = self._recs.get(ends.positions[k])
            if rec is None or rec.refs > 0:
                return  # the oldest is still wanted: it keeps its place
            try:
                self._read_into(k, deadline)
            except ChannelTimeoutError:
                raise SubmitTimeoutError(
                    f"graph {self.name!r}: execution {ends.positions[k]}, whose refs were "
                    f"all dropped, did not finish within {timeout} s (get timeout); its "
                    "place stays taken until it does") from None

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
        with self._read_lock:
            self._drain_drops()
            out: dict[int, dict[int, Any]] = {}
            index = self.endpoints.out_index
            for e, rec in sorted(self._recs.items()):
                vals = {i: rec.vals[k] for i, k in enumerate(index)
                        if rec.vals[k] is not _MISSING}
                if vals:
                    out[e] = vals
            return out

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

    # ------------------------------------------------------------------ fetch
    def release(self, exec_index: int) -> None:
        """One ref of ``exec_index`` was dropped unfetched (lock-free; ``Ref.__del__``)."""
        self._dropped.append(exec_index)

    def _drain_drops(self) -> None:
        dq = self._dropped
        while dq:
            e = dq.popleft()
            rec = self._recs.get(e)
            if rec is None:
                rec = self._recs[e] = _Exec(len(self.endpoints.readers), self._nrefs)
            rec.refs -= 1
            self._retire(e, rec)

    def _retire(self, e: int, rec: _Exec) -> None:
        if rec.refs <= 0 and rec.missing == 0:
            del self._recs[e]
            self._rec_bytes -= rec.nbytes
            if self._room_waiters:
                self._room.notify_all()

    def _buffer_full(self) -> str:
        """Why one more buffered result would be too many ("" when there is room)."""
        cfg = self.config
        if len(self._recs) >= cfg.max_buffered_results:
            return f"max_buffered_results={cfg.max_buffered_results}"
        if self._rec_bytes >= cfg.max_buffered_bytes:
            return f"max_buffered_bytes={cfg.max_buffered_bytes}"
        return ""

    def _read_into(self, k: int, deadline: float | None) -> None:
        """Read output reader ``k``'s next value into its execution's record."""
        ends = self.endpoints
        e = ends.positions[k]
        left = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left < 0.0:
                left = 0.0
        t0 = time.monotonic_ns() if self.trace_events is not None else 0
        try:
            value = ends.read(k, left)
        except ChannelClosedError:
            raise self._down_error() from None
        except ChannelSequenceError as exc:  # the channel lost track: nothing can be trusted
            self._fail_async(GraphFailedError, f"output channel c{ends.out_channels[k]}: {exc}")
            raise self._down_error() from None
        if t0:
            self.trace_events.append(  # type: ignore[union-attr]
                (f"read c{ends.out_channels[k]}", e, t0, time.monotonic_ns()))
        rec = self._recs.get(e)
        if rec is None:
            rec = self._recs[e] = _Exec(len(ends.readers), self._nrefs)
        rec.vals[k] = value
        rec.missing -= 1
        nbytes = ends.readers[k].last_nbytes
        rec.nbytes += nbytes
        self._rec_bytes += nbytes
        if type(value) is ErrorValue:
            if value.exec_index < 0:  # made by the channel here (decode, lost): say whose
                value = self._own_error(k, e, value)
                rec.vals[k] = value
            if rec.error is None:
                rec.error = value
        if rec.refs <= 0:  # every ref was dropped: nobody will fetch it
            self._retire(e, rec)

    def _own_error(self, k: int, e: int, ev: ErrorValue) -> ErrorValue:
        """``ev`` (an error the driver's channel made for value ``e`` of reader ``k``: it could
        not be decoded here, or an interrupted read lost it) naming the graph, the execution,
        the actor and the method whose result it stands for."""
        node, actor, method = self.endpoints.producers[k]
        what = "could not be decoded in the driver" if ev.cause == "decode" else \
            "was lost by an interrupted read in the driver"
        detail = ev.extra.get("detail", ev.message)  # a decode error's own words
        return ErrorValue(
            None, ev.type_name,
            f"graph {self.name!r}: the result of {node} (actor {actor!r}) for execution {e} "
            f"{what} (output channel c{self.endpoints.out_channels[k]}): {detail}",
            ev.traceback_text, actor=actor, method=method, exec_index=e, extra=ev.extra)

    def _complete(self, e: int, deadline: float | None) -> _Exec:
        """Read until execution ``e`` is complete (all outputs, or an error). Read lock held.

        Raises:
            ChannelTimeoutError: the deadline passed (nothing is lost: reads resume later).
            ResultBufferFullError: completing ``e`` would buffer too many earlier results.
        """
        pos = self.endpoints.positions
        if len(pos) == 1:
            return self._complete_one(e, deadline)
        slice_s = 0.0
        while True:
            rec = self._recs.get(e)
            if rec is not None and rec.done:
                return rec
            if self._closing:
                raise self._down_error()
            behind = [i for i in range(len(pos)) if pos[i] <= e]
            for k in behind:
                self._check_room(k, e)
            if len(behind) == 1:
                self._read_into(behind[0], deadline)
                continue
            # Several outputs are behind: an error in any of them completes e, so never
            # block on one alone (fail-fast without waiting for the slowest output).
            slice_s = min(slice_s * 2, _SLICE_MAX) if slice_s else _SLICE_MIN
            t_end = time.monotonic() + slice_s
            self._read_some(behind[0], t_end if deadline is None else min(deadline, t_end))
            for k in behind[1:]:
                self._read_some(k, 0.0)
            if deadline is not None and time.monotonic() >= deadline:
                rec = self._recs.get(e)
                if rec is not None and rec.done:
                    return rec
                raise ChannelTimeoutError(f"execution {e} not complete")

    def _complete_one(self, e: int, deadline: float | None) -> _Exec:
        """``_complete`` for a graph with one output channel (the echo's hot path: no
        fail-fast juggling, so read it until ``e``'s value is in)."""
        recs, pos, cfg = self._recs, self.endpoints.positions, self.config
        while True:
            rec = recs.get(e)
            if rec is not None and (rec.missing == 0 or rec.error is not None):
                return rec
            if self._closing:
                raise self._down_error()
            if pos[0] not in recs and (len(recs) >= cfg.max_buffered_results
                                       or self._rec_bytes >= cfg.max_buffered_bytes):
                self._check_room(0, e)  # raises ResultBufferFullError, naming the limit
            self._read_into(0, deadline)

    def _check_room(self, k: int, e: int) -> None:
        """Raise if reading output reader ``k``'s next value would buffer one result too
        many while execution ``e`` is fetched (read lock held)."""
        if self.endpoints.positions[k] in self._recs:
            return  # its record exists: reading adds none
        # The record being completed counts too (as in Ray): with a limit of N, at most
        # N - 1 earlier results can wait while execution e is read.
        full = self._buffer_full()
        if full:
            waiting = sorted(x for x, r in self._recs.items() if x < e and r.refs > 0)
            err = ResultBufferFullError(
                f"graph {self.name!r}: fetching execution {e} would buffer more "
                f"results than allowed ({full}; {len(self._recs)} held now); get() or "
                f"drop the refs of earlier executions first"
                + (f" (unfetched: {', '.join(map(str, waiting[:8]))})" if waiting else ""))
            err.buffered = len(self._recs)
            if full.startswith("max_buffered_results"):
                err.limit = self.config.max_buffered_results
            raise err

    def _read_some(self, k: int, deadline: float) -> None:
        """``_read_into`` that treats running out of time as "nothing yet"."""
        try:
            self._read_into(k, deadline)
        except ChannelTimeoutError:
            pass

    def fetch(self, ref: Ref, timeout: float | None) -> Any:
        """The value of ``ref`` (``Ref.get`` calls this); see ``Ref.get`` for errors."""
        if timeout is None:
            timeout = self.config.get_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        e = ref.exec_index
        if not self._read_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise self._timeout_error(e, timeout)
        try:
            if self._dropped:
                self._drain_drops()
            rec = self._complete_or_report(e, deadline, timeout)
            value = rec.error
            if value is None:
                value = rec.vals[self.endpoints.out_index[ref.output_index]]
            rec.refs -= 1
            ref._done = True
            self._retire(e, rec)
        finally:
            self._read_lock.release()
        if type(value) is ErrorValue:
            raise to_exception(value)
        return value

    async def fetch_async(self, ref: Ref) -> Any:
        """``fetch`` on the graph's small thread pool (``await ref`` calls this)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), ref.get)

    def _complete_or_report(self, e: int, deadline: float | None,
                            timeout: float | None) -> _Exec:
        """``_complete``, raising ``GetTimeoutError`` with a hang report at the deadline.

        Why the budget: asking the actors where they are takes a moment; it is taken out
        of the timeout (the last ``_REPORT_SHARE`` of it, at most ``_REPORT_MAX``), and the
        channels are read again until the deadline, so get() never overruns its timeout.
        """
        budget = 0.0
        if deadline is not None and timeout and self.monitor is not None:
            if timeout != self._budget_for:  # the same timeout, get after get: reuse it
                self._budget = min(_REPORT_MAX, max(_REPORT_MIN, _REPORT_SHARE * timeout),
                                   timeout / 2)
                self._budget_for = timeout
            budget = self._budget
        # One output channel (an echo, a chain): straight to its loop, a call less per get.
        complete = self._complete_one if len(self.endpoints.positions) == 1 else self._complete
        try:
            return complete(e, None if deadline is None else deadline - budget)
        except ChannelTimeoutError:
            pass
        # No budget (a zero timeout: a poll, or no monitor): no report rather than a late one.
        rows = self.where_blocked(timeout=budget) if budget else []
        try:
            return self._complete(e, deadline)
        except ChannelTimeoutError:
            raise self._timeout_error(e, timeout, rows) from None

    def _timeout_error(self, e: int, timeout: float | None,
                       rows: list[dict[str, Any]] | None = None) -> GetTimeoutError:
        if rows is None:
            rows = self.where_blocked()
        err = GetTimeoutError(
            f"graph {self.name!r}: execution {e} not ready after {timeout} s (get timeout)"
            + (";\n" + format_blocked(rows) if rows else ""))
        err.blocked = rows
        return err

    def cuda_graph_stats(self, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        """What each captured call did so far (``Program.captured_ops``), by node name:
        ``{"captures", "replays", "eager", "fallbacks": {what: why}}``; empty where the
        plan captures nothing or the actors have no CUDA (then every call is eager).

        Example: ``graph.cuda_graph_stats()["gpt_stage0.forward#0"]["replays"]``.

        Raises:
            GraphTornDownError: after teardown.
        """
        import ray

        from cgc.runtime.actor_calls import cuda_graph_stats
        from cgc.runtime.ray_internals import call_in_actor

        if self._closing:
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
    def _down_error(self) -> Exception:
        if self._failure is None and not self._closing:
            # A poisoned channel before the monitor said why: give it a moment to classify.
            self._failed_evt.wait(2.0)
        if self._failure is not None:
            cls, msg, kw = self._failure
            return cls(msg, **kw)
        return GraphTornDownError(f"graph {self.name!r} was torn down")

    def fail(self, cls: type, message: str, **kw: Any) -> None:
        """Record why the graph failed (first reason wins) and tear it down."""
        if self._failure is None:
            self._failure = (cls, message, kw)
            self._failed_evt.set()
        self.teardown()

    def _fail_async(self, cls: type, message: str) -> None:
        # Called with the submit lock held: teardown needs it, so run it on a thread.
        if self._failure is None:
            self._failure = (cls, f"graph {self.name!r}: {message}", {})
            self._failed_evt.set()
        threading.Thread(target=self.teardown, name=f"cgc-fail-{self.gid}", daemon=True).start()

    def wake_waiters(self) -> None:
        """Wake threads waiting for buffered results to be fetched (teardown calls this)."""
        if self._read_lock.acquire(timeout=2.0):
            try:
                self._room.notify_all()
            finally:
                self._read_lock.release()

    def close_endpoints(self) -> None:
        """Close the driver's endpoints once no thread is inside them (teardown step).

        Why the locks: another thread may still be inside a (poisoned) read or write;
        unmapping under it would fail. Poisoned calls return at once, so the wait is short.
        """
        got_submit = self._submit_lock.acquire(timeout=2.0)
        got_read = self._read_lock.acquire(timeout=2.0)
        try:
            if got_submit:
                self.endpoints.close_inputs()
            if got_read:
                self.endpoints.close_outputs()
                self._room.notify_all()
            if got_submit and self.bells is not None:
                self.bell_ahead = []
                self.bells.close()
                self.bells = None
        finally:
            if got_read:
                self._read_lock.release()
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
        from cgc.runtime.interrupts import deferred_interrupts
        from cgc.runtime.teardown import teardown_graph

        with self._teardown_lock:
            first = not self._closing
            self._closing = True
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
        state = "torn down" if self._closing else "running"
        return (f"<cgc.CompiledGraph {self.name!r} {state}: {len(self.actors)} actors, "
                f"{self._submitted} executions>")
