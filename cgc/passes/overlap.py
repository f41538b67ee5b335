"""Pass ``overlap`` (placeholder until the hoisting lands): records overlap off."""

from __future__ import annotations

from cgc.passes.state import LowerState

__all__ = ["overlap", "pre", "post"]


def overlap(state: LowerState) -> None:
    state.lowered.schedule.overlap = False


def pre(state: LowerState) -> None:
    pass


def post(state: LowerState) -> None:
    pass
