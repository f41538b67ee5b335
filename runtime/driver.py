"""``CompiledGraph``: the driver side of a started plan (submit, fetch, fail, tear down).

Hot path: ``execute()`` checks the argument count, writes each input channel once (a
broadcast to N actors on this node is one write) and returns ``Ref``s; ``get()`` reads the
output channels in execution order, buffering results for refs fetched later. No Ray RPCs,
no allocation of channels, no imports on either path.

Locks: ``_submit_lock`` (input writes) and ``_read_lock`` (output reads and the result
buffer), always taken in that order, so a thread waiting for a result never blocks another
thread's submit. Backpressure: when ``capacity`` executions are in flight (submitted, not
yet read), ``execute()`` reads the oldest result into the buffer (waiting for it, up to the
submit timeout) instead of raising.

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
from collections.abc import Callable
from typing import Any

from cgc.runtime.channels.errors import ChannelClosedError, ChannelTimeoutError, ErrorValue
from cgc.runtime.errors import (
    GetTimeoutError,
    GraphFailedError,
    GraphTornDownError,
    InputMismatchError,
    SubmitTimeoutError,
    to_exception,
)
from cgc.runtime.refs import Ref

__all__ = ["CompiledGraph"]

_LIVE: weakref.WeakSet = weakref.WeakSet()
_atexit_registered = False


def _teardown_all() -> None:
    for g in list(_LIVE):
        try:
            g.teardown()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class CompiledGraph:
    """A running plan. Use it as a context manager, or call ``teardown()`` when done.

    Attributes: ``name``, ``plan`` (the ``cgc.runtime.Plan``), ``actors`` (handles by actor
    name), ``channel_bindings`` (host channel id -> "shm" or "tcp", from real placement),
    ``setup_seconds``, ``capacity``, ``submit_timeout``, ``get_timeout``,
    ``teardown_timeout`` (seconds; None = no limit).
    """

    def __init__(self, plan: Any, gid: str, prefix: str, cfg: dict[str, Any]) -> None:
        self.plan = plan
        self.name: str = plan.name
        self.gid, self.prefix = gid, prefix
        self.capacity: int = cfg["capacity"]
        self.submit_timeout: float | None = cfg["submit_timeout"]
        self.get_timeout: float | None = cfg["get_timeout"]
        self.teardown_timeout: float = cfg["teardown_timeout"]
        self.max_buffered: int = cfg["max_buffered_results"]
        self.setup_seconds = 0.0
        self.actors: dict[str, Any] = {}
        # How each host channel was bound from real placement: channel id -> "shm" | "tcp".
        self.channel_bindings: dict[int, str] = {}
        self.created: set[str] = set()
        self.monitor: Any = None  # set by start: the Monitor watching the actor loops
        self.dead: set[str] = set()  # actors known dead (no teardown RPCs to them)
        g = plan.proto.graph
        self._npos = g.num_positional
        # Arity of the common call, checked inline on the hot path (see _check_inputs).
        self._fast_npos = 1 if g.whole_input and not g.num_positional and not \
            g.keyword_fields else g.num_positional
        self._kwset = frozenset(g.keyword_fields)
        self._whole = g.whole_input
        self._multi = any(n.multi_output for n in g.nodes if n.kind == 5)  # OUTPUT
        # Filled by start: (write, pick(args, kwargs)) per input channel; output readers.
        self._inputs: list[tuple[Callable[..., None], Callable[..., Any]]] = []
        self._in_writers: list[Any] = []
        self._out_readers: list[Any] = []
        self._out_pos: list[int] = []  # OUTPUT arg i -> index into _out_readers
        self._submit_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._room = threading.Condition(self._read_lock)
        self._submitted = 0
        self._nread = 0
        self._partial: list[Any] = []
        self._buf: dict[int, list[Any]] = {}  # exec -> [values, refs still to fetch]
        self._drops: dict[int, int] = {}  # exec (not read yet) -> refs dropped
        self._dropped: collections.deque[int] = collections.deque()
        self._closing = False
        self._closed = False
        self._failure: tuple[type, str, dict] | None = None
        self._failed_evt = threading.Event()
        self._teardown_lock = threading.Lock()
        self._torn_down = threading.Event()
        self._pool: Any = None

    # ------------------------------------------------------------------ wiring (start)
    def _register(self) -> None:
        global _atexit_registered
        _LIVE.add(self)
        if not _atexit_registered:
            atexit.register(_teardown_all)
            _atexit_registered = True

    @property
    def num_outputs(self) -> int:
        """Refs per execution (``len(MultiOutputNode)``, else 1)."""
        return len(self._out_pos) if self._multi else 1

    # ------------------------------------------------------------------ submit
    def _check_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        problems = []
        if self._whole and not self._npos and not self._kwset:
            # A task takes the bare input: it stands for exactly one argument (Ray's rule).
            if len(args) != 1 or kwargs:
                problems.append(f"exactly 1 positional argument, got {len(args)}"
                                + (f" and keywords {', '.join(sorted(kwargs))}" if kwargs else ""))
        elif self._whole:
            if len(args) < self._npos:
                problems.append(f"at least {self._npos} positional argument(s), got {len(args)}")
        elif len(args) != self._npos:
            problems.append(f"{self._npos} positional argument(s), got {len(args)}")
        missing = sorted(self._kwset - kwargs.keys())
        extra = sorted(kwargs.keys() - self._kwset)
        if missing:
            problems.append(f"keyword argument(s) {', '.join(missing)} (missing)")
        if extra and not (self._whole and (self._npos or self._kwset)):
            problems.append(f"no keyword argument(s) {', '.join(extra)}")
        if problems:
            want = ", ".join(
                [f"{self._fast_npos} positional"] + [f"{k}=" for k in sorted(self._kwset)])
            raise InputMismatchError(
                f"graph {self.name!r} takes ({want}); execute() needs " + "; ".join(problems))

    def execute(self, *args: Any, **kwargs: Any) -> Ref | list[Ref]:
        """Submit one execution; return its ``Ref`` (a list of refs for multiple outputs).

        Waits (backpressure) while ``capacity`` executions are in flight.

        Example: ``graph.execute(1, scale=2.0).get()``.

        Raises:
            InputMismatchError: the arguments do not match the graph's inputs.
            SubmitTimeoutError: no room within the submit timeout.
            ActorDiedError / GraphFailedError / GraphTornDownError: the graph is down.
        """
        if len(args) != self._fast_npos or kwargs.keys() != self._kwset:
            self._check_inputs(args, kwargs)
        with self._submit_lock:
            if self._closing:
                raise self._down_error()
            if self._submitted - self._nread >= self.capacity:
                self._make_room()
            timeout = self.submit_timeout
            first = True
            try:
                for write, pick in self._inputs:
                    write(pick(args, kwargs), timeout)
                    first = False
            except ChannelTimeoutError:
                if first:
                    raise SubmitTimeoutError(
                        f"graph {self.name!r}: no room for execution {self._submitted} "
                        f"within {timeout} s (submit timeout)") from None
                self._fail_async(GraphFailedError, "an input channel stayed full past the "
                                 "submit timeout after other inputs of the execution were "
                                 "written; the graph cannot stay consistent")
                raise self._down_error() from None
            except ChannelClosedError:
                raise self._down_error() from None
            except Exception:
                if first:  # e.g. an unpicklable argument: nothing was written
                    raise
                self._fail_async(GraphFailedError, "an input could not be written after "
                                 "other inputs of the execution were")
                raise
            e = self._submitted
            self._submitted = e + 1
        if self._multi:
            return [Ref(self, e, i) for i in range(len(self._out_pos))]
        return Ref(self, e, 0)

    def _make_room(self) -> None:
        deadline = None if self.submit_timeout is None else time.monotonic() + self.submit_timeout
        with self._room:
            while self._submitted - self._nread >= self.capacity:
                if self._closing:
                    raise self._down_error()
                self._drain_drops()
                if len(self._buf) >= self.max_buffered:
                    left = None if deadline is None else deadline - time.monotonic()
                    if (left is not None and left <= 0) or not self._room.wait(left):
                        raise SubmitTimeoutError(
                            f"graph {self.name!r}: {len(self._buf)} results are buffered "
                            f"unread (max_buffered_results={self.max_buffered}); get() or "
                            "drop older refs")
                    continue
                try:
                    self._read_next(deadline)
                except ChannelTimeoutError:
                    raise SubmitTimeoutError(
                        f"graph {self.name!r}: {self.capacity} executions in flight and the "
                        f"oldest did not finish within {self.submit_timeout} s") from None

    async def execute_async(self, *args: Any, **kwargs: Any) -> Ref | list[Ref]:
        """``execute()`` for asyncio: waits for room without blocking the event loop.

        Returns the same ``Ref``s; ``await ref`` gives the value.

        Example: ``value = await (await graph.execute_async(1))``.

        Raises:
            The same errors as ``execute``.
        """
        if self._submitted - self._nread < self.capacity:
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
                        max_workers=max(2, min(self.capacity + 1, 16)),
                        thread_name_prefix=f"cgc-async-{self.gid}")
        return self._pool

    async def _await(self, ref: Ref) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), ref.get)

    # ------------------------------------------------------------------ fetch
    def _drain_drops(self) -> None:
        dq = self._dropped
        while dq:
            e = dq.popleft()
            entry = self._buf.get(e)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del self._buf[e]
                    self._room.notify_all()
            elif e >= self._nread:
                self._drops[e] = self._drops.get(e, 0) + 1

    def _read_next(self, deadline: float | None) -> None:
        """Read the next execution's outputs (resumable after a timeout). Holds _read_lock."""
        vals = self._partial
        readers = self._out_readers
        try:
            while len(vals) < len(readers):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                vals.append(readers[len(vals)].read(left))
        except ChannelClosedError:
            raise self._down_error() from None
        self._partial = []
        e = self._nread
        self._nread = e + 1
        left_refs = self.num_outputs - self._drops.pop(e, 0)
        if left_refs > 0:
            self._buf[e] = [[vals[p] for p in self._out_pos], left_refs]

    def _get(self, ref: Ref, timeout: float | None) -> Any:
        if timeout is None:
            timeout = self.get_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        e = ref.exec_index
        if not self._read_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise self._timeout_error(e, timeout)
        try:
            self._drain_drops()
            while e >= self._nread:
                if self._closing:
                    raise self._down_error()
                try:
                    self._read_next(deadline)
                except ChannelTimeoutError:
                    raise self._timeout_error(e, timeout) from None
            entry = self._buf.get(e)
            if entry is None:  # cannot happen for a live ref; guard against misuse
                raise GraphTornDownError(f"result of execution {e} is gone")
            value = entry[0][ref.output_index]
            entry[0][ref.output_index] = None
            entry[1] -= 1
            if entry[1] <= 0:
                del self._buf[e]
                self._room.notify_all()
            ref._done = True
        finally:
            self._read_lock.release()
        if type(value) is ErrorValue:
            raise to_exception(value)
        return value

    def _timeout_error(self, e: int, timeout: float | None) -> GetTimeoutError:
        where = self._where_blocked()
        return GetTimeoutError(
            f"graph {self.name!r}: execution {e} not ready after {timeout} s (get timeout)"
            + (";\n  " + "\n  ".join(where) if where else ""))

    def _where_blocked(self) -> list[str]:
        if self.monitor is None:
            return []
        try:
            return self.monitor.where_blocked(timeout=1.0)
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

    def teardown(self) -> None:
        """Stop the loops, close channels, kill the actors the plan created; idempotent.

        Pending refs raise ``GraphTornDownError`` (or the failure that caused teardown);
        buffered results can still be fetched. External actors stay alive and reusable.

        Example: ``graph.teardown(); graph.teardown()  # the second call does nothing``.
        """
        from cgc.runtime.teardown import teardown_graph

        with self._teardown_lock:
            first = not self._closing
            self._closing = True
        if not first:
            # Another thread (often the monitor) is tearing down: wait until it is done,
            # so that "teardown() returned" always means "nothing is left" - unless this is
            # the monitor, which the first caller joins.
            mon = self.monitor
            if mon is None or threading.current_thread() is not mon.thread:
                self._torn_down.wait(self.teardown_timeout + 10)
            return
        try:
            teardown_graph(self)
        finally:
            self._closed = True
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
