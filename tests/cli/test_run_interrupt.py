"""Ctrl-C on ``cgc run`` at any moment - while Ray and the graph start, while it runs,
while it tears down and exits - ends with "Aborted." and exit code 130, prints the run's
statistics when it had started, and leaves no process and no shared-memory segment behind.

Each run gets a Ray temp folder of its own (``RAY_TMPDIR``), so its processes are found by
their command lines; other Ray clusters on the machine do not count.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")


# Every segment of a graph starts with its prefix (endpoints.new_graph_prefix: "cgc-" and
# 24 hex digits); other names in the folder are other tests' (pytest-xdist workers).
_GRAPH_SEGMENT = re.compile(r"cgc-[0-9a-f]{24}")


def _segments() -> set[str]:
    return {str(p) for d in SHM.glob(f"cgc-{os.getuid()}*") for p in d.iterdir()
            if _GRAPH_SEGMENT.match(p.name)}


def _orphaned(paths: set[str]) -> set[str]:
    """Those of ``paths`` whose creator process is gone: what an ended run left. Under
    pytest-xdist another worker's graphs run meanwhile; their creators are alive."""
    from cgc.runtime.channels.procs import is_alive
    from cgc.runtime.channels.shm import Segment

    out = set()
    for path in paths:
        try:
            seg = Segment.attach(Path(path).name)
        except OSError:
            continue  # unlinked meanwhile: not left
        try:
            creator = seg.creator
        finally:
            seg.close()
        if not is_alive(*creator):
            out.add(path)
    return out


def _processes_of(tmp: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if tmp.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.append(int(pid))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def chain_plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("interrupt") / "chain.cgplan"
    subprocess.run([sys.executable, "-m", "cgc.cli.main", "compile",
                    str(ROOT / "examples" / "chain.py"), "-o", str(path)],
                   check=True, capture_output=True, timeout=120)
    return path


def _interrupted_run(plan: Path, when: str, iters: int) -> tuple[int, str, str, list[int], set]:
    """Run ``cgc run PLAN``, send SIGINT at ``when``; return what it left."""
    tmp = f"/tmp/cgci{uuid.uuid4().hex[:6]}"  # short: Ray's socket paths must stay short
    before = _segments()
    proc = subprocess.Popen([sys.executable, "-m", "cgc.cli.main", "run", str(plan),
                             "--iters", str(iters)],
                            env={**os.environ, "RAY_TMPDIR": tmp}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if when == "start":
            time.sleep(2.0)  # Ray is starting, or the graph's actors are
        else:
            stream = proc.stderr if when == "run" else proc.stdout
            marker = "running chain" if when == "run" else "channels"
            seen = ""
            while marker not in seen:
                ch = stream.read(1)
                assert ch, f"cgc run ended before {marker!r}: {seen[-500:]}"
                seen += ch
            time.sleep(0.15)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30  # Ray's processes exit a moment after the driver (longer under load)
    while _processes_of(tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _processes_of(tmp)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return proc.returncode, out, err, left, _orphaned(_segments() - before)


@pytest.mark.slow
@pytest.mark.parametrize("when,iters", [("start", 100), ("run", 500_000), ("exit", 50)])
def test_ctrl_c_at_any_moment_aborts_cleanly(chain_plan, when, iters):
    rc, out, err, left, segments = _interrupted_run(chain_plan, when, iters)
    assert rc == 130, (rc, err[-2000:])
    assert err.rstrip().endswith("Aborted."), err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert left == [], f"processes left: {left}"
    assert segments == set(), f"shared memory left: {segments}"
    if when == "run":  # the statistics of what ran
        assert "latency" in out and "interrupted after" in err, (out, err[-1000:])


def double_ctrl_c(plan: Path, delay: float, gap: float, limit: float = 10.0
                  ) -> tuple[int | None, float, str, list[int], set]:
    """``cgc run PLAN`` sent two SIGINTs ``gap`` s apart, ``delay`` s after it started:
    (exit code or None when it had not ended ``limit`` s after the first, seconds from the
    first SIGINT to the exit, stderr, processes left, shared memory left)."""
    tmp = f"/tmp/cgci{uuid.uuid4().hex[:6]}"
    before = _segments()
    proc = subprocess.Popen([sys.executable, "-m", "cgc.cli.main", "run", str(plan),
                             "--iters", "500000"], env={**os.environ, "RAY_TMPDIR": tmp},
                            text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rc: int | None = None
    try:
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        time.sleep(gap)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=limit)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while _processes_of(tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _processes_of(tmp)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return rc, took, err, left, _orphaned(_segments() - before)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [1.5, 2.5, 3.5, 5.0])
def test_two_ctrl_c_in_quick_succession_abort_cleanly(chain_plan, delay):
    """Ray's start-up, the graph's, the run: the process ends with 130. (A Ctrl-C while
    Ray starts waits for ray.init() to return: on a loaded machine that takes long, hence
    the wide bound here; tools/bench/bench_interrupts.py measures the time to exit.)"""
    import random

    rng = random.Random(delay)
    rc, took, err, left, segments = double_ctrl_c(chain_plan, delay + rng.random(),
                                                  rng.random() * 0.005, limit=90)
    assert rc == 130, (rc, err[-2000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert left == [], f"processes left: {left}"
    assert segments == set(), f"shared memory left: {segments}"
