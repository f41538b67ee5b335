"""CPU time of processes, from /proc, for the tests that check an idle graph burns none.

Why windows and not one long sleep: what is measured is CPU time (utime + stime of every
thread, in clock ticks), and a bound in CPU seconds per window. A loop thread that spins
instead of sleeping fails every window; a one-off burst that is not the graph's (Ray's
own periodic work in the actor process, a garbage collection) fails at most the window it
falls in. So the check passes at the first quiet window (about a second when all is well)
and gives up after ``tries`` windows: bounded, and not at the mercy of one burst.

Example::

    windows = quiet_window(pids)
    assert is_quiet(windows[-1]), windows
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["BUDGET_S", "cpu_seconds", "is_quiet", "quiet_window"]

# 50 ms of CPU per process in a 1 s window: an idle actor here uses 0-20 ms (ticks are
# 10 ms), one that spins hundreds (a busy actor: 460 ms of a 0.5 s window, 2 shared cores).
BUDGET_S = 0.05
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (all its threads).

    Raises:
        FileNotFoundError: no such process (or no /proc).
    """
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime


def is_quiet(used: list[float], budget: float = BUDGET_S) -> bool:
    """Whether every process used at most ``budget`` CPU seconds in the window."""
    return max(used) <= budget


def quiet_window(pids: list[int], *, window: float = 1.0, tries: int = 3,
                 budget: float = BUDGET_S) -> list[list[float]]:
    """CPU seconds each of ``pids`` used, per window of ``window`` s, until a quiet one.

    Stops at the first window in which every process stayed within ``budget``, or after
    ``tries`` windows; returns every window measured (the last one is quiet if any was).
    """
    windows: list[list[float]] = []
    for _ in range(tries):
        before = [cpu_seconds(p) for p in pids]
        time.sleep(window)
        windows.append([round(cpu_seconds(p) - b, 3) for p, b in zip(pids, before, strict=True)])
        if is_quiet(windows[-1], budget):
            break
    return windows
