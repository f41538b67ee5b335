"""Ctrl-C (SIGINT) around work that must finish once begun: teardown, and a process's exit.

Python turns SIGINT into ``KeyboardInterrupt`` in the main thread, between any two
bytecodes - also in the middle of a teardown, which would then leave actors, channels or
shared memory behind, or in the middle of Ray's own shutdown, whose C++ core worker aborts
the process when interrupted (SIGABRT, SIGSEGV). Two tools:

- ``deferred_interrupts()``: a block that is not interrupted; a SIGINT that arrives inside it
  is raised as ``KeyboardInterrupt`` once it ends (each cleanup it guards is bounded by its
  own timeout, so the interrupt is late, never lost). With ``abandon_after_s``, in a process
  a command owns (``own_process()``), a block still running that many seconds after the
  SIGINT is abandoned instead: the process's child processes are killed and it exits with
  130 at once (``ray.init()``, which takes up to 20 s on a loaded machine and cannot be
  interrupted safely, starts its processes as children of this one).
- ``watch_interrupts()`` / ``interrupts_seen()`` / ``ignore_interrupts()``: for a command
  that owns its process (``cgc run``): every SIGINT raises and is counted (so one that a
  library swallowed still ends the command at its next check), and from the exit's cleanup
  on none interrupts anything.

Both change signal handlers only in the main thread (the only one Python delivers signals
to), and only where the handler in force is Python's (a program that set its own keeps it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = [
    "deferred_interrupts",
    "watch_interrupts",
    "interrupts_seen",
    "ignore_interrupts",
    "own_process",
]

# The exit code of a process ended by Ctrl-C (128 + SIGINT).
ABORTED = 130

# Whether a command owns this process (own_process()): only then may a block be abandoned.
_OWNED: list[bool] = [False]


def own_process() -> None:
    """Declare that a command owns this process (the ``cgc`` program, not a library
    caller): a ``deferred_interrupts(abandon_after_s=...)`` block may then end it.

    Example: ``own_process()`` at the top of the ``cgc`` program's ``main()``.
    """
    _OWNED[0] = True


def _ours_to_change() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deferred_interrupts(abandon_after_s: float | None = None) -> Iterator[None]:
    """Run the block without being interrupted by SIGINT; raise it afterwards.

    ``abandon_after_s``: in a process a command owns (``own_process()``), when the block
    has not ended that many seconds after the first SIGINT, kill this process's child
    processes, print "Aborted." and exit with 130 without finishing it (for a block that
    must not be interrupted but may take long: ``ray.init()``). Elsewhere it is ignored.

    Example::

        with deferred_interrupts():
            teardown_graph(graph)   # a Ctrl-C here waits until teardown is done

    Raises:
        KeyboardInterrupt: after the block, when SIGINT arrived during it (as Python's
            handler, or whatever handler was in force, would have done at once).
    """
    if not _ours_to_change():
        yield
        return
    old = signal.getsignal(signal.SIGINT)
    if not callable(old):  # SIG_IGN (nothing to defer) or SIG_DFL / None (not Python's)
        yield
        return
    held: list[Any] = []
    done = threading.Event()

    def hold(signum: int, frame: Any) -> None:
        held.append(frame)

    signal.signal(signal.SIGINT, hold)
    watching = abandon_after_s is not None and _OWNED[0]
    if watching:
        # Python runs `hold` only when the main thread is back in Python code, and
        # ray.init() blocks in C++ for seconds: the C-level handler's wake-up byte tells a
        # watcher thread at once.
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(target=_abandon_unless, args=(read_fd, done, abandon_after_s or 0.0),
                         name="cgc-abandon", daemon=True).start()
    try:
        yield
    finally:
        done.set()
        if watching:
            signal.set_wakeup_fd(old_wakeup)
            os.close(write_fd)  # no more wake-up bytes; the watcher closes read_fd
        signal.signal(signal.SIGINT, old)
        if held and sys.exc_info()[0] is None:  # an exception already on its way wins
            old(signal.SIGINT, held[-1])


def _abandon_unless(read_fd: int, done: threading.Event, wait_s: float) -> None:
    """Watch ``read_fd`` for a SIGINT's wake-up byte until ``done``; ``wait_s`` after the
    first, unless ``done`` is set: kill our children and exit 130 at once. Closes
    ``read_fd`` when ``done`` (not before: a later SIGINT's byte must find it open)."""
    import select

    try:
        deadline: float | None = None
        while not done.is_set():
            wait = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            ready, _, _ = select.select([read_fd], [], [], max(0.0, wait))
            if ready and signal.SIGINT in os.read(read_fd, 64) and deadline is None:
                deadline = time.monotonic() + wait_s
            if deadline is not None and time.monotonic() >= deadline and not done.is_set():
                _kill_descendants()
                with contextlib.suppress(OSError):
                    os.write(2, b"Aborted.\n")
                os._exit(ABORTED)
    finally:
        os.close(read_fd)


def _kill_descendants() -> None:
    """SIGKILL every process below this one. They are stopped first, until no new one
    appears, so none starts another or is orphaned meanwhile (an orphan of a killed parent
    is no longer found below us, and would print its own failure on our stderr)."""
    stopped: list[int] = []
    for _ in range(50):
        new = [pid for pid in _descendants(os.getpid()) if pid not in stopped]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        stopped.extend(new)
        time.sleep(0.01)
    for pid in stopped:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """The processes below ``root`` (children first), from /proc (empty where there is none)."""
    parent: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            parent[int(entry)] = int(fields[1])
    out: list[int] = []
    frontier = [root]
    while frontier:
        children = [pid for pid, ppid in parent.items() if ppid in frontier]
        out.extend(children)
        frontier = children
    return out


# SIGINTs since watch_interrupts(), also those some library code caught and dropped.
_SEEN: list[int] = []


def watch_interrupts() -> None:
    """For a command that owns its process: from now on the first SIGINT raises
    ``KeyboardInterrupt`` as Python's own handler does, and every one is counted, so that
    one some library caught and dropped (an ``except BaseException`` in an import, say)
    still ends the command at its next ``interrupts_seen()`` check. A later SIGINT that
    arrives while a ``KeyboardInterrupt`` is being handled (a second Ctrl-C pressed while
    the first one's cleanup runs: an ``except`` or ``finally`` block, a ``with`` block's
    exit) is absorbed: the first one already decided the exit, and raising again would
    break that cleanup half-way. One after a first that was swallowed raises again.

    Example: ``watch_interrupts()`` at the top of a command's ``main()``.
    """
    _SEEN.clear()
    if not _ours_to_change() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def count(signum: int, frame: Any) -> None:
        _SEEN.append(signum)
        if len(_SEEN) == 1 or not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, count)


def interrupts_seen() -> int:
    """SIGINTs since ``watch_interrupts()`` (0 without it).

    Example: ``if interrupts_seen(): raise KeyboardInterrupt``.
    """
    return len(_SEEN)


def ignore_interrupts() -> None:
    """Let no SIGINT interrupt anything from now on (a process's last steps: its cleanup
    and exit); each one is still counted by ``interrupts_seen()``.

    Example: ``ignore_interrupts(); ray.shutdown(); aborted = interrupts_seen() > 0``.
    """

    def note(signum: int, frame: Any) -> None:
        _SEEN.append(signum)

    if _ours_to_change():
        signal.signal(signal.SIGINT, note)
