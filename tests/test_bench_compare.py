"""tools/bench/compare.py, the side-by-side check of a change against an earlier commit:
its base side really runs the earlier commit's cgc and leaves nothing behind, its table
compares the quiet samples, and its 1000-call model file compiles."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import pytest

import cgc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "bench"))
import compare  # noqa: E402
from bench_compile import ray_model_source  # noqa: E402


def _worktrees() -> str:
    return subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


def test_the_base_side_runs_the_base_commits_cgc_and_is_removed(tmp_path):
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()
    with compare.base_side("HEAD", tmp_path) as side:
        assert side.label == head and side.root == tmp_path / "base"
        assert str(side.root) in _worktrees()
        compare._check_installed(side, tmp_path)  # raises unless it imports side.root's cgc
        out = subprocess.run([side.python, "-P", "-c", "import cgc; print(cgc.__file__)"],
                             cwd=tmp_path, capture_output=True, text=True, check=True)
        assert Path(out.stdout.strip()).is_relative_to(side.root)
        # It imports the packages of the python running the tests, a venv's included (a
        # venv made from a venv's python sees the base interpreter's site-packages only)
        where = [side.python, "-P", "-c", "import sys; print(*sys.path, sep=chr(10))"]
        base_path = subprocess.run(where, cwd=tmp_path, env=side.env, capture_output=True,
                                   text=True, check=True).stdout.splitlines()
        assert [d for d in site.getsitepackages() if d not in base_path] == []
    assert not (tmp_path / "base").exists()
    assert str(tmp_path / "base") not in _worktrees()


def test_a_ref_that_names_no_commit_is_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match="'no-such-ref-xyz' names no commit"):
        with compare.base_side("no-such-ref-xyz", tmp_path):
            pass


def test_the_table_compares_medians_best_and_quiet_samples():
    row = compare.Row("echo", "µs")
    # Two samples of each side landed in a slow mode (another session took a core).
    row.samples = {"base": [10.0, 36.0, 10.4, 40.0], "current": [10.2, 35.0, 41.0, 10.6]}
    sides = [compare.Side(n, n[:4], sys.executable, ROOT, {}) for n in ("base", "current")]
    [_, _, line] = compare.table([row], *sides).splitlines()
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == "echo"
    assert cells[3] == f"{((35.0 + 10.6) / 2) / ((10.4 + 36.0) / 2):.2f}"  # medians
    assert cells[4] == f"{10.2 / 10.0:.2f}"  # best
    assert cells[5] == f"{10.4 / 10.2:.2f} (2/2)"  # quiet: within 1.5x of its side's best
    # Sides far apart (a regression fixed): each side's quiet samples are its own.
    row.samples = {"base": [2.0, 2.1, 4.5], "current": [0.6, 0.62, 0.64]}
    [_, _, line] = compare.table([row], *sides).splitlines()
    assert line.strip("|").split("|")[5].strip() == f"{0.62 / 2.05:.2f} (2/3)"


def test_the_1000_call_ray_model_file_compiles(tmp_path):
    model = tmp_path / "m.py"
    model.write_text(ray_model_source(calls=40, actors=4))
    plan = cgc.compile_file(model)
    calls = [n for n in plan.proto.graph.nodes if n.method == "step"]
    assert len(calls) == 40
    assert len(plan.proto.graph.actors) == 4


def test_the_ipc_path_rows_run_the_value_path_and_leave_no_segment(tmp_path):
    from cgc.runtime.channels import list_segments

    out = tmp_path / "ipc.json"
    subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "ipc_path.py"), "--iters",
                    "300", "--json", str(out)], cwd=tmp_path, check=True, timeout=300)
    side = compare.Side("current", "x", sys.executable, ROOT, {})
    first = compare.ipc_path_results(side, tmp_path, fresh=True)
    assert compare.ipc_path_results(side, tmp_path, fresh=False) is first  # one run, two rows
    assert first["send"] > 0 and first["recv"] > 0
    assert list_segments("cgc-ipcpath-") == []
