"""tools/bench/bench_multi_gpu.py without GPUs: its arguments, its table (targets, ratios,
wrong results never timed), and every part end to end on CPU tensors for both systems, so
a device call on a 2- or 4-GPU machine is not spent finding the harness's bugs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "bench" / "bench_multi_gpu.py"
sys.path.insert(0, str(TOOL.parent))
import bench_multi_gpu as b2  # noqa: E402


def test_sizes_parts_and_systems_are_parsed_and_checked():
    a = b2.parse_args(["--sizes", "1K,1M,64MiB,1G", "--parts", "hop,raw"])
    assert a.size_list == [1 << 10, 1 << 20, 64 << 20, 1 << 30]
    assert a.part_list == ["hop", "raw"] and a.system_list == ["cgc", "ray_cgraph"]
    assert b2.parse_args([]).part_list == list(b2.PARTS) and not b2.parse_args([]).parts_given
    for bad in (["--parts", "hop,warp"], ["--systems", "vllm"], ["--sizes", "4"],
                ["--sizes", "1X"], ["--inflight", "0"]):
        with pytest.raises(SystemExit):
            b2.parse_args(bad)


def test_the_table_checks_targets_and_never_times_a_wrong_result():
    a = b2.parse_args(["--sizes", "1M,1G"])
    f = b2.Figures()
    f.values.update({
        ("hop", "1 MiB p50", "cgc"): 80.0, ("hop", "1 MiB p50", "ray_cgraph"): 640.0,
        ("raw", "1 MiB µs/transfer", "raw"): 38.0,
        ("hop", "1 GiB p50", "cgc"): 3000.0, ("hop", "1 GiB GB/s", "cgc"): 358.0,
        ("hop", "1 GiB GB/s", "ray_cgraph"): 316.0, ("raw", "1 GiB GB/s", "raw"): 370.0,
        ("hop", "set-up s", "cgc"): 3.0, ("hop", "set-up s", "ray_cgraph"): 5.6,
        ("overlap", "overlap on ms", "cgc"): 7.5, ("overlap", "overlap on ms", "ray_cgraph"): 9.3,
        ("pipeline", "overlap on exec/s", "cgc"): 9.0,
    })
    f.wrong[("pipeline", "overlap on exec/s", "cgc")] = "execution 3: 1.0, not 5.0625"
    rows = {" | ".join(r.split(" | ")[:2]).lstrip("| "): r for r in b2.table(f, a).splitlines()[2:]}
    assert rows["hop | 1 MiB p50"].endswith("| 80.0 | 640.0 | 38.0 | 8.00× | ≤ 100 µs | yes |")
    assert rows["hop | 1 GiB GB/s"].endswith("| 358.0 | 316.0 | 370.0 | 1.13× | ≥ 95% of raw | yes |")
    assert rows["hop | set-up s"].endswith("| 1.87× | ≤ 0.5× Ray CG | no |")
    assert rows["overlap | overlap on ms"].endswith("| 1.24× | ≤ 7.8 ms | yes |")
    assert rows["overlap | overlap off ms"].endswith("| - | - | - | - |  | - |")
    # a wrong result shows as such: no figure, no ratio, the target not met or missed
    assert rows["pipeline | overlap on exec/s"].startswith("| pipeline | overlap on exec/s | WRONG |")
    assert "| - |" in rows["pipeline | overlap on exec/s"]


def test_parts_that_need_more_gpus_fail_when_asked_for(monkeypatch):
    monkeypatch.setattr(b2, "CPU_GPUS", 2)  # a two-GPU machine
    f = b2.run(b2.parse_args(["--device", "cpu", "--parts", "grid,overlap3"]))
    assert f.failed == {("grid", "-"): "needs 4 GPUs, this machine has 2",
                        ("overlap3", "-"): "needs 4 GPUs, this machine has 2"}
    assert f.values == {}


def test_two_gpus_are_required_on_cuda():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs")
    with pytest.raises(RuntimeError, match="needs 2 GPUs"):
        b2.run(b2.parse_args(["--parts", "hop"]))


# One part per code path: overlap and overlap3 are both `_overlapped` (1 or 3 senders),
# pipeline and pipeline4 both `_staged` (2 or 4 stages); the run takes the wider one of
# each, so every function of the harness runs, in half the graph start-ups of all parts.
# The narrower parts' rows and arguments are checked by the table and argument tests above.
PATH_PARTS = "hop,raw,overlap3,pipeline4,grid"


@pytest.mark.slow
def test_every_code_path_runs_on_cpu_for_both_systems_with_checked_results(tmp_path):
    out = tmp_path / "multi_gpu.json"
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--device", "cpu", "--parts", PATH_PARTS,
         "--sizes", "1K,64K", "--iters", "10",
         "--executions", "3", "--pipeline-executions", "12", "--overlap-n", "32",
         "--stage-n", "32", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["failed"] == {} and got["wrong"] == {}, got
    assert got["skipped"] == {"grid | ray_cgraph": "Ray CG needs NCCL for this graph (GPUs)"}
    assert got["values"]["grid | in flight exec/s | cgc"] > 0
    for system in ("cgc", "ray_cgraph"):
        for case in ("hop | 1 KiB p50", "hop | 64 KiB p50", "hop | set-up s",
                     "overlap3 | overlap on ms", "overlap3 | overlap off ms",
                     "pipeline4 | overlap on exec/s", "pipeline4 | overlap off exec/s"):
            assert got["values"][f"{case} | {system}"] > 0, (case, system)
    assert got["values"]["raw | 64 KiB GB/s | raw"] > 0
    assert "| hop | 1 KiB p50 |" in proc.stdout


def test_the_docstring_examples_hold():
    import doctest

    assert doctest.testmod(b2, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0
