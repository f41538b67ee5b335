"""Golden dumps of lowered plans: run with CGC_UPDATE_GOLDEN=1 to rewrite them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "passes"))

import shapes  # noqa: E402

from cgc.passes import lower  # noqa: E402
from cgc.plan_schema.text import format_plan_text, parse_program  # noqa: E402


@pytest.mark.parametrize("name", sorted(shapes.ALL))
def test_golden_dump(name):
    plan = lower(shapes.ALL[name]())
    text = format_plan_text(plan)
    path = HERE / f"{name}.txt"
    if os.environ.get("CGC_UPDATE_GOLDEN") or not path.exists():
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"dump of {name} changed; see {path}"
    # every program line in the dump parses back to the plan's program
    lines = [ln.strip() for ln in text.splitlines()]
    start = lines.index("programs:") + 1
    for prog, line in zip(plan.lowered.programs, lines[start:], strict=False):
        assert parse_program(line) == prog
