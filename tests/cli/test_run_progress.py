"""``cgc run`` says what it is doing from its first second (issue 43, items 6 and 7): its
first line comes before Ray is up, then one line per step of the start (starting Ray,
creating the actors, connecting them), each as it happens, not all at the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chain_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plans") / "chain.cgplan"
    proc = subprocess.run([sys.executable, "-m", "cgc.cli.main", "compile",
                           str(ROOT / "examples" / "chain.py"), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


def _timed_stderr(*args: str) -> tuple[list[tuple[float, str]], str, int]:
    """Run ``cgc run ARGS``; its stderr lines with the second each arrived, stdout, rc."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "cgc.cli.main", "run", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None and proc.stdout is not None
    lines = [(time.monotonic() - t0, line.rstrip("\n")) for line in proc.stderr]
    out = proc.stdout.read()
    return lines, out, proc.wait(timeout=300)


@pytest.mark.slow
def test_the_first_line_comes_before_ray_is_up_and_each_step_is_said(chain_plan):
    lines, out, rc = _timed_stderr(str(chain_plan), "--iters", "2", "--warmup", "0")
    assert rc == 0, lines
    said = [text for _, text in lines]
    assert said[0] == f"cgc run: loading {chain_plan}", said
    steps = ["cgc run: starting a local Ray with", "cgc run: Ray is up (",
             "cgc run: 3 actor(s) up; connecting their channels", "cgc run: graph 'chain' started"]
    at = [next(i for i, text in enumerate(said) if text.startswith(s)) for s in steps]
    assert at == sorted(at), said
    # Each line is written as it happens: the first arrived at least as long before the
    # "Ray is up" line as Ray took to start (it says how long).
    up_t, up_text = lines[at[1]]
    ray_s = float(re.search(r"Ray is up \(([\d.]+) s\)", up_text).group(1))  # type: ignore[union-attr]
    assert up_t - lines[0][0] >= ray_s - 0.1, lines
    assert "plan chain: 2 executions" in out
