"""`cgc compile` and `cgc inspect` as a user runs them: every example, determinism across
fresh processes, and one clear line (no traceback) with a distinct exit code for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from model_files import model_files

from cgc.plan_schema.errors import EXIT_INVALID_INPUT, EXIT_INVALID_PLAN, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [p.name for p in model_files(ROOT / "examples")]


def cgc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh process, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "cgc.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONHASHSEED": "random"},
        timeout=120,
    )


def assert_clean_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_compiles_deterministically_inspects_and_checks(
        compiled_example, example, tmp_path):
    # two fresh processes: the session's compile of the example (other tests run its plan)
    # and one of this test's own
    first, second = compiled_example(example)[0], tmp_path / "b.cgplan"
    for proc in (compiled_example(example)[1],
                 cgc("compile", str(ROOT / "examples" / example), "-o", str(second))):
        assert proc.returncode == 0, proc.stderr
        assert "compiled" in proc.stdout and "actors" in proc.stdout
        assert "never used" not in proc.stderr, proc.stderr
    assert first.read_bytes() == second.read_bytes()
    text = cgc("inspect", str(first))
    assert text.returncode == 0, text.stderr
    assert "format 1." in text.stdout
    checked = cgc("check", str(first))
    assert checked.returncode == 0, checked.stderr
    assert "no deadlock" in checked.stdout
    as_json = cgc("inspect", str(first), "--json")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["name"] == Path(example).stem and doc["graph"]["actors"]


def test_compile_attr_selects_function(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(
        textwrap.dedent("""
        import cgc
        from cgc import InputNode

        @cgc.actor
        class W:
            def f(self, x):
                return x

        def make():
            w = W.bind()
            with InputNode() as inp:
                return w.f.bind(inp)
    """)
    )
    proc = cgc("compile", f"{model}:make", "-o", str(tmp_path / "m.cgplan"))
    assert proc.returncode == 0, proc.stderr
    missing = cgc("compile", str(model), "-o", str(tmp_path / "m.cgplan"))
    assert_clean_error(missing, EXIT_INVALID_INPUT, "defines no build_dag()", "model.py:ATTR")


def test_compile_errors_name_the_culprit(tmp_path):
    model = tmp_path / "bad.py"
    model.write_text(
        textwrap.dedent("""
        import cgc
        from cgc import InputNode

        @cgc.actor
        class Worker:
            def fwd(self, x):
                return x

        def build_dag():
            w = Worker.bind()
            with InputNode() as inp:
                return w.fwd.bind(inp, 2)
    """)
    )
    proc = cgc("compile", str(model), "-o", str(tmp_path / "b.cgplan"))
    assert_clean_error(proc, EXIT_INVALID_INPUT, "Worker.fwd", "bad.py:13")


def test_model_that_raises_names_its_line(tmp_path):
    model = tmp_path / "boom.py"
    model.write_text("def build_dag():\n    raise RuntimeError('no graph today')\n")
    proc = cgc("compile", str(model), "-o", str(tmp_path / "b.cgplan"))
    assert_clean_error(proc, EXIT_INVALID_INPUT, "boom.py:2", "no graph today")


def test_plain_class_bind_says_to_decorate_it(tmp_path):
    model = tmp_path / "plain.py"
    model.write_text(textwrap.dedent("""\
        from cgc import InputNode

        class Worker:
            def step(self, x):
                return x

        def build_dag():
            a = Worker.bind()
            with InputNode() as inp:
                return a.step.bind(inp)
        """))
    proc = cgc("compile", str(model), "-o", str(tmp_path / "p.cgplan"))
    assert_clean_error(proc, EXIT_INVALID_INPUT, "plain.py:8", "class Worker is not an actor "
                       "class: decorate it with @cgc.actor (or @ray.remote)")


@pytest.mark.parametrize("api", ["cgc", "ray"])
def test_unused_actor_is_named_at_compile(api, tmp_path):
    deco, node = ("cgc.actor", "cgc") if api == "cgc" else ("ray.remote", "ray.dag")
    model = tmp_path / "unused.py"
    model.write_text(textwrap.dedent(f"""\
        import cgc
        import ray
        from {node} import InputNode

        @{deco}
        class Worker:
            def step(self, x):
                return x

        def build_dag():
            a, c = Worker.bind(), Worker.bind()
            b = Worker.bind()
            with InputNode() as inp:
                return c.step.bind(a.step.bind(inp))
        """))
    proc = cgc("compile", str(model), "-o", str(tmp_path / "u.cgplan"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("never used") == 1, proc.stderr
    assert "warning: unused.py:12: actor Worker bound here is never used" in proc.stderr


def test_first_compile_says_where_it_made_the_signing_key(tmp_path):
    env = {**os.environ, "CGC_CONFIG_DIR": str(tmp_path / "config")}
    lines = []
    for out in ("a.cgplan", "b.cgplan"):
        proc = subprocess.run([sys.executable, "-m", "cgc.cli.main", "compile",
                               str(ROOT / "examples" / "echo.py"), "-o", str(tmp_path / out)],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        lines.append([x for x in proc.stderr.splitlines() if "plan-signing key" in x])
    key = tmp_path / "config" / "signing_key.pem"
    assert key.exists()
    assert len(lines[0]) == 1 and f"made your plan-signing key: {key}" in lines[0][0]
    assert lines[1] == []  # once


def test_missing_model_file(tmp_path):
    proc = cgc("compile", str(tmp_path / "nope.py"), "-o", str(tmp_path / "x.cgplan"))
    assert_clean_error(proc, EXIT_INVALID_INPUT, "no such model file")


def test_usage_error_exit_code():
    proc = cgc("compile")
    assert proc.returncode == EXIT_USAGE
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def echo_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plans") / "echo.cgplan"
    proc = cgc("compile", str(ROOT / "examples" / "echo.py"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def test_inspect_foreign_file(tmp_path):
    foreign = tmp_path / "model.cgplan"
    foreign.write_text("this is not a plan\n")
    assert_clean_error(cgc("inspect", str(foreign)), EXIT_INVALID_PLAN, "not a cgc plan file")


def test_inspect_truncated(echo_plan, tmp_path):
    cut = tmp_path / "cut.cgplan"
    cut.write_bytes(echo_plan.read_bytes()[:-10])
    assert_clean_error(cgc("inspect", str(cut)), EXIT_INVALID_PLAN, "truncated")


def test_inspect_corrupted(echo_plan, tmp_path):
    data = bytearray(echo_plan.read_bytes())
    data[len(data) // 2 + 20] ^= 0x55
    bad = tmp_path / "bad.cgplan"
    bad.write_bytes(bytes(data))
    assert_clean_error(cgc("inspect", str(bad)), EXIT_INVALID_PLAN, "corrupted")


@pytest.mark.parametrize("command", ["inspect", "check", "viz", "run"])
def test_missing_plan_file_is_a_usage_error(command, tmp_path):
    # A path that is not there is a wrong command line (2), not an invalid plan (4).
    missing = tmp_path / "none.cgplan"
    assert_clean_error(cgc(command, str(missing)), EXIT_USAGE, f"{missing}: no such plan file")


def test_check_of_a_model_file_says_how_to_compile_it(tmp_path):
    model = tmp_path / "model.py"
    model.write_text("def build_dag():\n    pass\n")
    proc = cgc("check", str(model))
    assert_clean_error(proc, EXIT_INVALID_PLAN, "not a cgc plan file",
                       f"to compile a model file: cgc compile {model} -o model.cgplan")


# Plans over cgc's bounds (issue 20): inspect refuses them as check and viz do. Each is the
# echo plan with one field past its Limits bound (field -> what the message names).
OVER_LIMITS = {
    "capacity": (lambda p: setattr(p.config, "capacity", 2**32 - 1), "ExecConfig.capacity"),
    "num_returns": (lambda p: setattr(p.graph.nodes[2], "num_returns", 10**6), "num_returns"),
    "slots": (lambda p: setattr(p.lowered.channels[0], "slots", 2**20), "c1 slots"),
    "keyword fields": (lambda p: p.graph.keyword_fields.extend(f"k{i:05}" for i in range(5000)),
                       "keyword_fields"),
    "bigint digits": (lambda p: p.example_args[0].__setattr__("bigint_value", "7" * 9000),
                      "bigint_digits"),
    "num_cpus": (lambda p: setattr(p.graph.actors[0].options, "num_cpus", float("inf")),
                 "resource_amount"),
}


@pytest.mark.parametrize("case", sorted(OVER_LIMITS))
def test_plans_over_limits_are_refused_by_inspect_check_and_viz(echo_plan, tmp_path, case):
    from cgc.plan_schema import read_plan, write_plan

    mutate, needle = OVER_LIMITS[case]
    plan = read_plan(echo_plan)
    mutate(plan)
    path = tmp_path / "over.cgplan"
    write_plan(plan, path)
    for argv in (["inspect"], ["inspect", "--json"], ["inspect", "--code"], ["check"],
                 ["viz", "--ascii"]):
        proc = cgc(argv[0], str(path), *argv[1:])
        assert_clean_error(proc, EXIT_INVALID_PLAN, needle)
        assert "above the limit" in proc.stderr and not proc.stdout, (argv, proc.stdout)
