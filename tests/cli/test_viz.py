"""`cgc viz`: every example in every format, what the pictures say, exit codes, the README.

Pictures need Graphviz (the ``dot`` program, or pygraphviz's bundled one); ``.dot`` output
and the terminal views need nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from model_files import model_files

import cgc
from cgc.cli.main import main
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.planfile import read_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [p.stem for p in model_files(ROOT / "examples")]
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "svg": b"<svg", "pdf": b"%PDF", "dot": b"digraph"}


def _have_graphviz() -> bool:
    if shutil.which("dot"):
        return True
    try:
        import pygraphviz  # noqa: F401
    except ImportError:
        return False
    return True


needs_graphviz = pytest.mark.skipif(not _have_graphviz(), reason="Graphviz is not installed")


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("viz")
    out = {}
    for name in EXAMPLES:
        out[name] = folder / f"{name}.cgplan"
        cgc.compile_file(ROOT / "examples" / f"{name}.py").save(out[name])
    return out


def _png_size(path: Path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf", "dot"])
@pytest.mark.parametrize("view", ["graph", "schedule"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_in_every_format(plans, tmp_path, example, view, fmt, capsys):
    if fmt != "dot" and not _have_graphviz():
        pytest.skip("Graphviz is not installed")
    out = tmp_path / f"{example}.{fmt}"
    args = ["viz", str(plans[example]), "-o", str(out)] + (["--schedule"] if view == "schedule" else [])
    assert main(args) == 0, capsys.readouterr().err
    head = out.read_bytes()[:2000]
    assert MAGIC[fmt] in head
    if fmt == "png":  # fits a screen: the schedule view wraps instead of growing wide
        assert _png_size(out)[0] <= 2000


@needs_graphviz
def test_default_pictures_land_beside_the_plan(plans, capsys):
    path = plans["chain"]
    assert main(["viz", str(path)]) == 0
    assert Path(capsys.readouterr().out.strip()) == path.with_suffix(".png")
    assert main(["viz", str(path), "--schedule"]) == 0
    out = Path(capsys.readouterr().out.strip())
    assert out == path.with_name("chain.schedule.png")
    assert out.read_bytes()[:8] == MAGIC["png"]


def _dot(plan_path: Path, tmp_path: Path, schedule: bool) -> str:
    out = tmp_path / ("s.dot" if schedule else "g.dot")
    assert main(["viz", str(plan_path), "-o", str(out)] + (["--schedule"] if schedule else [])) == 0
    return out.read_text()


@pytest.mark.parametrize("example", EXAMPLES)
def test_graph_view_names_every_task_by_class_and_actor(plans, tmp_path, example):
    plan = read_plan(plans[example], trust=True)
    text = _dot(plans[example], tmp_path, schedule=False)
    classes = {a.name: a.cls.qualname.rsplit(".", 1)[-1] for a in plan.graph.actors}
    for node in plan.graph.nodes:
        if node.kind == pb.CALL:  # "Class:actor" over "method #i", as Ray's view labels it
            label = re.search(rf"\bn{node.id} \[label=<(.*?)>, tooltip", text).group(1)
            assert f"{classes[node.actor]}:{node.actor}" in label
            assert f"<B>{node.method} #{node.bind_index}</B>" in label
    for actor, cls in classes.items():
        assert f'label="{actor}: {cls}' in text
    transports = {pb.Transport.Name(e.transport).lower() for e in plan.lowered.edges}
    drawn = set(re.findall(r'label="(?:\[\d+\] )?(host|nccl|local|device_copy)"', text))
    assert drawn == transports


def test_graph_view_of_the_nccl_pipeline(plans, tmp_path):
    text = _dot(plans["pipeline_nccl"], tmp_path, schedule=False)
    assert "stage0: Stage [gpu=1]" in text and "Stage:stage1" in text
    assert text.count('label="nccl"') == 4 and text.count('label="host"') == 8


@pytest.mark.parametrize("example", EXAMPLES)
def test_schedule_view_has_every_op_and_actor(plans, tmp_path, example):
    plan = read_plan(plans[example], trust=True)
    text = _dot(plans[example], tmp_path, schedule=True)
    assert "layout=neato" in text and f"capacity {plan.config.capacity} executions" in text
    cells = re.findall(r'^  "([\w.]+)" \[width=', text, re.MULTILINE)
    ops = [(p.actor, i) for p in plan.lowered.programs for i in range(len(p.ops))]
    assert sorted(cells) == sorted(f"{a}.{i}" for a, i in ops)
    for prog in plan.lowered.programs:
        assert f"<B>{prog.actor}</B>" in text
        comm = any(op.stream == pb.COMM_STREAM for op in prog.ops)
        assert (f"<B>{prog.actor}</B><BR/>" + '<FONT POINT-SIZE="8" COLOR="#555555">comm stream'
                in text) == comm


def test_schedule_view_joins_sends_to_receives_on_the_comm_stream(plans, tmp_path):
    plan = read_plan(plans["pipeline_nccl"], trust=True)
    text = _dot(plans["pipeline_nccl"], tmp_path, schedule=True)
    sends = [(p.actor, i, op) for p in plan.lowered.programs for i, op in enumerate(p.ops)
             if op.kind == pb.SEND]
    assert len(sends) == 4
    for actor, i, op in sends:
        recv = next(f"{p.actor}.{j}" for p in plan.lowered.programs for j, o in enumerate(p.ops)
                    if o.kind == pb.RECV and o.channel == op.channel)
        assert re.search(rf'"{actor}\.{i}" -> "{recv}" \[color="#1f5fbf"', text)
        pos = {k: re.search(rf'"{k}" \[.*pos="([\d.]+),', text).group(1)
               for k in (f"{actor}.{i}", recv)}
        assert len(set(pos.values())) == 1  # the same column: one step
    assert "comm stream" in text and "dashed" in text  # comm-stream ops, marked
    assert "hoisted: runs under an earlier compute" in text  # the overlap pass's receives
    assert text.count('color="#d95f02"') == 3  # stage1 posts 3 of its 4 receives early


def test_schedule_view_of_a_collective_and_of_host_channels(plans, tmp_path):
    text = _dot(plans["allreduce"], tmp_path, schedule=True)
    assert "<B>allreduce</B>" in text and "style=dotted" in text
    text = _dot(plans["chain"], tmp_path, schedule=True)
    assert text.count("style=dashed") == 2  # adder0 -> adder1 -> rounder, write -> read
    assert "<B>R c2</B>" in text and "→adder1" in text


@needs_graphviz
def test_an_8_actor_96_task_schedule_fits_a_screen_and_keeps_its_type_size(tmp_path,
                                                                           monkeypatch):
    """The issue's legibility case: 8 pipeline stages x 6 microbatches (96 tasks, 276 ops).

    It wraps into bands no wider than a 1920-pixel screen (scrolling down, not sideways),
    every op keeps its own cell and 9-point label, and every actor's lane is in each band.
    """
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "passes"))
    import shapes  # the compiler tests' graph shapes

    from cgc.passes import lower
    from cgc.plan_schema.planfile import write_plan

    plan = lower(shapes.one_f_one_b(8, 6))
    tasks = [n for n in plan.graph.nodes if n.kind == pb.CALL]
    assert len(plan.graph.actors) == 8 and len(tasks) == 96
    path = tmp_path / "f8.cgplan"
    write_plan(plan, path)
    png, dot = tmp_path / "f8.png", tmp_path / "f8.dot"
    for out in (png, dot):
        assert main(["viz", str(path), "--schedule", "-o", str(out)]) == 0
    width, height = _png_size(png)
    assert width <= 1940 and height <= 2600, (width, height)
    text = dot.read_text()
    ops = sum(len(p.ops) for p in plan.lowered.programs)
    cells = re.findall(r'^  "([\w.]+)" \[width=', text, re.MULTILINE)
    assert len(cells) == len(set(cells)) == ops
    assert text.count('POINT-SIZE="9"') == ops  # no label shrunk to fit
    bands = re.findall(r"// band (\d+): steps", text)
    assert len(bands) >= 2
    for b in bands:  # each band repeats every lane (compute and comm stream)
        lanes = re.findall(rf"^  b{b}_\d+ \[shape=plaintext.*?<B>(s\d)</B>", text, re.MULTILINE)
        assert sorted(set(lanes)) == [f"s{i}" for i in range(8)] and len(lanes) == 16


def test_ascii_views(plans, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["viz", str(plans["pipeline_nccl"]), "--ascii"]) == 0
    text = capsys.readouterr().out
    assert "stage0: Stage" in text
    assert "stage0.forward#0 --  nccl--> stage1.head#0" in text
    assert "stage1:" in text and "RECV" in text
    assert main(["viz", str(plans["pipeline_nccl"]), "--schedule", "--ascii"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines)
    assert "capacity 3 executions in flight" in text
    step = next(i for i, line in enumerate(lines) if line.strip().startswith("step 0"))
    grid = lines[step:step + 5]
    assert [line.split()[0] for line in grid[1:]] == ["stage0", "stage0", "stage1", "stage1"]
    col = grid[2].index("5SEND:c5→stage1@g0#0~")  # a SEND and its RECV in one column
    assert grid[4][col:].startswith("6RECV:c5←stage0@g0#0~")


def test_unknown_format_is_a_usage_error_naming_the_fix(plans, tmp_path, capsys):
    assert main(["viz", str(plans["chain"]), "-o", str(tmp_path / "g.jpg")]) == 2
    err = capsys.readouterr().err
    assert "unknown picture format 'jpg'" in err and ".png, .svg, .pdf, .dot" in err
    assert not (tmp_path / "g.jpg").exists()


def test_unwritable_output_is_a_usage_error(plans, tmp_path, capsys):
    assert main(["viz", str(plans["chain"]), "-o", str(tmp_path / "no" / "g.dot")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_no_graphviz_at_all_is_a_usage_error_naming_the_fixes(plans, tmp_path, monkeypatch,
                                                             capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot program
    monkeypatch.setitem(sys.modules, "pygraphviz", None)  # and pygraphviz not installed
    assert main(["viz", str(plans["chain"]), "-o", str(tmp_path / "g.svg")]) == 2
    err = capsys.readouterr().err
    assert "apt-get install graphviz" in err and "pip install pygraphviz" in err
    assert f"-o {tmp_path / 'g.dot'}" in err
    assert main(["viz", str(plans["chain"]), "-o", str(tmp_path / "g.dot")]) == 0


def test_without_the_dot_program_pygraphviz_draws(plans, tmp_path, monkeypatch):
    pytest.importorskip("pygraphviz", reason="pip install pygraphviz")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("dot") is None
    for view in ([], ["--schedule"]):
        out = tmp_path / "p.png"
        assert main(["viz", str(plans["pipeline_nccl"]), "-o", str(out), *view]) == 0
        assert out.read_bytes()[:8] == MAGIC["png"] and _png_size(out)[0] <= 2000


def test_pygraphviz_is_a_core_dependency_here():
    """The README's first command (``pip install -e .``, no extra) brings Graphviz along."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    pgv = [r for r in wanted if r.name == "pygraphviz"]
    assert pgv and (pgv[0].marker is None or pgv[0].marker.evaluate()), pgv


def test_cgc_viz_draws_with_no_dot_program_anywhere(plans, tmp_path):
    """`cgc viz` as a user runs it, in a process whose PATH holds no ``dot``: only the
    environment's bin folder (the ``cgc`` script, python) and an empty folder."""
    pytest.importorskip("pygraphviz", reason="no pygraphviz wheel for this platform")
    bin_dir = Path(sys.executable).parent
    exe = bin_dir / ("cgc.exe" if os.name == "nt" else "cgc")
    if not exe.exists():
        pytest.skip("the cgc console script is not installed beside this python")
    empty = tmp_path / "bin"
    empty.mkdir()
    path = os.pathsep.join([str(bin_dir), str(empty)])
    assert shutil.which("dot", path=path) is None, (
        f"{bin_dir} has a dot program: this test needs an environment without one")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GVBINDIR", "PYTHON"))}
    env["PATH"] = path
    for fmt in ("png", "svg"):
        for view in ([], ["--schedule"]):
            out = tmp_path / f"chain{'.schedule' if view else ''}.{fmt}"
            run = subprocess.run([str(exe), "viz", str(plans["chain"]), "-o", str(out), *view],
                                 env=env, capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stderr
            assert run.stdout.strip() == str(out)
            data = out.read_bytes()
            if fmt == "png":
                assert data[:8] == MAGIC["png"] and _png_size(out)[0] > 100
            else:  # an XML prolog, then the drawing, with the plan's actors in it
                assert data.startswith(b"<?xml") and MAGIC["svg"] in data[:2000]
                assert b"adder0" in data and data.rstrip().endswith(b"</svg>")


def test_readme_shows_a_schedule_picture():
    readme = (ROOT / "README.md").read_text()
    pictures = re.findall(r"!\[[^\]]*\]\((docs/img/[\w.-]+\.png)\)", readme)
    assert any("schedule" in p for p in pictures), pictures
    for rel in pictures:
        path = ROOT / rel
        assert path.read_bytes()[:8] == MAGIC["png"]
        assert path.stat().st_size < 200_000
        assert _png_size(path)[0] <= 2000


@needs_graphviz
@pytest.mark.parametrize("example", ["train_1f1b", "chain"])
def test_viz_prints_only_the_picture_path(plans, tmp_path, example):
    """No noise on stderr (issue 37): no Graphviz "size too small for label" (every box
    fits its label: 1F1B's forward_backward #N is drawn whole, not cut), no Fontconfig
    warnings about the system's font configuration (those only with --verbose)."""
    for view in ([], ["--schedule"]):
        out = tmp_path / f"{example}{'.schedule' if view else ''}.png"
        run = subprocess.run([sys.executable, "-m", "cgc.cli.main", "viz", str(plans[example]),
                              "-o", str(out), *view], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == str(out)
        assert run.stderr == "", run.stderr
    dot = tmp_path / f"{example}.schedule.dot"
    assert main(["viz", str(plans[example]), "--schedule", "-o", str(dot)]) == 0
    if example == "train_1f1b":
        assert "forward_backward #0" in dot.read_text()


def test_schedule_boxes_are_as_wide_as_their_labels():
    from cgc.viz.lanes import Cell, LaneChart, Row, lanes_dot, text_width

    long_title, long_row = "forward_backward_and_more #12", "a_rather_long_stage_name_7"
    chart = LaneChart("t", [Row("r", long_row, "SomeClass")],
                      [Cell("c0", "r", 0, long_title, "task 3 · i"), Cell("c1", "r", 1, "W c1")], [])
    text = lanes_dot(chart)
    widths = [float(w) * 72 for w in re.findall(r'^  "c\d" \[width=([\d.]+)', text, re.MULTILINE)]
    assert widths and min(widths) >= text_width(long_title, 9, bold=True)
    row = re.search(r"^  b0_0 \[shape=plaintext, style=\"\", width=([\d.]+)", text, re.MULTILINE)
    assert row and float(row.group(1)) * 72 >= text_width(long_row, 14, bold=True)
    assert long_title in text and long_row in text  # drawn whole
