"""``ResultBook``: the driver's book of results, from the output channels to the refs.

It reads the output channels (``DriverEndpoints``), holds what it read for refs not
fetched yet, hands each ref its value once, and accounts for refs dropped unfetched.
``CompiledGraph`` owns one and submits; ``Ref`` fetches from it directly (one call from
``ref.get()`` to the read loop).

Semantics (Ray Compiled Graph's where they are right):

- **Fail-fast across one execution's outputs.** An execution is complete when every output
  has been read or when one of them is an error; then every ref of that execution raises
  that error (the siblings' values are still read later, so positions never shift).
  While several outputs of an execution are pending, the book waits on the first and
  polls the others between short slices, so an error in any output is seen within
  ``_SLICE_MAX`` (20 ms) however slow its siblings are.
- **Capacity.** At capacity ``make_room`` either reads the oldest result into the book,
  waiting up to the submit timeout (``at_capacity="wait"``), or raises
  ``CapacityExceededError`` (``"raise"``, Ray's behaviour) after reading the executions
  whose refs were all dropped.
- **Buffered results** (read for refs not fetched yet) are bounded by
  ``max_buffered_results`` and ``max_buffered_bytes`` on every path, counting the
  execution being read (Ray's count): ``fetch`` of execution N raises
  ``ResultBufferFullError`` instead of buffering without bound; ``make_room`` waits.

Lock: the book's own (``lock``), taken after the graph's submit lock where a caller
holds both, so a thread waiting for a result never blocks another thread's submit.
Dropping a ref (``release``) takes no lock: it may run in any thread, at any moment.

Example::

    book = ResultBook(state, endpoints, config, nrefs=1, trace_events=None,
                      executor=pool_getter)
    ref = Ref(book, 0, 0)
    value = book.fetch(ref, timeout=5.0)     # what ref.get(5.0) calls
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cgc.plan_schema.defaults import RunConfig
from cgc.runtime.channels.errors import (
    ChannelClosedError,
    ChannelSequenceError,
    ChannelTimeoutError,
    ErrorValue,
)
from cgc.runtime.driver.graph_ends import DriverEndpoints
from cgc.runtime.driver.graph_state import GraphState
from cgc.runtime.errors import (
    CapacityExceededError,
    GetTimeoutError,
    GraphFailedError,
    ResultBufferFullError,
    SubmitTimeoutError,
    format_blocked,
    to_exception,
)

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from cgc.runtime.driver.refs import Ref

__all__ = ["ResultBook"]

_MISSING = object()
# While several outputs of one execution are pending, the book waits on the first for a
# slice of time this long (doubling from MIN) and then polls the others: an error in any
# output is noticed within _SLICE_MAX however slow its siblings are.
_SLICE_MIN = 0.001
_SLICE_MAX = 0.02
# The hang report of a get() timeout is made within the timeout: its last quarter, between
# 0.1 and 0.5 s (and at most half of it).
_REPORT_SHARE = 0.25
_REPORT_MIN = 0.1
_REPORT_MAX = 0.5


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


class ResultBook:
    """Results read from a graph's output channels, held until their refs fetch them.

    ``state`` is the graph's down state (read before every read), ``endpoints`` the
    driver's ends (the book reads the output readers only), ``config`` the run's
    ``RunConfig``, ``nrefs`` the refs per execution, ``trace_events`` the graph's trace
    list (None when not tracing), ``executor`` returns the pool ``fetch_async`` runs on.
    """

    def __init__(self, state: GraphState, endpoints: DriverEndpoints, config: RunConfig,
                 nrefs: int, trace_events: list[tuple[str, int, int, int]] | None,
                 executor: Callable[[], Executor]) -> None:
        self._state = state
        self._name = state.name
        self._ends = endpoints
        self._cfg = config
        self._nrefs = nrefs
        self._trace = trace_events
        self._executor = executor
        self._report: Callable[[float], list[dict[str, Any]]] | None = None
        self.lock = threading.Lock()
        self._room = threading.Condition(self.lock)
        self._room_waiters = 0  # threads in _room.wait (lock held to change it)
        self._budget_for: float | None = None  # the get timeout _budget was computed for
        self._budget = 0.0
        self._recs: dict[int, _Exec] = {}
        self._rec_bytes = 0  # payload bytes held by the records
        self._dropped: collections.deque[int] = collections.deque()

    def report_with(self, where_blocked: Callable[[float], list[dict[str, Any]]]) -> None:
        """Make ``get()`` timeouts say where each actor is blocked: ``where_blocked(timeout)``
        returns the rows (the graph's monitor; until then timeouts carry no report).

        Example: ``book.report_with(graph.where_blocked)``.
        """
        self._report = where_blocked

    # ------------------------------------------------------------------ introspection
    @property
    def buffered(self) -> int:
        """Executions with results read from the channels but not fetched or dropped yet."""
        return sum(1 for r in self._recs.values() if r.refs > 0)

    def held_results(self) -> dict[int, dict[int, Any]]:
        """Results read from the channels and held for refs: ``{execution: {output index:
        value}}`` (dropped refs are accounted first).

        Example: ``book.held_results() == {}`` once every ref was fetched or dropped.
        """
        with self.lock:
            self._drain_drops()
            out: dict[int, dict[int, Any]] = {}
            index = self._ends.out_index
            for e, rec in sorted(self._recs.items()):
                vals = {i: rec.vals[k] for i, k in enumerate(index)
                        if rec.vals[k] is not _MISSING}
                if vals:
                    out[e] = vals
            return out

    # ------------------------------------------------------------------ room (submit side)
    def make_room(self, submitted: int) -> None:
        """Called with the graph's submit lock held when ``capacity`` executions of the
        ``submitted`` ones are in flight: read the oldest result into the book (``"wait"``)
        or free dropped executions and raise if still at capacity (``"raise"``).

        Example: ``book.make_room(graph.submitted)``.

        Raises:
            CapacityExceededError: still at capacity with ``at_capacity="raise"``.
            SubmitTimeoutError: no room within the submit timeout (or, in raise mode, a
                dropped execution did not finish within the get timeout).
            ActorDiedError / GraphFailedError / GraphTornDownError: the graph is down.
        """
        cap, ends = self._cfg.capacity, self._ends
        if self._cfg.at_capacity == "raise":
            self._reclaim_dropped(submitted)
            if submitted - min(ends.positions) >= cap:
                n = submitted - min(ends.positions)
                err = CapacityExceededError(
                    f"graph {self._name!r}: {n} executions are in flight and the "
                    f"capacity is {cap}; get() results before submitting more, or raise the "
                    "capacity when compiling (max_inflight_executions)")
                err.in_flight, err.capacity = n, cap
                raise err
            return
        timeout = self._cfg.submit_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        state = self._state
        with self._room:
            while submitted - min(ends.positions) >= cap:
                if state.closing or state.failure is not None:
                    raise state.down_error()
                self._drain_drops()
                k = ends.slowest()
                e = ends.positions[k]
                full = self._buffer_full() if e not in self._recs else ""
                if full:
                    left = None if deadline is None else deadline - time.monotonic()
                    if (left is not None and left <= 0) or not self._wait_for_room(left):
                        raise SubmitTimeoutError(
                            f"graph {self._name!r}: {len(self._recs)} results are buffered "
                            f"unread ({full}); get() or drop older refs")
                    continue
                try:
                    self._read_into(k, deadline)
                except ChannelTimeoutError:
                    raise SubmitTimeoutError(
                        f"graph {self._name!r}: {cap} executions in flight and the oldest did "
                        f"not finish within {timeout} s") from None

    def _wait_for_room(self, left: float | None) -> bool:
        """``_room.wait(left)``, counted: a retired record notifies only when someone waits
        (notifying costs ~0.4 µs of every get() otherwise). Lock held."""
        self._room_waiters += 1
        try:
            return self._room.wait(left)
        finally:
            self._room_waiters -= 1

    def _reclaim_dropped(self, submitted: int) -> None:
        """At capacity in raise mode: executions whose refs were all dropped hold places only
        until their results are read, so read (and free) them, oldest first, waiting for each
        up to the get timeout as Ray does; stop at the first execution a ref still wants.

        Raises:
            SubmitTimeoutError: a dropped execution did not finish within the get timeout.
        """
        rec = self._recs.get(min(self._ends.positions))
        if not self._dropped and (rec is None or rec.refs > 0):
            return  # nothing dropped: no lock to wait for (a get() may be holding it)
        with self._room:
            self._free_dropped_head(submitted, until_room=True)

    def free_dropped(self, submitted: int) -> None:
        """Read and free the oldest executions whose refs were all dropped, up to the first
        one a ref still wants (waiting for each up to the get timeout). The caller holds
        the graph's submit lock (``submitted`` executions were submitted).

        Example: ``with submit_lock: book.free_dropped(submitted)``.

        Raises:
            SubmitTimeoutError: a dropped execution did not finish within the get timeout.
            GraphTornDownError / GraphFailedError: the graph is down.
        """
        with self._room:
            self._free_dropped_head(submitted, until_room=False)

    def _free_dropped_head(self, submitted: int, until_room: bool) -> None:
        """Both locks held. Read dropped executions at the head (``until_room``: only while
        the graph is at capacity)."""
        ends, state = self._ends, self._state
        timeout = self._cfg.get_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        self._drain_drops()
        while submitted > min(ends.positions):
            if until_room and submitted - min(ends.positions) < self._cfg.capacity:
                return
            if state.closing or state.failure is not None:
                raise state.down_error()
            k = ends.slowest()
            rec = self._recs.get(ends.positions[k])
            if rec is None or rec.refs > 0:
                return  # the oldest is still wanted: it keeps its place
            try:
                self._read_into(k, deadline)
            except ChannelTimeoutError:
                raise SubmitTimeoutError(
                    f"graph {self._name!r}: execution {ends.positions[k]}, whose refs were "
                    f"all dropped, did not finish within {timeout} s (get timeout); its "
                    "place stays taken until it does") from None

    # ------------------------------------------------------------------ dropped refs
    def release(self, exec_index: int) -> None:
        """One ref of ``exec_index`` was dropped unfetched (lock-free; ``Ref.__del__``).

        Example: ``book.release(3)``.
        """
        self._dropped.append(exec_index)

    def _drain_drops(self) -> None:
        dq = self._dropped
        while dq:
            e = dq.popleft()
            rec = self._recs.get(e)
            if rec is None:
                rec = self._recs[e] = _Exec(len(self._ends.readers), self._nrefs)
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
        cfg = self._cfg
        if len(self._recs) >= cfg.max_buffered_results:
            return f"max_buffered_results={cfg.max_buffered_results}"
        if self._rec_bytes >= cfg.max_buffered_bytes:
            return f"max_buffered_bytes={cfg.max_buffered_bytes}"
        return ""

    # ------------------------------------------------------------------ reading
    def _read_into(self, k: int, deadline: float | None) -> None:
        """Read output reader ``k``'s next value into its execution's record."""
        ends = self._ends
        e = ends.positions[k]
        left = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left < 0.0:
                left = 0.0
        t0 = time.monotonic_ns() if self._trace is not None else 0
        try:
            value = ends.read(k, left)
        except ChannelClosedError:
            raise self._state.down_error() from None
        except ChannelSequenceError as exc:  # the channel lost track: nothing can be trusted
            self._state.fail_soon(GraphFailedError,
                                  f"output channel c{ends.out_channels[k]}: {exc}")
            raise self._state.down_error() from None
        if t0:
            self._trace.append(  # type: ignore[union-attr]
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
        node, actor, method = self._ends.producers[k]
        what = "could not be decoded in the driver" if ev.cause == "decode" else \
            "was lost by an interrupted read in the driver"
        detail = ev.extra.get("detail", ev.message)  # a decode error's own words
        return ErrorValue(
            None, ev.type_name,
            f"graph {self._name!r}: the result of {node} (actor {actor!r}) for execution {e} "
            f"{what} (output channel c{self._ends.out_channels[k]}): {detail}",
            ev.traceback_text, actor=actor, method=method, exec_index=e, extra=ev.extra)

    def _complete(self, e: int, deadline: float | None) -> _Exec:
        """Read until execution ``e`` is complete (all outputs, or an error). Lock held.

        Raises:
            ChannelTimeoutError: the deadline passed (nothing is lost: reads resume later).
            ResultBufferFullError: completing ``e`` would buffer too many earlier results.
        """
        pos = self._ends.positions
        if len(pos) == 1:
            return self._complete_one(e, deadline)
        state = self._state
        slice_s = 0.0
        while True:
            rec = self._recs.get(e)
            if rec is not None and rec.done:
                return rec
            if state.closing:
                raise state.down_error()
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
        recs, pos, cfg, state = self._recs, self._ends.positions, self._cfg, self._state
        while True:
            rec = recs.get(e)
            if rec is not None and (rec.missing == 0 or rec.error is not None):
                return rec
            if state.closing:
                raise state.down_error()
            if pos[0] not in recs and (len(recs) >= cfg.max_buffered_results
                                       or self._rec_bytes >= cfg.max_buffered_bytes):
                self._check_room(0, e)  # raises ResultBufferFullError, naming the limit
            self._read_into(0, deadline)

    def _check_room(self, k: int, e: int) -> None:
        """Raise if reading output reader ``k``'s next value would buffer one result too
        many while execution ``e`` is fetched (lock held)."""
        if self._ends.positions[k] in self._recs:
            return  # its record exists: reading adds none
        # The record being completed counts too (as in Ray): with a limit of N, at most
        # N - 1 earlier results can wait while execution e is read.
        full = self._buffer_full()
        if full:
            waiting = sorted(x for x, r in self._recs.items() if x < e and r.refs > 0)
            err = ResultBufferFullError(
                f"graph {self._name!r}: fetching execution {e} would buffer more "
                f"results than allowed ({full}; {len(self._recs)} held now); get() or "
                f"drop the refs of earlier executions first"
                + (f" (unfetched: {', '.join(map(str, waiting[:8]))})" if waiting else ""))
            err.buffered = len(self._recs)
            if full.startswith("max_buffered_results"):
                err.limit = self._cfg.max_buffered_results
            raise err

    def _read_some(self, k: int, deadline: float) -> None:
        """``_read_into`` that treats running out of time as "nothing yet"."""
        try:
            self._read_into(k, deadline)
        except ChannelTimeoutError:
            pass

    # ------------------------------------------------------------------ fetch
    def fetch(self, ref: Ref, timeout: float | None) -> Any:
        """The value of ``ref`` (``Ref.get`` calls this); see ``Ref.get`` for errors.

        ``timeout`` None takes the run's get timeout.

        Example: ``book.fetch(ref, 5.0)``.

        Raises:
            The errors of ``Ref.get``.
        """
        if timeout is None:
            timeout = self._cfg.get_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        e = ref.exec_index
        if not self.lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise self._timeout_error(e, timeout)
        try:
            if self._dropped:
                self._drain_drops()
            rec = self._complete_or_report(e, deadline, timeout)
            value = rec.error
            if value is None:
                value = rec.vals[self._ends.out_index[ref.output_index]]
            rec.refs -= 1
            ref._done = True
            self._retire(e, rec)
        finally:
            self.lock.release()
        if type(value) is ErrorValue:
            raise to_exception(value)
        return value

    async def fetch_async(self, ref: Ref) -> Any:
        """``fetch`` on the graph's small thread pool (``await ref`` calls this).

        Example: ``value = await book.fetch_async(ref)``.

        Raises:
            The errors of ``Ref.get``.
        """
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
        if deadline is not None and timeout and self._report is not None:
            if timeout != self._budget_for:  # the same timeout, get after get: reuse it
                self._budget = min(_REPORT_MAX, max(_REPORT_MIN, _REPORT_SHARE * timeout),
                                   timeout / 2)
                self._budget_for = timeout
            budget = self._budget
        # One output channel (an echo, a chain): straight to its loop, a call less per get.
        complete = self._complete_one if len(self._ends.positions) == 1 else self._complete
        try:
            return complete(e, None if deadline is None else deadline - budget)
        except ChannelTimeoutError:
            pass
        # No budget (a zero timeout: a poll, or no monitor): no report rather than a late one.
        rows = self._where_blocked(budget) if budget else []
        try:
            return self._complete(e, deadline)
        except ChannelTimeoutError:
            raise self._timeout_error(e, timeout, rows) from None

    def _where_blocked(self, timeout: float = 1.0) -> list[dict[str, Any]]:
        return [] if self._report is None else self._report(timeout)

    def _timeout_error(self, e: int, timeout: float | None,
                       rows: list[dict[str, Any]] | None = None) -> GetTimeoutError:
        if rows is None:
            rows = self._where_blocked()
        err = GetTimeoutError(
            f"graph {self._name!r}: execution {e} not ready after {timeout} s (get timeout)"
            + (";\n" + format_blocked(rows) if rows else ""))
        err.blocked = rows
        return err

    # ------------------------------------------------------------------ teardown
    def wake_waiters(self) -> None:
        """Wake threads waiting for buffered results to be fetched (teardown calls this).

        Example: ``book.wake_waiters()``.
        """
        if self.lock.acquire(timeout=2.0):
            try:
                self._room.notify_all()
            finally:
                self.lock.release()

    def close(self, timeout: float = 2.0) -> None:
        """Close the output readers once no thread is reading them (up to ``timeout``
        seconds; a poisoned read returns at once, so the wait is short), and wake the
        threads waiting for room. Without the lock in time, nothing is closed.

        Example: ``book.close()``.
        """
        if not self.lock.acquire(timeout=timeout):
            return
        try:
            self._ends.close_outputs()
            self._room.notify_all()
        finally:
            self.lock.release()
