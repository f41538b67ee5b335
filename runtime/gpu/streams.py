"""One compute stream and one comm stream per actor, the events between them, buffer lifetimes.

Every device communicator of an actor shares one ``ActorStreams``: all NCCL / CUDA IPC work
goes on its single **comm stream**, so device ops execute in the verified plan order (NCCL
does not promise progress for two in-flight ops on different streams). User methods run on
the **compute stream** (the device's default stream, or a dedicated one the executor makes
current around COMPUTE ops).

The executor's contract (no CPU blocking, no device-wide synchronize on the hot path):

- before a SEND / COLL: ``comm_after_compute()`` - the comm stream waits for everything the
  compute stream has queued (the value was produced there). The communicators of this
  package call it themselves at the start of ``send`` and of every collective;
- after a RECV / COLL: the value's tensors may be used on the compute stream only after
  ``compute_after(event)``, where ``event`` is the communicator's ``last_event`` (None when
  nothing moved on the device). With ``eager_wait=True`` (the default) the communicators do
  this themselves before returning, which is simplest but makes later compute-stream work
  wait for the transfer too; an executor that hoists receives sets ``eager_wait=False``
  and calls ``compute_after`` right before the COMPUTE that uses the value;
- lifetimes: a tensor read or written on the comm stream but allocated on the compute
  stream gets ``record_stream(comm)`` (its memory is not reused before the comm stream is
  past it); host-side objects that must outlive queued device work are kept by
  ``keep_until(event, ...)``, a bounded window: when ``window`` entries are pending the
  call waits (polling the oldest event, never ``synchronize``) - back-pressure instead of
  unbounded queueing.

``SYNC_COUNTER`` counts every CPU wait on the device made by this package, and
``count_device_syncs()`` also counts torch's ``synchronize`` calls while it is active, so a
GPU test can assert zero per execution.

Example (CPU-only machines get ``NullStreams``)::

    streams = actor_streams()              # ActorStreams on CUDA, NullStreams otherwise
    with streams.compute_context():
        y = model(x)                       # user work on the compute stream
    streams.comm_after_compute()           # then the send on the comm stream
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from cgc.runtime.channels.errors import ChannelTimeoutError
from cgc.runtime.gpu.polling import poll_until

__all__ = ["ActorStreams", "NullStreams", "actor_streams", "SyncCounter", "SYNC_COUNTER",
           "count_device_syncs", "wait_event"]


class SyncCounter:
    """Counts CPU waits on the device (``count``), thread-safe enough for a test hook."""

    def __init__(self) -> None:
        self.count = 0
        self.where: list[str] = []
        self._lock = threading.Lock()

    def note(self, what: str) -> None:
        """Record one CPU wait on the device (``what`` names the call site)."""
        with self._lock:
            self.count += 1
            if len(self.where) < 100:
                self.where.append(what)

    def reset(self) -> None:
        with self._lock:
            self.count = 0
            self.where.clear()


SYNC_COUNTER = SyncCounter()


@contextlib.contextmanager
def count_device_syncs() -> Iterator[SyncCounter]:
    """Count, while active, torch's ``cuda.synchronize`` / ``Stream.synchronize`` /
    ``Event.synchronize`` calls plus this package's own device waits (all into
    ``SYNC_COUNTER``, reset on entry). Implicit syncs inside torch (``.item()``) are not seen.

    Example::

        with count_device_syncs() as c:
            run_one_execution()
        assert c.count == 0, c.where
    """
    import torch

    SYNC_COUNTER.reset()
    saved = (torch.cuda.synchronize, torch.cuda.Stream.synchronize,
             torch.cuda.Event.synchronize)

    def counted(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            SYNC_COUNTER.note(what)
            return fn(*a, **k)
        return wrapper

    torch.cuda.synchronize = counted(saved[0], "torch.cuda.synchronize")
    torch.cuda.Stream.synchronize = counted(saved[1], "Stream.synchronize")
    torch.cuda.Event.synchronize = counted(saved[2], "Event.synchronize")
    try:
        yield SYNC_COUNTER
    finally:
        (torch.cuda.synchronize, torch.cuda.Stream.synchronize,
         torch.cuda.Event.synchronize) = saved


def wait_event(query: Callable[[], bool], timeout: float | None,
               poll: Callable[[], None] | None = None, what: str = "device work") -> None:
    """Wait on the CPU until ``query()`` is true: sleeps that grow from 20 µs to 1 ms, ``poll()``
    between them (it raises to end the wait), a deadline. Counted in ``SYNC_COUNTER``.

    Raises:
        ChannelTimeoutError: not done within ``timeout`` s.
    """
    if query():
        return
    SYNC_COUNTER.note(what)
    deadline = None if timeout is None else time.monotonic() + timeout
    poll_until(query, deadline, poll, f"{what} not done within {timeout} s")


class ActorStreams:
    """The compute and comm streams of one actor on one CUDA device (see module doc).

    Args:
        device: CUDA device index (default: the current device).
        dedicated_compute: make a compute stream of its own (the executor then runs user
            methods inside ``compute_context()``); default: the device's default stream,
            which user code uses when nobody sets a stream.
        window: at most this many ``keep_until`` entries pending before it waits.
        comm_priority: priority of the comm stream (lower is higher; -1 lets transfers
            overtake queued compute kernels).
        eager_wait: communicators make the compute stream wait for a received value before
            returning it (see module doc).
    """

    is_cuda = True

    def __init__(self, device: int | None = None, *, dedicated_compute: bool = False,
                 window: int = 64, comm_priority: int = 0, eager_wait: bool = True) -> None:
        import torch

        self._torch = torch
        idx = torch.cuda.current_device() if device is None else int(device)
        self.device = torch.device("cuda", idx)
        self.compute = (torch.cuda.Stream(self.device) if dedicated_compute
                        else torch.cuda.default_stream(self.device))
        self.comm = torch.cuda.Stream(self.device, priority=comm_priority)
        self.window = max(1, int(window))
        self.eager_wait = eager_wait
        self._held: deque[tuple[Any, tuple[Any, ...]]] = deque()

    # -- contexts
    def compute_context(self) -> Any:
        """``with streams.compute_context():`` runs user work on the compute stream."""
        return self._torch.cuda.stream(self.compute)

    def comm_context(self) -> Any:
        """``with streams.comm_context():`` queues torch work (copies, divisions) on comm."""
        return self._torch.cuda.stream(self.comm)

    # -- events
    def new_event(self, interprocess: bool = False) -> Any:
        """A fresh CUDA event without timing (interprocess if asked)."""
        return self._torch.cuda.Event(enable_timing=False, interprocess=interprocess)

    def comm_after_compute(self) -> None:
        """The comm stream waits for all work queued so far on the compute stream."""
        ev = self._torch.cuda.Event(enable_timing=False)
        ev.record(self.compute)
        self.comm.wait_event(ev)

    def comm_done(self) -> Any:
        """An event recorded on the comm stream now (when everything queued there is done)."""
        ev = self._torch.cuda.Event(enable_timing=False)
        ev.record(self.comm)
        return ev

    def compute_after(self, event: Any) -> None:
        """The compute stream waits for ``event`` (no CPU block). None: nothing to wait for."""
        if event is not None:
            self.compute.wait_event(event)

    def received(self, event: Any) -> None:
        """Called by communicators after a receive: ``compute_after`` when ``eager_wait``."""
        if self.eager_wait and event is not None:
            self.compute.wait_event(event)

    # -- lifetimes
    def mark_comm_use(self, tensors: Any) -> None:
        """``record_stream(comm)`` on each tensor (memory from the compute stream's pool that
        the comm stream reads or writes)."""
        for t in tensors:
            t.record_stream(self.comm)

    def mark_compute_use(self, tensors: Any) -> None:
        """``record_stream(compute)`` on each tensor (memory from the comm stream's pool that
        the compute stream will use)."""
        for t in tensors:
            t.record_stream(self.compute)

    def keep_until(self, event: Any, *refs: Any, timeout: float | None = None,
                   poll: Callable[[], None] | None = None) -> None:
        """Hold ``refs`` until ``event`` completes; waits for the oldest entry when the
        window is full (see module doc).

        Raises:
            ChannelTimeoutError: the oldest entry did not complete within ``timeout``.
        """
        self._held.append((event, refs))
        self.trim()
        while len(self._held) > self.window:
            ev, _ = self._held[0]
            wait_event(ev.query, timeout, poll, "comm window full")
            self._held.popleft()

    def trim(self) -> None:
        """Drop the held entries whose events completed (non-blocking)."""
        held = self._held
        while held and held[0][0].query():
            held.popleft()

    def pending(self) -> int:
        """Entries still held."""
        self.trim()
        return len(self._held)

    def drain(self, timeout: float | None = 10.0,
              poll: Callable[[], None] | None = None) -> bool:
        """Wait (polling) until every held entry completed; False when ``timeout`` passed."""
        try:
            while self._held:
                wait_event(self._held[0][0].query, timeout, poll, "drain")
                self._held.popleft()
        except ChannelTimeoutError:
            return False
        return True


class NullStreams:
    """``ActorStreams`` for CPU stand-ins: every call is a no-op, nothing is held."""

    is_cuda = False
    device = None
    compute = comm = None
    eager_wait = True

    def compute_context(self) -> Any:
        return contextlib.nullcontext()

    comm_context = compute_context

    def new_event(self, interprocess: bool = False) -> None:
        return None

    def comm_after_compute(self) -> None:
        return None

    def comm_done(self) -> None:
        return None

    def compute_after(self, event: Any) -> None:
        return None

    def received(self, event: Any) -> None:
        return None

    def mark_comm_use(self, tensors: Any) -> None:
        return None

    mark_compute_use = mark_comm_use

    def keep_until(self, event: Any, *refs: Any, timeout: float | None = None,
                   poll: Callable[[], None] | None = None) -> None:
        return None

    def trim(self) -> None:
        return None

    def pending(self) -> int:
        return 0

    def drain(self, timeout: float | None = 10.0,
              poll: Callable[[], None] | None = None) -> bool:
        return True


def actor_streams(device: int | None = None, **kw: Any) -> ActorStreams | NullStreams:
    """``ActorStreams(device, **kw)`` when CUDA is available, else ``NullStreams()``.

    Example:
        >>> import torch
        >>> s = actor_streams()
        >>> isinstance(s, NullStreams) == (not torch.cuda.is_available())
        True
    """
    import torch

    if torch.cuda.is_available():
        return ActorStreams(device, **kw)
    return NullStreams()
