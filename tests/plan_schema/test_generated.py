"""The checked-in plan_pb2.py must be what protoc makes of plan.proto today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_generated_module_is_fresh():
    pytest.importorskip("grpc_tools", reason="protoc comes from grpcio-tools (the test extra)")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
