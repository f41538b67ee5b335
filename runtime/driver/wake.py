"""Wake-ahead settings: the window of bells to ring (the depths are the plan's).

Each actor's depth (hops from the driver along host channels) is decided by the compiler
and stored in ``Program.wake_depth`` (pass ``cgc.passes.wake``). The driver rings depths
``2..1+K`` at submit and an actor at depth ``d`` rings ``d+K`` when it starts its work
(``cgc.runtime.channels.bell``). ``K`` is run configuration: it defaults to half the cores
of the driver's node, so those readers spin while the data moves and the rest of the cores
stay free for the actors doing the work; below 4 cores wake-ahead is off (a spinner there
steals the core its upstream needs).

Example: ``wake_window(-1, cores=16)`` → ``8``.
"""

from __future__ import annotations

import os

__all__ = ["wake_window"]


def wake_window(setting: int, cores: int | None = None) -> int:
    """The window ``K``: ``setting`` when >= 0, else (auto) half the cores from 4 cores up."""
    if setting >= 0:
        return setting
    cores = cores or os.cpu_count() or 1
    return cores // 2 if cores >= 4 else 0
