"""A weight sync's transfer plan as a user sees it: `cgc compile` writes the same bytes
twice, `cgc inspect` prints it (golden), `cgc viz` labels the sync edge, and `cgc check`
refuses a plan whose parameter list and digest (or buckets) were made to disagree."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_compile_inspect import assert_clean_error, cgc

from cgc.plan_schema import read_plan, write_plan
from cgc.plan_schema.errors import EXIT_INVALID_PLAN

HERE = Path(__file__).resolve().parent
MODEL = HERE / "weight_sync_model.py"
GOLDEN = HERE / "golden" / "weight_sync_inspect.txt"
sys.path.insert(0, str(HERE.parent / "golden"))

from test_golden import check_golden  # noqa: E402


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sync")
    first, second = out / "a.cgplan", out / "b.cgplan"
    for path in (first, second):  # two fresh processes
        proc = cgc("compile", str(MODEL), "-o", str(path))
        assert proc.returncode == 0, proc.stderr
    assert first.read_bytes() == second.read_bytes()
    return first


def test_inspect_prints_the_transfer_plan(plan_path):
    proc = cgc("inspect", str(plan_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = lines.index("weight syncs (1):")
    section = lines[start:lines.index("programs:")]
    check_golden(GOLDEN, "\n".join(section) + "\n")


def test_viz_labels_the_sync_edge(plan_path, tmp_path):
    dot = tmp_path / "g.dot"
    proc = cgc("viz", str(plan_path), "-o", str(dot))
    assert proc.returncode == 0, proc.stderr
    text = dot.read_text()
    assert text.count("weight sync 'model' (host)") == 2  # one edge per rollout
    assert "5 params, 600 bytes, 3 buckets, digest" in text


def _tampered(plan_path: Path, tmp_path: Path, change) -> Path:
    plan = read_plan(plan_path)
    change(plan)
    out = tmp_path / "bad.cgplan"
    write_plan(plan, out)  # a fresh checksum: only the verifier can tell
    return out


def _rename(plan):  # same sizes: only the digest can tell
    plan.graph.weight_syncs[0].params[0].name = "embed.w"


def _retype(plan):  # float32 -> int32: same bytes, another list
    plan.graph.weight_syncs[0].params[4].dtype = "int32"


def _digest(plan):
    plan.lowered.transfers[0].digest = bytes(32)


def _offset(plan):
    plan.lowered.transfers[0].buckets[0].members[1].offset += 4


def _recv_args(plan):
    rid = plan.graph.weight_syncs[0].recv_nodes[1]
    plan.graph.nodes[rid].args[0].ref.output_index = 1


@pytest.mark.parametrize(("change", "says"), [
    (_rename, "does not match the parameter list"),
    (_retype, "does not match the parameter list"),
    (_digest, "does not match the parameter list"),
    (_offset, "expected offset 160"),
    (_recv_args, "must take the 3 buckets"),
])
def test_check_refuses_a_tampered_transfer_plan(plan_path, tmp_path, change, says):
    assert cgc("check", str(plan_path)).returncode == 0
    proc = cgc("check", str(_tampered(plan_path, tmp_path, change)))
    assert_clean_error(proc, EXIT_INVALID_PLAN, "weight sync 0 ('model')", says)
