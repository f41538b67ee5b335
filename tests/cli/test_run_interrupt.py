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
    # cgc.cli.entry: what the `cgc` console script runs (its Ctrl-C handling starts there)
    proc = subprocess.Popen([sys.executable, "-m", "cgc.cli.entry", "run", str(plan),
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
    Ray starts waits up to 2 s for ray.init() to return; the wide bound here is for a
    loaded machine's teardown; tools/bench/bench_interrupts.py measures the time to exit.)"""
    import random

    rng = random.Random(delay)
    rc, took, err, left, segments = double_ctrl_c(chain_plan, delay + rng.random(),
                                                  rng.random() * 0.005, limit=90)
    assert rc == 130, (rc, err[-2000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert left == [], f"processes left: {left}"
    assert segments == set(), f"shared memory left: {segments}"


def _console_script_entry() -> str:
    """The module:function the ``cgc`` console script runs (pyproject's [project.scripts])."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]["cgc"]


# A Ctrl-C that lands while the `cgc` program imports its command line: a finder sends this
# process SIGINT (COUNT times) when MODULE is first imported; the console script's entry
# point is imported and run as the generated `cgc` script does.
_INTERRUPT_AT_IMPORT = """
import importlib, os, signal, sys
MODULE, COUNT, ENTRY = sys.argv[1], int(sys.argv[2]), sys.argv[3]
class Interrupter:
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            sys.meta_path.remove(self)
            for _ in range(COUNT):
                os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupter())
module, func = ENTRY.split(":")
entry = getattr(importlib.import_module(module), func)
sys.argv = ["cgc", "check", "--help"]
sys.exit(entry())
"""


@pytest.mark.parametrize("module", ["click", "google.protobuf.descriptor",
                                    "cgc.plan_schema.errors"])
@pytest.mark.parametrize("count", [1, 2])
def test_ctrl_c_while_cgc_loads_exits_130_quietly(module, count):
    """The window before cgc installed its handler (issue 44: 2 of 20 double Ctrl-Cs gave
    rc -2 and a KeyboardInterrupt traceback while protobuf was imported)."""
    entry = _console_script_entry()
    done = subprocess.run([sys.executable, "-c", _INTERRUPT_AT_IMPORT, module, str(count),
                           entry], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, (entry, done.returncode, done.stderr[-2000:])
    assert done.stderr.strip() == "Aborted.", done.stderr[-2000:]
    assert done.stdout == ""


def test_import_cgc_imports_nothing_heavy():
    """What the console script imports before cgc takes over Ctrl-C stays light."""
    code = ("import sys, cgc.cli.entry; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('google', 'click', 'ray', 'torch', 'numpy') or m.startswith('cgc.plan')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]", out


@pytest.mark.slow
def test_ctrl_c_during_ray_start_is_not_held_until_ray_is_up(chain_plan):
    """A Ctrl-C while ray.init() runs ends the program once the wait for it (here 0 s:
    CGC_RAY_INIT_ABANDON_S) is over: its half-started Ray's processes killed, exit 130."""
    tmp = f"/tmp/cgci{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen([sys.executable, "-m", "cgc.cli.entry", "run", str(chain_plan),
                             "--iters", "100"],
                            env={**os.environ, "RAY_TMPDIR": tmp, "CGC_RAY_INIT_ABANDON_S": "0"},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = ""
        while "starting a local Ray" not in seen:
            ch = proc.stderr.read(1)
            assert ch, f"cgc run ended before starting Ray: {seen[-500:]}"
            seen += ch
        time.sleep(0.3)  # inside ray.init(): Ray's processes are starting
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=90)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(1.0)  # a killed raylet's workers notice a moment later
    left = _processes_of(tmp)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert err.rstrip().endswith("Aborted."), err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert left == [], f"processes left: {left}"
    assert "channels" not in out  # it did not go on to start the graph
    assert took < 3.0, f"{took:.1f} s from the Ctrl-C to the exit"


# Installed through PYTHONPATH before `python -m` runs the command line: when MODULE is
# first imported, SIGINT lands inside code run by exec() of a string (as dataclasses and
# namedtuple run theirs), where CPython flags the KeyboardInterrupt even once it is caught.
_SITECUSTOMIZE = """
import os, sys
class Interrupter:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["CGC_TEST_INTERRUPT_AT"]:
            sys.meta_path.remove(self)
            exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\n"
                 "for _ in range(1000): pass")
        return None
sys.meta_path.insert(0, Interrupter())
"""


@pytest.mark.parametrize("module,at", [("cgc.cli.entry", "click"),  # while cgc loads
                                       ("cgc.cli.entry", "cgc.cli.check_cmd"),  # in the command
                                       ("cgc.cli.main", "cgc.cli.check_cmd")])
def test_a_caught_ctrl_c_keeps_exit_130_under_python_m(tmp_path, module, at):
    """CPython ends a ``-m`` run by SIGINT (rc -2) when a string exec ended in a caught
    KeyboardInterrupt (2 of 40 double Ctrl-Cs during cgc's imports did, before)."""
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path, "CGC_TEST_INTERRUPT_AT": at}
    done = subprocess.run([sys.executable, "-m", module, "check", "--help"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip() == "Aborted.", done.stderr[-2000:]
