"""cgc.hf on actors: ``pipeline()`` from a checkpoint directory to tokens equal to the
library's ``from_pretrained`` + ``generate`` (greedy and sampled), the example model file,
and the three example scripts from their command lines (cgc, Ray Compiled Graph through the
drop-in, plain Ray with RDT traced by cgc), each checking itself against the library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
from checkpoints import write  # noqa: E402
from hf_checks import assert_varied, token_rows  # noqa: E402

import cgc  # noqa: E402
from cgc import hf  # noqa: E402
from cgc.plan_schema import plan_pb2 as pb  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOKENS, PROMPT = 8, 6


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return write(tmp_path_factory.mktemp("llama"), "llama", seed=5)


def test_pipeline_from_a_checkpoint_equals_generate(ray_cluster, llama):
    spec = hf.model_spec(checkpoint=str(llama))
    ps = hf.prompts(256, 2, 2, PROMPT)
    want = hf.generate_reference(hf.reference_model(str(llama), spec), ps, TOKENS)
    with hf.pipeline(str(llama), stages=2, microbatches=2, batch=2, max_seq=32) as gen:
        got = gen.generate(ps, TOKENS)
    assert hf.first_difference(got, want) is None
    assert_varied(token_rows(got))


def test_sampled_pipeline_equals_the_librarys_sampling(ray_cluster, llama):
    spec = hf.model_spec(checkpoint=str(llama))
    ps = hf.prompts(256, 2, 1, PROMPT)
    opts = dict(do_sample=True, temperature=0.7, top_k=30, top_p=0.95)
    want = hf.generate_reference(hf.reference_model(str(llama), spec), ps, TOKENS, seed=4,
                                 **opts)
    with hf.pipeline(str(llama), stages=2, microbatches=2, batch=1, max_seq=32, seed=4,
                     **opts) as gen:
        got = gen.generate(ps, TOKENS)
    assert hf.first_difference(got, want) is None
    with pytest.raises(hf.UnsupportedModelError, match="without cuda_graph"):
        hf.pipeline(str(llama), cuda_graph=True, **opts)


def test_cuda_graphs_asked_for_mark_each_stage(ray_cluster):
    dag = hf.build_dag(hf.model_spec("llama"), 2, 1, 2, 32, "cpu", cuda_graph=True)
    plan = cgc.compile(dag, name="hf")
    assert [n.cuda_graph for n in plan.proto.graph.nodes if n.kind == pb.CALL] == [True, True]


def test_model_file_runs_its_example_inputs(ray_cluster):
    """``examples/hf_decode.py`` as a model file (what ``cgc compile`` reads)."""
    from cgc.plan_schema.values import decode_value

    plan = cgc.compile_file(ROOT / "examples" / "hf_decode.py")
    args = [decode_value(v) for v in plan.proto.example_args]
    with plan.start(get_timeout=120) as g:
        got = g.execute(*args).get()
    mb, tokens, pos = args
    spec = hf.model_spec("llama", "tiny")
    stages = [hf.HFStage(spec, a, b, 2, 2, 64, "cpu") for a, b in hf.split_layers(4, 2)]
    assert got.tolist() == hf.run_stages(stages, tokens, mb, pos).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("script,flags,system", [
    ("hf_decode.py", [], "cgc"),
    ("hf_decode.py", ["--sample", "--temperature", "0.8", "--top-k", "20"], "cgc"),
    ("ray_hf_decode.py", ["--cgc"], "cgc drop-in"),
    ("rdt_hf_decode.py", ["--cgc"], "cgc trace (gloo)"),
], ids=["cgc", "cgc_sampled", "ray_drop_in", "rdt_traced"])
def test_command_lines_check_themselves_against_the_library(ray_address, llama, script, flags,
                                                            system):
    ran = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), "--checkpoint", str(llama),
         "--stages", "2", "--batch", "2", "--prompt-len", "5", "--tokens", "6", "--seed", "3",
         "--json", *flags],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "RAY_ADDRESS": ray_address})
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    lines = ran.stdout.strip().splitlines()
    assert lines[-2].startswith(system), lines
    out = json.loads(lines[-1])
    assert out["equal"] is True
    want = hf.prompts(256, 2, 2, 5, 4)  # --seed 3: prompts from seed 4
    assert out["prompts"] == [r for t in want for r in t.tolist()]
    assert len(out["tokens"]) == 4 and all(len(t) == 6 for t in out["tokens"])
