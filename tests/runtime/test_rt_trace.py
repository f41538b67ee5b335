"""Recorded timelines: ``start(trace=PATH)`` writes Chrome trace-event JSON for Perfetto."""

from __future__ import annotations

import json

import rt_graphs as G


def _load(path) -> list[dict]:
    data = json.loads(path.read_text())
    assert set(data) >= {"traceEvents", "displayTimeUnit"}
    return data["traceEvents"]


def test_a_traced_run_has_slices_from_every_actor_and_flows(ray_cluster, tmp_path):
    path = tmp_path / "run.json"
    plan = G.multi_plan()
    with plan.start(trace=path, get_timeout=30) as g:
        for i in range(3):
            assert [r.get() for r in g.execute(i)] == [i, 2 * i + 100]
    events = _load(path)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert any(n.startswith("worker0 (Worker") for n in names)
    assert any(n.startswith("worker1 (Worker") for n in names) and "driver" in names
    slices = [e for e in events if e["ph"] == "X"]
    for e in slices:  # what Perfetto's JSON importer needs of a complete event
        assert isinstance(e["ts"], float) and e["dur"] > 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["name"]
    by_proc = {}
    for e in slices:
        by_proc.setdefault(e["pid"], set()).add(e["args"]["execution"])
    assert len(by_proc) == 3  # both actors and the driver
    assert all(ex >= {0, 1, 2} for ex in by_proc.values())
    kinds = {e["cat"] for e in slices}
    assert {"READ", "COMPUTE", "WRITE", "driver"} <= kinds
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    for fid, s in starts.items():  # every arrow goes from a write to a later read
        assert ends[fid]["ts"] >= s["ts"] - 1e3 and ends[fid]["name"] == s["name"]


def test_untraced_runs_write_nothing_and_record_nothing(ray_cluster, tmp_path):
    with G.echo_plan().start(get_timeout=30) as g:
        assert g.execute(1).get() == 1
        assert g.trace_events is None
    assert list(tmp_path.iterdir()) == []


def test_torch_profile_writes_one_trace_per_actor(ray_cluster, tmp_path):
    out = tmp_path / "prof"
    with G.multi_plan().start(torch_profile=out, get_timeout=60) as g:
        for i in range(2):
            assert [r.get() for r in g.execute(i)] == [i, 2 * i + 100]
    files = sorted(p.name for p in out.iterdir())
    assert [f.split("-")[:2] for f in files] == [["t_multi", "worker0"], ["t_multi", "worker1"]]
    for f in out.iterdir():
        assert "traceEvents" in json.loads(f.read_text())


def test_profilers_that_cannot_be_combined_are_refused(ray_cluster, tmp_path):
    import pytest

    from cgc.plan_schema.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot be combined"):
        G.echo_plan().start(torch_profile=tmp_path, nvtx=True)


def test_cgc_run_trace_of_a_gpu_example_shows_sends_receives_and_their_arrows(
        ray_address, tmp_path):
    """`cgc run --trace` of an NCCL-scheduled example (on the CPU communicator here): SEND
    and RECV slices on the actors' tracks, each RECV joined to its SEND by an arrow."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    plan, trace = tmp_path / "p.cgplan", tmp_path / "run.json"
    cli = [sys.executable, "-m", "cgc.cli.main"]
    done = subprocess.run([*cli, "compile", str(root / "examples" / "pipeline_nccl.py"),
                           "-o", str(plan)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ran = subprocess.run([*cli, "run", str(plan), "--iters", "3", "--warmup", "0",
                          "--address", ray_address, "--communicator", "cpu",
                          "--trace", str(trace)], capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr[-3000:]
    events = _load(trace)
    kinds = {e["cat"] for e in events if e["ph"] == "X"}
    assert {"SEND", "RECV", "COMPUTE"} <= kinds
    send_pids = {e["pid"] for e in events if e["ph"] == "X" and e["cat"] == "SEND"}
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    from_sends = [fid for fid, s in starts.items()
                  if s["pid"] in send_pids and s["pid"] != ends[fid]["pid"]]
    assert from_sends, "no arrow joins a SEND to its RECV"
    for fid in from_sends:
        assert ends[fid]["ts"] >= starts[fid]["ts"] - 1e3


def test_nvtx_without_the_package_is_a_clear_error(ray_cluster):
    import importlib.util

    import pytest

    from cgc.plan_schema.errors import ConfigError

    if importlib.util.find_spec("nvtx") is not None:
        pytest.skip("nvtx is installed here (tests/gpu/test_gpu_nvtx.py runs it)")
    # Refused in the driver before any actor starts (issue 37), with the install line.
    install = r"pip install nvtx \(or, in a cgc clone, pip install -e '\.\[gpu12\]'"
    with pytest.raises(ConfigError, match=install):
        G.echo_plan().start(nvtx=True, get_timeout=30)
