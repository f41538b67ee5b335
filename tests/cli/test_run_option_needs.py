"""Run options refused before anything starts when a package they need is missing (issue
37, item 3): ``cgc run --nvtx`` without nvtx, ``--dashboard`` without ``ray[default]``'s
packages, exit 2 with the install line, and no Ray started (nothing under ``RAY_TMPDIR``);
``plan.start(nvtx=True)`` raises ``ConfigError`` with Ray never initialized.

A package is made missing for real: the child process sets ``sys.modules[name] = None``
before cgc runs, so any ``import name`` raises ``ModuleNotFoundError`` (Python's own
import-blocking convention), whatever is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgc.plan_schema.errors import EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]

# The CLI with some packages blocked: argv after -c goes to cgc.
_CLI = ("import sys; sys.modules.update(dict.fromkeys(filter(None, sys.argv.pop(1).split(',')))); "
        "from cgc.cli.main import main; sys.exit(main())")


@pytest.fixture(scope="module")
def echo_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plans") / "echo.cgplan"
    proc = subprocess.run([sys.executable, "-m", "cgc.cli.main", "compile",
                           str(ROOT / "examples" / "echo.py"), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """An empty RAY_TMPDIR, short (Ray's socket paths must fit 107 bytes): a Ray that
    starts makes ray/session_* in it."""
    path = Path(tempfile.mkdtemp(prefix="cgc-rt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run_blocked(blocked: str, args: list[str], ray_tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-c", _CLI, blocked, *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.parametrize("option, blocked, needles", [
    ("--nvtx", "nvtx", ["needs the nvtx package", "-e '.[gpu12]'", "-e '.[gpu13]'"]),
    ("--dashboard", "aiohttp", ["needs Ray's dashboard packages", "missing here: aiohttp",
                                "pip install 'ray[default]'"]),
])
def test_option_without_its_package_fails_before_ray_starts(echo_plan, ray_tmp, option,
                                                            blocked, needles):
    proc = _run_blocked(blocked, ["run", str(echo_plan), "--iters", "1", option], ray_tmp)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert list(ray_tmp.iterdir()) == [], "Ray started (it made its session folder)"


def test_torch_profile_into_a_file_fails_before_ray_starts(echo_plan, tmp_path, ray_tmp):
    target = tmp_path / "prof"
    target.write_text("a file, not a folder")
    proc = _run_blocked("", ["run", str(echo_plan), "--torch-profile", str(target)], ray_tmp)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "is a file, not a folder" in proc.stderr
    assert list(ray_tmp.iterdir()) == []


def test_python_api_raises_config_error_before_ray(echo_plan, ray_tmp):
    code = (
        "import sys; sys.modules['nvtx'] = None\n"
        "import cgc\n"
        "from cgc.plan_schema.errors import ConfigError\n"
        f"plan = cgc.load({str(echo_plan)!r})\n"
        "try:\n"
        "    plan.start(nvtx=True)\n"
        "except ConfigError as exc:\n"
        "    print('refused:', exc)\n"
        "ray = sys.modules.get('ray')\n"
        "print('ray initialized:', bool(ray and ray.is_initialized()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "RAY_TMPDIR": str(ray_tmp)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "refused: nvtx=True (cgc run --nvtx) needs the nvtx package" in proc.stdout
    assert "ray initialized: False" in proc.stdout
    assert list(ray_tmp.iterdir()) == []
