"""Pass ``verify``: the verifier runs on every compile and its verdict is recorded."""

from __future__ import annotations

import pytest
import shapes
from stages import run_pass, state_before

from cgc.passes import LowerOptions
from cgc.plan_schema.verify import PlanStructureError


def test_records_the_executions_stepped():
    state = run_pass(state_before(shapes.one_f_one_b(), "verify"), "verify")
    assert state.lowered.schedule.verified_executions == 2


def test_asked_for_executions_are_stepped():
    opts = LowerOptions(verify_executions=9)
    state = run_pass(state_before(shapes.chain(), "verify", opts), "verify")
    assert state.lowered.schedule.verified_executions == 9


def test_a_broken_plan_fails_the_compile():
    state = state_before(shapes.chain(), "verify")
    state.lowered.programs[1].ops.pop()  # an earlier pass "forgot" b's WRITE
    with pytest.raises(PlanStructureError, match="actor b.*missing"):
        run_pass(state, "verify")
