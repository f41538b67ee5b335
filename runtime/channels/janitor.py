"""The janitor: a small process per driver that removes a dead driver's segments at once.

Why: a driver killed with SIGKILL runs no teardown and no atexit; Ray then kills the actors
the plan created, also without their atexit, and every ring and data block of the graph
would stay in /dev/shm until some later ``start()`` sweeps dead creators' segments. The
janitor makes "nothing left" hold within about a second of the last actor's death, with no
later start and no monitor.

How: the first ``watch()`` in a driver process starts ``python -S <this file> DIR`` in its
own session, with a pipe to its stdin. The driver writes one line per graph, ``graph
PREFIX PID...`` (the PIDs of the graph's actors on this node), and ``done PREFIX`` after a
teardown. The janitor only reads; end of file on the pipe means the driver is gone, however
it ended (the kernel closes the pipe for a killed process too). Then, for every graph not
marked done, it unlinks every segment under the graph's prefix, again every 0.2 s while an
actor of those graphs still runs (a dying actor may still create a data block), at most
``WAIT_S``, and exits. Unlinking is safe at that point: the graph ended with its driver,
and processes that still map a segment keep their mapping (only the name goes).

A child the driver forks (multiprocessing's "fork") closes its copy of the pipe at once
(``os.register_at_fork``), so the janitor acts when the driver ends even while such a
child lives on; the child starts a janitor of its own for graphs it starts. The script
imports only the standard library and ``procs`` (its folder is its first ``sys.path``
entry).

Cost: one process per driver (started in the background, ~15 ms of CPU with ``-S``: it
imports only ``os``, ``sys``, ``time`` and ``procs``), one pipe, one line per start and
teardown; it sleeps in ``read`` for the driver's whole life. A driver that exits normally
has torn its graphs down (atexit): the janitor finds nothing and exits.

Example (driver side; ``start()`` does this)::

    from cgc.runtime.channels import janitor
    janitor.watch("cgc-0123abcd", [4242, 4243])   # starts the janitor on first use
    janitor.forget("cgc-0123abcd")                 # after teardown removed everything
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable

__all__ = ["watch", "forget", "janitor_pid", "WAIT_S"]

WAIT_S = 60.0  # longest wait for a dead driver's actors to die before the last pass
_POLL_S = 0.2

_proc: _Janitor | None = None
_owner = 0  # the PID that started _proc (a forked child starts its own)
_watched: dict[str, str] = {}  # prefix -> its "graph" line, re-sent to a restarted janitor
_lock = threading.Lock()


class _Janitor:
    """The running janitor: its PID and the write end of its stdin pipe (a raw fd).

    Why not ``subprocess.Popen``: the janitor is meant to outlive this interpreter's
    teardown (it acts on the end of file the kernel gives it once this process is gone),
    and a ``Popen`` still running at exit warns "subprocess ... is still running" (and its
    pipe "unclosed file") - a false alarm in every test run and every user's ``-X dev``.
    """

    def __init__(self, seg_dir: str) -> None:
        r, w = os.pipe()  # both non-inheritable (PEP 446): only the dup2 below reaches it
        try:
            null = os.devnull
            self.pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-S", "-E", os.path.abspath(__file__), seg_dir],
                os.environ,
                file_actions=[(os.POSIX_SPAWN_DUP2, r, 0),
                              (os.POSIX_SPAWN_OPEN, 1, null, os.O_WRONLY, 0),
                              (os.POSIX_SPAWN_OPEN, 2, null, os.O_WRONLY, 0)],
                setsid=True)  # its own session: a ^C in the driver's terminal spares it
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self.fd = w

    def alive(self) -> bool:
        """False once the janitor exited (it is then reaped here)."""
        try:
            pid, _status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): gone
            return False
        return pid == 0

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the janitor's stdin (OSError: it is gone)."""
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def drop(self) -> None:
        """Close our end of a dead janitor's pipe."""
        try:
            os.close(self.fd)
        except OSError:
            pass


# ------------------------------------------------------------------ driver side
def _forget_parent() -> None:
    """In a child forked from a driver: close its copy of the parent's janitor pipe (else
    the janitor would wait for the child to end as well) and forget the parent's graphs;
    the child starts its own janitor for its own graphs."""
    global _proc, _owner
    if _proc is not None:
        _proc.drop()
    _proc, _owner = None, 0
    _watched.clear()


def _after_fork_in_child() -> None:
    """``os.register_at_fork`` hook: ``_forget_parent``, and a fresh lock (another thread
    of the parent may have held it at the fork)."""
    global _lock
    _forget_parent()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _forked() -> None:
    """``_forget_parent`` if this process is not the janitor's owner: a fork that bypassed
    the hook above (a raw ``fork()`` in C). Called with ``_lock`` held."""
    if _owner and _owner != os.getpid():
        _forget_parent()


def _send(line: str) -> None:
    """Start the janitor if needed and send it ``line``; never raises (the sweep at every
    start stays the fallback). Called with ``_lock`` held."""
    global _proc, _owner
    try:
        if _proc is None or _owner != os.getpid() or not _proc.alive():
            from cgc.runtime.channels.shm import segment_dir

            if _proc is not None:  # ours (_forked ran first): a dead janitor's pipe
                _proc.drop()
            _proc = _Janitor(segment_dir())
            _owner = os.getpid()
            # A janitor that died (killed by hand?) is replaced; the new one learns every
            # graph still running (a line twice is harmless: the janitor keeps the last).
            line = "\n".join([*_watched.values(), line])
        _proc.send((line + "\n").encode())
    except (OSError, ValueError):
        pass  # no janitor here: the sweep at every start still removes what it leaves


def watch(prefix: str, pids: Iterable[int]) -> None:
    """Have the janitor remove graph ``prefix``'s segments should this process die before
    ``forget(prefix)``; ``pids``: the graph's actor processes on this node (waited for).

    Example: ``watch(graph.prefix, [4242])``.
    """
    line = " ".join(["graph", prefix, *(str(int(p)) for p in pids)])
    with _lock:
        _forked()
        _watched[prefix] = line
        _send(line)


def forget(prefix: str) -> None:
    """Graph ``prefix`` was torn down (its segments are gone): nothing to do for it."""
    with _lock:
        _forked()
        if _watched.pop(prefix, None) is not None:
            _send(f"done {prefix}")


def janitor_pid() -> int | None:
    """PID of this process's janitor (None before the first ``watch``), for leak checks."""
    p = _proc
    return p.pid if p is not None and _owner == os.getpid() else None


# ------------------------------------------------------------------ the janitor process
def _unlink_under(dfd: int, prefixes: tuple[str, ...]) -> int:
    """Unlink every entry of the open directory ``dfd`` starting with one of ``prefixes``."""
    left = 0
    for name in os.listdir(dfd):
        if name.startswith(prefixes):
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                pass
            except OSError:
                left += 1
    return left


def _main(seg_dir: str) -> int:
    from procs import start_time  # type: ignore[import-not-found]  # run as a script

    # Why: posix_spawn passes on every inheritable descriptor of the driver (a C library's
    # socket or pipe end); holding one for the driver's whole life could keep someone
    # else's end-of-file from coming. Only stdin (the driver's pipe) and stdout/stderr stay.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    graphs: dict[str, list[tuple[int, int | None]]] = {}
    for raw in sys.stdin.buffer:  # ends when the driver is gone, however it ended
        parts = raw.decode("ascii", "replace").split()
        if len(parts) >= 2 and parts[0] == "graph":
            graphs[parts[1]] = [(int(p), start_time(int(p))) for p in parts[2:] if p.isdigit()]
        elif len(parts) == 2 and parts[0] == "done":
            graphs.pop(parts[1], None)
    if not graphs:
        return 0
    # Why O_NOFOLLOW and the owner check: the driver chose and checked the directory (see
    # shm.segment_dir); never follow a swapped link, never touch another user's folder.
    try:
        dfd = os.open(seg_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return 0
    if os.fstat(dfd).st_uid != os.geteuid():
        os.close(dfd)
        return 0
    prefixes = tuple(p + "-" for p in graphs)
    actors = [(pid, st) for ids in graphs.values() for pid, st in ids if st is not None]
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            running = [a for a in actors if start_time(a[0]) == a[1]]
            _unlink_under(dfd, prefixes)
            if not running or time.monotonic() > deadline:
                break
            actors = running
            time.sleep(_POLL_S)
        _unlink_under(dfd, prefixes)  # what a last write made while we looked
    finally:
        os.close(dfd)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
