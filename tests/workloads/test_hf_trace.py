"""``examples/rdt_hf_decode.py``: a Hugging Face decoder pipeline written as plain Ray actor
calls with RDT hints (issue 35 item 4), on the CPU in fp32. Eager on Ray (RDT over gloo)
and traced by cgc with the one added line, the greedy tokens equal ``model.generate`` token
for token — through the example's functions and from its command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("CI"):  # CI installs ".[test]", with hf: a missing transformers is a failure there
    import transformers  # noqa: F401
else:
    pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import hf_stages  # noqa: E402
import ray  # noqa: E402
import ray_hf_decode  # noqa: E402
import rdt_common  # noqa: E402
import rdt_llm_decode  # noqa: E402
import tinygpt  # noqa: E402
from hf_checks import assert_varied, token_rows  # noqa: E402

import cgc  # noqa: E402
from cgc.plan_schema import plan_pb2 as pb  # noqa: E402

TOKENS, PROMPT, MAX_SEQ = 8, 6, 32


@pytest.mark.parametrize("traced", [False, True], ids=["eager_rdt_gloo", "cgc"])
def test_llama_step_eager_and_traced_equals_generate(shipped, traced):
    spec = hf_stages.model_spec("llama", "tiny", seed=5)
    ps = hf_stages.prompts(spec, 2, 2, PROMPT)
    want = hf_stages.generate_reference(hf_stages.load_model(spec, "cpu"), ps, TOKENS)
    actors = ray_hf_decode.make_stages(spec, 2, 2, 2, MAX_SEQ, rdt=True)
    rdt_common.setup_transport(actors, "gloo")
    step, plan = rdt_llm_decode.decode_step(actors, "gloo"), None
    try:
        if traced:
            step = cgc.trace(step)  # the one line --cgc adds
        got = tinygpt.generate(step, ray.get, ps, TOKENS)
        if traced:
            plan = step.plan
            step.teardown()
    finally:
        for a in actors:
            ray.kill(a)
    assert hf_stages.first_difference(got, want) is None
    assert_varied(token_rows(got))
    if plan is not None:  # the activations' gloo hint became cgc's host channel
        assert sum(e.transport == pb.HOST and e.reason.startswith("ray rdt gloo")
                   for e in plan.proto.lowered.edges) == 1


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--cgc"]], ids=["eager_rdt_gloo", "cgc"])
def test_command_line_qwen2_prints_json_last(ray_address, flags):
    ran = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rdt_hf_decode.py"), "--model", "qwen2",
         "--stages", "2", "--batch", "2", "--prompt-len", "5", "--tokens", "6", "--seed", "3",
         "--json", *flags],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "RAY_ADDRESS": ray_address})
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.strip().splitlines()
    assert lines[-2].startswith("cgc trace (gloo)" if flags else "eager Ray (gloo)"), lines
    out = json.loads(lines[-1])
    assert out["equal"] is True
    spec = hf_stages.model_spec("qwen2", "tiny", seed=3)
    want = hf_stages.prompts(spec, 2, 2, 5, 4)  # --seed 3: prompts from seed 4
    assert out["prompts"] == [r for t in want for r in t.tolist()]
    assert len(out["tokens"]) == 4 and all(len(t) == 6 for t in out["tokens"])
    assert_varied(out["tokens"])
