"""The one rule for ring slot sizes (``ring_slot_bytes``) and how ``RunConfig`` resolves the
run's default slot size with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import (
    DEFAULTS,
    LIMITS,
    MIN_SLOT_BYTES,
    RunConfig,
    ring_slot_bytes,
)
from cgc.plan_schema.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MIB = int(DEFAULTS["default_slot_bytes"])


def test_the_first_size_that_is_not_zero_counts():
    assert ring_slot_bytes(4096, 8192) == 4096  # the channel's own
    assert ring_slot_bytes(0, 8192) == 8192  # the run's default
    assert ring_slot_bytes(0, 0) == ring_slot_bytes() == MIB  # the table's


def test_no_slot_is_smaller_than_the_floor():
    assert ring_slot_bytes(1) == ring_slot_bytes(0, 64) == MIN_SLOT_BYTES == 256
    assert ring_slot_bytes(MIN_SLOT_BYTES + 1) == MIN_SLOT_BYTES + 1


def test_a_negative_size_is_refused():
    with pytest.raises(ValueError, match="negative"):
        ring_slot_bytes(0, -1)


def test_the_run_default_is_the_override_else_the_plan_else_the_table():
    plan = pb.ExecConfig(capacity=2, default_slot_bytes=8192)
    assert RunConfig.from_plan(plan).slot_bytes == 8192
    assert RunConfig.from_plan(plan, slot_bytes=4096).slot_bytes == 4096
    assert RunConfig.from_plan(plan, slot_bytes=0).slot_bytes == 8192  # 0: the plan's
    assert RunConfig.from_plan(pb.ExecConfig(capacity=2)).slot_bytes == MIB
    assert RunConfig.from_plan(plan, slot_bytes=10).slot_bytes == MIN_SLOT_BYTES


@pytest.mark.parametrize("bad", [-1, LIMITS.slot_bytes + 1])
def test_an_override_out_of_range_is_a_config_error_naming_it(bad):
    with pytest.raises(ConfigError, match="slot_bytes must be within 0..1,073,741,824"):
        RunConfig.from_plan(pb.ExecConfig(capacity=2), slot_bytes=bad)


def test_no_other_module_applies_the_slot_default_itself():
    # One place for the rule: a second `slot_bytes or DEFAULTS[...]` or `max(.., 256)`
    # elsewhere is how the copies came to disagree.
    pattern = re.compile(r'DEFAULTS\["default_slot_bytes"\]|max\(.*slot_bytes.*,\s*256\)')
    home = ROOT / "plan_schema" / "defaults.py"
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("cgc", "runtime", "plan_schema")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != home
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found
