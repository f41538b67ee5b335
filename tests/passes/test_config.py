"""Pass ``config``: the ExecConfig from the one defaults table and the at_capacity option."""

from __future__ import annotations

import pytest
import shapes
from stages import run_pass, state_before

from cgc.passes import LowerOptions
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import DEFAULTS, RunConfig
from cgc.plan_schema.errors import ConfigError


def _config(options: LowerOptions | None = None) -> pb.ExecConfig:
    return run_pass(state_before(shapes.chain(), "config", options), "config").plan.config


def test_every_default_comes_from_the_shared_table():
    cfg = _config()
    assert {name: getattr(cfg, name) for name in DEFAULTS} == DEFAULTS
    assert cfg.at_capacity == pb.AT_CAPACITY_WAIT


def test_the_runtime_reads_back_what_the_compiler_wrote():
    run = RunConfig.from_plan(_config(LowerOptions(at_capacity="raise")))
    assert run.at_capacity == "raise" and run.capacity == 4
    assert run.get_timeout == DEFAULTS["get_timeout_s"]
    assert run.slot_bytes == DEFAULTS["default_slot_bytes"]


def test_unknown_at_capacity_is_refused():
    with pytest.raises(ConfigError, match="'wait' or 'raise'"):
        _config(LowerOptions(at_capacity="block"))
