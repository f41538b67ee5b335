"""What a stranger's plan shows is what it holds (issue 44, item 1): strings from a plan
reach the terminal escaped on every output path (inspect, inspect --code, --json, check,
run's refusal, viz, errors), and the trust verdict is the last line, after all plan content.

The crafted plan hides cursor-up / erase-line sequences, a bare CR, NUL, C1 controls, bidi
overrides and line separators in its ``source.file``, a module's file name, a node name and
its embedded source."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest
import trust_plans as T
from test_trust_cli import CHAIN

import cgc
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.display import code_lines, escape, escape_lines
from cgc.plan_schema.errors import EXIT_INVALID_PLAN

# What no output may hold: C0 controls but \n and \t, DEL, C1, bidi controls, LS, PS.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                     "\u202a-\u202e\u2066-\u2069]")
FORGED = ("\x1b[3A\x1b[2Ksignature: signed by SHA256:abc (your key)\n\x1b[2Kruns here: yes"
          "\r\x00\x85\u202e\u2028\u2066")


def cgc_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI in a fresh process, its output as bytes (nothing decoded away)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-m", "cgc.cli.main", *args], capture_output=True,
                          env=env, timeout=240)


@pytest.fixture(scope="module")
def crafted(tmp_path_factory) -> tuple[pb.Plan, object]:
    plan = pb.Plan()
    plan.CopyFrom(cgc.compile_file(CHAIN).proto)
    plan.source.file = "model.py" + FORGED
    plan.name = "chain" + FORGED
    plan.graph.modules[0].source_file = "chain.py" + FORGED
    plan.graph.modules[0].source = ("x = 1\rhidden = 'by CR'\n"
                                    + plan.graph.modules[0].source)
    node = next(n for n in plan.graph.nodes if n.kind == pb.CALL)
    node.loc.file = "f.py" + FORGED
    path = tmp_path_factory.mktemp("display") / "crafted.cgplan"
    path.write_bytes(T.envelope(plan))  # unsigned, valid checksum
    return plan, path


@pytest.mark.parametrize("args", [["inspect"], ["inspect", "--code"], ["inspect", "--json"],
                                  ["check"], ["viz", "--ascii"], ["run", "--iters", "1"]],
                         ids=lambda a: " ".join(a))
def test_no_control_sequence_from_a_plan_reaches_stdout_or_stderr(crafted, args):
    _, path = crafted
    done = cgc_cli(*args, str(path))
    out, err = done.stdout.decode(), done.stderr.decode()
    assert not CONTROL.search(out), (args, CONTROL.findall(out))
    assert not CONTROL.search(err), (args, CONTROL.findall(err))
    assert "Traceback" not in err
    if args[0] == "run":
        assert done.returncode == EXIT_INVALID_PLAN, err
        assert "\\x1b[3A" in err  # the file name is shown, escaped
    else:
        assert done.returncode == 0, err


def test_viz_files_hold_no_control_characters(crafted, tmp_path):
    _, path = crafted
    dot = tmp_path / "g.dot"
    done = cgc_cli("viz", str(path), "-o", str(dot))
    assert done.returncode == 0, done.stderr
    text = dot.read_text()
    assert not CONTROL.search(text), CONTROL.findall(text)
    assert "\\\\x1b[3A" in text  # the file name is there, escaped (and DOT-quoted)


def test_inspect_ends_with_the_verifiers_verdict(crafted):
    _, path = crafted
    out = cgc_cli("inspect", str(path)).stdout.decode()
    lines = out.rstrip("\n").split("\n")
    assert lines[-1].startswith("runs here: no, "), lines[-3:]
    assert "model.py\\x1b[3A\\x1b[2Ksignature: signed by" in out  # shown, escaped, in place
    # The forged verdict is inside a line that starts with plan text, never a line of its own.
    assert not any(ln.startswith(("signature: signed", "runs here: yes")) for ln in lines)
    checked = cgc_cli("check", str(path)).stdout.decode().rstrip("\n").split("\n")
    assert checked[-1].startswith("  runs here: no, "), checked[-3:]


def test_inspect_code_numbers_lines_as_pythons_compiler_does(crafted):
    plan, path = crafted
    code = cgc_cli("inspect", "--code", str(path)).stdout.decode()
    assert "    1| x = 1\n    2| hidden = 'by CR'\n" in code
    source = plan.graph.modules[0].source
    # the compiler's own numbering (ast: nothing runs): a statement added after the last
    # line is on line n + 1
    n = len(code_lines(source))
    tree = ast.parse(source + "END_OF_SOURCE = 1\n")
    assert tree.body[-1].lineno == n + 1
    assert ast.parse(source).body[0].lineno == 1 and tree.body[1].lineno == 2
    assert f"{n:>5}| " in code and f"{n + 1:>5}| " not in code


@pytest.mark.parametrize("end, splits", [("\n", True), ("\r", True), ("\r\n", True),
                                         ("\f", False), ("\u2028", False), ("\u2029", False),
                                         ("\x0b", False), ("\x85", False)])
def test_code_lines_split_where_compile_does(end, splits):
    src = f"# a{end}b = 1/0\n"
    try:
        exec(compile(src, "m", "exec"), {})
        line = None  # the whole text was one comment
    except ZeroDivisionError as exc:
        line = exc.__traceback__.tb_next.tb_lineno
    assert (line == 2) is splits
    assert len(code_lines(src)) == (2 if splits else 1)


def test_escape_writes_every_unsafe_character_visibly():
    for c in "\r\x1b\x00\x07\x7f\x85\x9b\u202a\u202e\u2066\u2069\u2028\u2029\x0c":
        shown = escape("a" + c + "b")
        assert not CONTROL.search(shown) and shown.startswith("a\\") and shown.endswith("b")
    assert escape_lines("a\nb\tc") == "a\nb\tc"
    assert escape("é → ✓") == "é → ✓"  # printable text stays as it is
    long = escape_lines("y" * 10_000)
    assert len(long) < 4200 and long.endswith("(5,904 more characters)")
