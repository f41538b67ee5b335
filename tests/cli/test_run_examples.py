"""Every example, compiled and run as a user does (`cgc compile` then `cgc run --json`),
returns the right outputs — computed here independently of cgc, from the example's own
classes and inputs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(
        f"expect_{name}", ROOT / "examples" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pipeline_expected() -> list[float]:
    m = _load("pipeline_nccl")
    s0, s1 = m.Stage.cls(0), m.Stage.cls(1)
    return [s1.head(s0.forward(x)) for x in m.example_inputs()]


def _examples_on_path() -> None:
    # The workload examples import their helper modules (tinygpt, ...) from their folder.
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))


def _decode_expected() -> str:
    _examples_on_path()
    import tinygpt

    m = _load("llm_decode")
    mb, tokens, pos = m.example_inputs()
    cfg = tinygpt.SIZES["tiny"]
    x = tokens
    for a, b in tinygpt.split_layers(cfg["n_layers"], 2):
        x = tinygpt.GPTStage(cfg, a, b, 2, 2).forward(x, mb, pos)
    return repr(x)  # `cgc run --json` shows a tensor as its repr


def _train_expected() -> list[float]:
    _examples_on_path()
    import pipe_train

    return pipe_train.reference(pipe_train.SIZES["tiny"], 2, 1)[0]


def _rl_expected() -> list[float]:
    _examples_on_path()
    import rl_policy

    return rl_policy.reference(rl_policy.SIZES["tiny"], 1)[0]


EXPECTED = {
    "echo": lambda: "hello",
    "chain": lambda: 5.5,
    "fanout": lambda: [111.5, 222.5, 333.5],
    "multi_return": lambda: [6, "35 chars"],
    "pipeline_nccl": _pipeline_expected,
    "allreduce": lambda: [9.0, 9.0],  # mean of x*1 and x*2, summed: 6 * 1.5
    "ray_chain": lambda: [[98, 99, 100], 97, 99],
    "llm_decode": _decode_expected,
    "train_1f1b": _train_expected,
    "rl_loop": _rl_expected,
}


def _close(a, b) -> bool:
    if hasattr(a, "tolist") and isinstance(b, str):  # a tensor from the API, its repr expected
        a = repr(a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= 1e-4 * max(1.0, abs(b))
    return a == b


@pytest.fixture
def compiled_plan(compiled_example) -> Callable[[str], Path]:
    """``compiled_plan(name)``: ``examples/<name>.py`` compiled by `cgc compile`, the
    session's copy (these tests only read the plan file)."""

    def plan_of(example: str) -> Path:
        plan, proc = compiled_example(f"{example}.py")
        assert proc.returncode == 0, proc.stderr
        return plan

    return plan_of


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_example_runs_with_right_outputs(ray_address, compiled_plan, example):
    plan = compiled_plan(example)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Join the test session's cluster rather than starting one per example.
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "cgc.cli.main",
            "run",
            str(plan),
            "--iters",
            "5",
            "--warmup",
            "1",
            "--address",
            ray_address,
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout)
    assert _close(result["outputs"], EXPECTED[example]()), result["outputs"]
    assert result["latency_us"]["p50"] > 0


@pytest.mark.parametrize("example", ["allreduce", "pipeline_nccl"])
def test_gpu_example_runs_with_communicator_cpu(ray_address, compiled_plan, example):
    """`cgc run --communicator cpu` runs a GPU plan anywhere (here, and on a machine with
    fewer GPUs than the plan asks for) and reports how each communicator was bound."""
    plan = compiled_plan(example)
    cli = [sys.executable, "-m", "cgc.cli.main"]
    ran = subprocess.run([*cli, "run", str(plan), "--iters", "3", "--warmup", "0",
                          "--address", ray_address, "--communicator", "cpu", "--json"],
                         capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout)
    assert _close(result["outputs"], EXPECTED[example]()), result["outputs"]
    assert result["communicators"] == {"0": {"transport": "cpu",
                                             "reason": "communicator='cpu' was requested"}}
    text = subprocess.run([*cli, "run", str(plan), "--iters", "2", "--warmup", "0",
                           "--address", ray_address, "--communicator", "cpu"],
                          capture_output=True, text=True, timeout=180)
    assert text.returncode == 0, text.stderr[-3000:]
    assert "comm 0       cpu: communicator='cpu' was requested" in text.stdout


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_example_runs_through_the_python_api(ray_cluster, example):
    import cgc
    from cgc.plan_schema.values import decode_value

    plan = cgc.compile_file(ROOT / "examples" / f"{example}.py")
    args = [decode_value(v) for v in plan.proto.example_args]
    with plan.start(get_timeout=60) as graph:
        refs = graph.execute(*args)
        out = [r.get() for r in refs] if isinstance(refs, list) else refs.get()
    assert _close(out, EXPECTED[example]()), out


def test_run_reports_a_user_exception_with_its_line(ray_address, tmp_path):
    model = tmp_path / "raising.py"
    model.write_text(
        "import cgc\nfrom cgc import InputNode\n\n\n@cgc.actor\nclass W:\n"
        "    def f(self, x):\n        return 10 / x\n\n\n"
        "def build_dag():\n    w = W.bind()\n    with InputNode() as inp:\n"
        "        return w.f.bind(inp)\n\n\ndef example_inputs():\n    return (0,)\n"
    )
    plan = tmp_path / "raising.cgplan"
    cli = [sys.executable, "-m", "cgc.cli.main"]
    assert subprocess.run([*cli, "compile", str(model), "-o", str(plan)]).returncode == 0
    ran = subprocess.run(
        [*cli, "run", str(plan), "--address", ray_address, "--iters", "2"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 1
    assert "Traceback" not in ran.stderr
    assert "ZeroDivisionError in w.f (actor 'w', execution 0)" in ran.stderr
    assert 'raising.py", line 8, in f: return 10 / x' in ran.stderr
