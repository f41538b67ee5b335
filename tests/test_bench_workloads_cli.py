"""tools/bench/bench_workloads.py's defaults (issue 37): enough rounds for a stable median."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "bench"))
import bench_workloads  # noqa: E402


def test_default_is_three_rounds_and_the_docstring_says_why():
    assert bench_workloads.parser().parse_args([]).rounds == 3
    assert bench_workloads.parser().parse_args(["--rounds", "1"]).rounds == 1
    doc = " ".join((bench_workloads.__doc__ or "").split())
    assert "The default is 3 rounds" in doc and "alternate the systems' order" in doc
