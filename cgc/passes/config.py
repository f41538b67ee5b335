"""Pass ``config``: ExecConfig defaults (capacity is set by the capacity pass).

Defaults: submit 10 s (a submission waits only for room), get 60 s (LLM steps can be
long), teardown 10 s, setup 60 s (actor creation + communicators), spin 50 µs before
sleeping on a channel, 1 MiB initial slots, at most 1000 results buffered by the driver.
"""

from __future__ import annotations

from cgc.passes.channels import DEFAULT_SLOT_BYTES
from cgc.passes.state import LowerState, require

__all__ = ["fill_config", "pre", "post", "DEFAULTS"]

_NAME = "config"
DEFAULTS = {
    "submit_timeout_s": 10.0,
    "get_timeout_s": 60.0,
    "teardown_timeout_s": 10.0,
    "setup_timeout_s": 60.0,
    "spin_us": 50,
    "default_slot_bytes": DEFAULT_SLOT_BYTES,
    "max_buffered_results": 1000,
}


def fill_config(state: LowerState) -> None:
    """Fill every unset ExecConfig field with its default.

    Example: ``plan.config.get_timeout_s == 60.0`` after ``lower``.
    """
    cfg = state.plan.config
    for name, value in DEFAULTS.items():
        if not getattr(cfg, name):
            setattr(cfg, name, value)


def pre(state: LowerState) -> None:
    require(state.plan.config.capacity >= 1, _NAME, "capacity must be set first")


def post(state: LowerState) -> None:
    cfg = state.plan.config
    require(all(getattr(cfg, n) for n in DEFAULTS), _NAME, "a config field is unset")
