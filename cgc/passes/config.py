"""Pass ``config``: the plan's ExecConfig (capacity is set by the capacity pass).

Every unset field takes its value from the one defaults table,
``cgc.plan_schema.defaults.DEFAULTS`` (which the runtime's ``RunConfig`` reads too), and
``at_capacity`` comes from ``LowerOptions.at_capacity``.
"""

from __future__ import annotations

from cgc.passes.state import LowerState, require
from cgc.plan_schema.defaults import AT_CAPACITY, DEFAULTS
from cgc.plan_schema.errors import ConfigError

__all__ = ["fill_config", "pre", "post"]

_NAME = "config"


def fill_config(state: LowerState) -> None:
    """Fill every unset ExecConfig field with its default and set ``at_capacity``.

    Example: ``plan.config.get_timeout_s == DEFAULTS["get_timeout_s"]`` after ``lower``.

    Raises:
        ConfigError: ``LowerOptions.at_capacity`` is neither ``"wait"`` nor ``"raise"``.
    """
    cfg = state.plan.config
    for name, value in DEFAULTS.items():
        if not getattr(cfg, name):
            setattr(cfg, name, value)
    at_cap = state.options.at_capacity
    if at_cap not in AT_CAPACITY:
        raise ConfigError(f"at_capacity must be 'wait' or 'raise', not {at_cap!r}")
    cfg.at_capacity = AT_CAPACITY[at_cap]


def pre(state: LowerState) -> None:
    require(state.plan.config.capacity >= 1, _NAME, "capacity must be set first")


def post(state: LowerState) -> None:
    cfg = state.plan.config
    require(all(getattr(cfg, n) for n in DEFAULTS), _NAME, "a config field is unset")
