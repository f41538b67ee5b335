"""Ctrl-C in a user's program: ``KeyboardInterrupt`` comes out of ``plan.start()`` and
``ref.get()`` as itself (not wrapped in a cgc error), within a moment, and the graph is torn
down - no live graph, no actor of it, no shared-memory segment (``interrupt_script.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["start", "get"])
def test_keyboard_interrupt_out_of_start_and_get_tears_down(ray_address, mode):
    proc = subprocess.run([sys.executable, str(HERE / "interrupt_script.py"), mode,
                           ray_address], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["came"] == "KeyboardInterrupt", (got, proc.stderr[-3000:])
    # start: the set-up's teardown; get: the wait ends at once, then the `with` tears down
    assert 0 <= got["after_s"] < 15, got
    assert got["live_graphs"] == 0 and got["alive"] == [] and got["segments"] == [], got
