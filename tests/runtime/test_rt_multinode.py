"""Host channels across Ray nodes bind to TCP and carry every execution, in order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_graph_across_two_nodes_uses_tcp_and_runs():
    proc = subprocess.run(
        [sys.executable, str(HERE / "multinode_script.py")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    near, far = result["nodes"]
    assert near != far, "the two actors should sit on different nodes"
    assert "tcp" in result["bindings"]
    assert result["runs"] == [[(x + 1) * 2, float((x + 1) * 2), 1 << 18] for x in range(20)]
