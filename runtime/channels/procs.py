"""Who a process is, in a form that survives PID reuse: (pid, start time, PID namespace).

A PID alone can be reused by an unrelated process after its owner died; the start time
from ``/proc/<pid>/stat`` (clock ticks since boot) tells the two apart. The PID namespace
(inode of ``/proc/self/ns/pid``) says whether a recorded PID means anything here at all: a
process in another container that shares /dev/shm has PIDs we cannot look up, so such a
peer is never judged dead (``is_alive`` answers True: "cannot tell").

Example:
    >>> import os
    >>> from cgc.runtime.channels.procs import identity, is_alive
    >>> me = identity()
    >>> me[0] == os.getpid() and is_alive(*me)
    True
    >>> is_alive(me[0], me[1] + 1, me[2])   # same PID, other start time: another process
    False
"""

from __future__ import annotations

import os

__all__ = ["identity", "is_alive", "start_time"]

_ident: tuple[int, int, int] | None = None  # (pid, start, ns) of this process, per PID


def _pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None when there is no such live
    process (gone, or a zombie waiting to be reaped).

    Raises:
        PermissionError: /proc hides other users' processes here.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Why after the last ')': the command name in parentheses may itself hold spaces or ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])  # field 22 of the line; fields[0] is field 3 (state)


def identity() -> tuple[int, int, int]:
    """``(pid, start time, PID namespace inode)`` of this process."""
    global _ident
    pid = os.getpid()
    if _ident is None or _ident[0] != pid:  # recomputed in a forked child
        _ident = (pid, start_time(pid) or 0, _pidns())
    return _ident


def is_alive(pid: int, start: int, ns: int) -> bool:
    """False only when process ``(pid, start, ns)`` is certainly gone.

    True when it runs, when ``pid`` is 0 (not recorded yet), when it lives in another PID
    namespace, or when /proc does not let us look (we never call a live peer dead).
    """
    if pid <= 0 or ns != identity()[2]:
        return True
    try:
        now = start_time(pid)
    except PermissionError:
        return True
    return now is not None and (start == 0 or now == start)
