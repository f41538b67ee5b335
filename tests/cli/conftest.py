"""Fixtures of the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
Compiled = tuple[Path, "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="session")
def compiled_example(tmp_path_factory, cgc_config_dir) -> Callable[[str], Compiled]:
    """``compiled_example("echo.py")``: the example compiled by `cgc compile` in a fresh
    process as a user runs it (hash seed random), once per session (with pytest-xdist, per
    worker); returns the plan file and the finished process. Tests only read them."""
    folder = tmp_path_factory.mktemp("example-plans")
    done: dict[str, Compiled] = {}

    def compiled(example: str) -> Compiled:
        if example not in done:
            plan = folder / f"{Path(example).stem}.cgplan"
            proc = subprocess.run(
                [sys.executable, "-m", "cgc.cli.main", "compile",
                 str(ROOT / "examples" / example), "-o", str(plan)],
                capture_output=True, text=True, timeout=120,
                env={**os.environ, "PYTHONHASHSEED": "random", "PYTHONUNBUFFERED": "1"})
            done[example] = (plan, proc)
        return done[example]

    return compiled
