"""The product never imports the communicators' test stand-ins (``cgc.runtime.comm.testing``)
unless a test switch is on: each check runs in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

COMM = Path(__file__).resolve().parents[3] / "runtime" / "comm"
# Every product module of the package, plus the runtime modules that open communicators.
PRODUCT = sorted(f"cgc.runtime.comm.{p.stem}" for p in COMM.glob("*.py")
                 if p.stem != "__init__") + [
    "cgc.runtime.comm", "cgc.runtime.driver.start", "cgc.runtime.actor.loop_setup",
    "cgc.runtime.actor.executor"]


def _run(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter without the test switches (plus ``env``)."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("CGC_TEST_DEVICE_PROTOCOL", "CGC_NCCL_FAKE_HOSTS")}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_product_modules_do_not_import_the_testing_package():
    code = ("import importlib, sys\n"
            f"for m in {PRODUCT!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.startswith('cgc.runtime.comm.testing')))")
    assert _run(code) == "[]"


def test_binding_imports_the_testing_package_only_in_its_test_mode():
    code = ("import sys\n"
            "from cgc.runtime.comm.binding import bind_communicators\n"
            "b = bind_communicators({0: [('n', None), ('n', None)]})[0]\n"
            "print(b.transport, 'cgc.runtime.comm.testing' in sys.modules)")
    assert _run(code) == "cpu False"
    assert _run(code, CGC_TEST_DEVICE_PROTOCOL="1") == "cpu_protocol True"
