"""`cgc viz`: pictures in every format, the default path beside the plan, the terminal view."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import cgc
from cgc.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("viz") / "pipeline_nccl.cgplan"
    cgc.compile_file(ROOT / "examples" / "pipeline_nccl.py").save(path)
    return path


def test_default_png_beside_the_plan(plan_path, capsys):
    if shutil.which("dot") is None:
        pytest.skip("graphviz 'dot' not installed")
    assert main(["viz", str(plan_path)]) == 0
    out = Path(capsys.readouterr().out.strip())
    assert out == plan_path.with_suffix(".png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("suffix", ["svg", "pdf", "dot"])
def test_suffix_picks_the_format(plan_path, tmp_path, suffix):
    if suffix != "dot" and shutil.which("dot") is None:
        pytest.skip("graphviz 'dot' not installed")
    out = tmp_path / f"g.{suffix}"
    assert main(["viz", str(plan_path), "-o", str(out)]) == 0
    head = out.read_bytes()[:1000]
    assert {"svg": b"<svg", "pdf": b"%PDF", "dot": b"digraph"}[suffix] in head


def test_graph_dot_shows_transports_and_actors(plan_path, tmp_path):
    out = tmp_path / "g.dot"
    main(["viz", str(plan_path), "-o", str(out)])
    text = out.read_text()
    assert "stage0: Stage" in text and "stage1: Stage" in text
    assert 'label="nccl"' in text and 'label="host"' in text


def test_schedule_view_links_sends_to_recvs(plan_path, tmp_path):
    out = tmp_path / "s.dot"
    assert main(["viz", str(plan_path), "--schedule", "-o", str(out)]) == 0
    text = out.read_text()
    assert "SEND" in text and "RECV" in text and 'color="#1f5fbf"' in text


def test_ascii_view(plan_path, capsys):
    assert main(["viz", str(plan_path), "--ascii"]) == 0
    text = capsys.readouterr().out
    assert "stage0.forward#0 --  nccl--> stage1.head#0" in text
    assert "stage1:" in text and "RECV" in text


def test_unknown_format_is_a_clear_error(plan_path, tmp_path, capsys):
    assert main(["viz", str(plan_path), "-o", str(tmp_path / "g.jpg2")]) == 3
    assert "unknown picture format" in capsys.readouterr().err
