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


def _runs(rates: dict[tuple[str, str], list[float]]) -> dict:
    return {k: [{"rate": r, "result": []} for r in v] for k, v in rates.items()}


def test_the_table_gives_each_system_s_range_and_answers_which_api_from_the_figures():
    args = bench_workloads.parser().parse_args(["--workloads", "decode,rl",
                                                "--systems", "cgc,dropin"])
    runs = _runs({("decode", "cgc"): [1575.0, 867.0, 994.0],
                  ("decode", "dropin"): [1500.0, 1600.0, 1580.0],
                  ("rl", "cgc"): [10.0, 11.0, 12.0], ("rl", "dropin"): [20.0, 22.0, 21.0]})
    for k in (("decode", "cgc"), ("decode", "dropin")):
        for x in runs[k]:
            x.update(p50_ms=1.0, p99_ms=2.0)
    text = bench_workloads.table(runs, ["decode", "rl"], ["cgc", "dropin"], args)
    assert "| decode | cgc | 994.0 tokens/s | 867.0 – 1,575.0 |" in text
    assert "decode: no measured difference" in text           # the ranges overlap
    assert "rl: the drop-in is faster, 1.91×" in text         # they do not
    assert "which API: it depends on the workload" not in text
    assert "which API: the drop-in measured faster here" in text
    # the same figures the other way round give the other answer: nothing is fixed
    flipped = _runs({("rl", "cgc"): [20.0, 22.0, 21.0], ("rl", "dropin"): [10.0, 11.0, 12.0]})
    assert "which API: cgc's own API" in "\n".join(bench_workloads.which_api(flipped, ["rl"]))


def test_progress_says_elapsed_and_time_left():
    assert bench_workloads.progress(1, 4, 90.0) == "elapsed 1 min 30 s, about 4 min 30 s left"
    assert bench_workloads.progress(4, 4, 400.0) == "elapsed 6 min 40 s, done"
