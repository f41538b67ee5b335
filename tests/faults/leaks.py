"""What "nothing is left" means in the fault suite: helpers shared by its fixtures, tests and
subprocess scripts."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from cgc.runtime.channels.procs import start_time


def cgc_threads() -> set[str]:
    """Names of this process's cgc threads."""
    return {t.name for t in threading.enumerate() if t.name.startswith("cgc-")}


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        return start_time(pid) is not None
    except OSError:  # /proc hides it
        return False


def children() -> set[int]:
    """Live child processes of this process."""
    me, out = str(os.getpid()), set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] not in "ZX":
            out.add(int(d))
    return out


def wait_until(cond: Callable[[], bool], deadline_s: float = 20.0, step: float = 0.05) -> bool:
    """Poll ``cond`` until it holds or the (generous) deadline passes; return the outcome."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()
