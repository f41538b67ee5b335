"""Golden dumps of lowered plans.

A dump that differs from its file fails, and so does a missing file. To (re)write the
files after an intended change, run ``CGC_UPDATE_GOLDEN=1 python -m pytest tests/golden``
and read the diff before committing it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "passes"))

import shapes  # noqa: E402

from cgc.passes import lower  # noqa: E402
from cgc.plan_schema import plan_pb2 as pb  # noqa: E402
from cgc.plan_schema.text import format_plan_text, parse_program  # noqa: E402

UPDATE = os.environ.get("CGC_UPDATE_GOLDEN") == "1"


def check_golden(path: Path, text: str) -> None:
    """Compare ``text`` with the golden file (or rewrite it when CGC_UPDATE_GOLDEN=1)."""
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    if not path.exists():
        pytest.fail(f"golden file {path} is missing; create it with CGC_UPDATE_GOLDEN=1")
    assert text == path.read_text(encoding="utf-8"), f"dump changed; see {path}"


@pytest.mark.parametrize("name", sorted(shapes.ALL))
def test_golden_dump(name):
    plan = lower(shapes.ALL[name]())
    text = format_plan_text(plan)
    check_golden(HERE / f"{name}.txt", text)
    # every program line in the dump parses back to the plan's program (its ops: the wake
    # depths print on a line of their own)
    lines = [ln.strip() for ln in text.splitlines()]
    start = lines.index("programs:") + 1
    progs = lines[start : start + len(plan.lowered.programs)]
    for prog, line in zip(plan.lowered.programs, progs, strict=True):
        ops = pb.Program()
        ops.CopyFrom(prog)
        ops.ClearField("wake_depth")
        assert parse_program(line) == ops


def test_every_golden_file_has_a_shape():
    files = {p.stem for p in HERE.glob("*.txt")}
    assert files == set(shapes.ALL), "a golden file without a shape (or the reverse)"
