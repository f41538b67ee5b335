"""``cgc run``: stored example inputs, --input, --json, and the no-inputs message."""

from __future__ import annotations

import json
from pathlib import Path

import rt_graphs as G

import cgc
from cgc.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_run_json_with_example_inputs(ray_cluster, tmp_path, capsys):
    path = tmp_path / "fanout.cgplan"
    cgc.compile_file(ROOT / "examples" / "fanout.py").save(path)
    assert main(["run", str(path), "--iters", "20", "--warmup", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs"] == [111.5, 222.5, 333.5]
    assert set(out["latency_us"]) == {"p50", "p90", "p99"}
    assert 0 < out["latency_us"]["p50"] <= out["latency_us"]["p99"]
    assert out["host_channels"] == {"shm": 6, "tcp": 0}  # one broadcast input, 3+1+1 others
    assert out["throughput_per_s"] > 0 and out["setup_s"] > 0
    assert 0 <= out["ray_start_s"] < out["setup_s"]  # Ray already up here: joining is quick


def test_run_plain_text_and_multi_output(ray_cluster, tmp_path, capsys):
    path = tmp_path / "mr.cgplan"
    cgc.compile_file(ROOT / "examples" / "multi_return.py").save(path)
    assert main(["run", str(path), "--iters", "5"]) == 0
    text = capsys.readouterr().out
    assert "p50" in text and "p99" in text and "set-up" in text and "[6, '35 chars']" in text


def test_run_without_inputs_says_how(ray_cluster, tmp_path, capsys):
    path = tmp_path / "echo.cgplan"
    G.echo_plan().save(path)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no example inputs" in err and "--input" in err
    assert main(["run", str(path), "--input", "[[1, 2]]", "--iters", "3", "--json",
                 "--get-timeout", "30"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == [1, 2]


def test_outputs_are_json_values_or_repr():
    import numpy as np

    from cgc.cli.run_cmd import _jsonable

    assert _jsonable((1, "a", None)) == [1, "a", None]
    assert _jsonable({"k": [1.5]}) == {"k": [1.5]}
    assert _jsonable({1, 2}) == "{1, 2}"
    assert _jsonable([np.arange(2), float("nan")]) == ["array([0, 1])", "nan"]
