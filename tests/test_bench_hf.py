"""``tools/bench/bench_hf.py`` on the CPU, as ``tools/gpu_check hf`` runs it on the GPU (there
with the 1B shape): every row runs and its tokens equal ``model.generate``'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_rows_run_and_equal_generate(tmp_path, ray_address):
    out = tmp_path / "rows.json"
    ran = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench" / "bench_hf.py"), "--systems",
         "generate,cgc_graph,ray_cgraph,ray_actors", "--stages", "2", "--batches", "1",
         "--prompt-len", "4", "--tokens", "4", "--rounds", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "RAY_ADDRESS": ray_address})
    assert ran.returncode == 0, ran.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["system"], r["stages"]) for r in rows] == [
        ("generate", 0), ("cgc_graph", 2), ("ray_cgraph", 2), ("ray_actors", 2)]
    assert all(r.get("equal") is True and r["tokens_per_s"] > 0 for r in rows), rows
    assert "| 1 | cgc_graph | 2 |" in ran.stdout and "transformers " in ran.stdout
    assert ran.stdout.count("memory: {'weights'") == 2  # each stage's, measured
