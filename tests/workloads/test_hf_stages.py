"""Hugging Face decoders split into stages (issue 35), on the CPU in fp32: greedy tokens equal
``model.generate(do_sample=False)`` of the same model token for token — in one process,
through cgc's API (a model file with CUDA graphs asked for, eager here), as a Ray Compiled
Graph program through the drop-in, and from the command line — and every stage reads only
its own tensors from a ``save_pretrained`` checkpoint (one file or sharded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("CI"):  # CI installs ".[test]", with hf: a missing transformers is a failure there
    import transformers
else:
    transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import hf_decode  # noqa: E402
import hf_stages  # noqa: E402
import ray  # noqa: E402
import ray_hf_decode  # noqa: E402
import tinygpt  # noqa: E402
from hf_checks import assert_varied, token_rows  # noqa: E402

import cgc  # noqa: E402
import cgc.ray_compat  # noqa: E402
from cgc.plan_schema import plan_pb2 as pb  # noqa: E402

TOKENS, PROMPT, MAX_SEQ = 10, 6, 32


def _staged(spec, stages=2, microbatches=2, batch=2):
    n = spec["config"]["num_hidden_layers"]
    return [hf_stages.HFStage(spec, a, b, microbatches, batch, MAX_SEQ, "cpu")
            for a, b in tinygpt.split_layers(n, stages)]


def _decode_here(stages, ps, tokens=TOKENS):
    return tinygpt.generate(lambda m, t, p: hf_stages.run_stages(stages, t, m, p),
                            lambda r: r, ps, tokens)


@pytest.fixture(scope="module")
def llama():
    spec = hf_stages.model_spec("llama", "tiny", seed=5)
    ps = hf_stages.prompts(spec, 2, 2, PROMPT)
    return spec, ps, hf_stages.generate_reference(hf_stages.load_model(spec, "cpu"), ps, TOKENS)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_staged_tokens_equal_generate(family, attn):
    if not hasattr(transformers, hf_stages.FAMILIES[family]):
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    spec = hf_stages.model_spec(family, "tiny", attn=attn, seed=2)
    ps = hf_stages.prompts(spec, 2, 2, PROMPT)
    model = hf_stages.load_model(spec, "cpu")
    want = hf_stages.generate_reference(model, ps, TOKENS)
    got = _decode_here(_staged(spec), ps)
    assert hf_stages.first_difference(got, want) is None
    assert_varied(token_rows(got))
    # The library's static cache (the layout the stages keep) gives the same tokens too.
    static = hf_stages.generate_reference(model, ps, TOKENS, cache_implementation="static")
    assert hf_stages.first_difference(static, want) is None


@pytest.mark.parametrize("family,window", [
    ("mistral", dict(sliding_window=4)),  # every layer
    ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=2))])  # 2 of 4
def test_sliding_windows_shorter_than_the_sequence(family, window):
    if not hasattr(transformers, hf_stages.FAMILIES[family]):
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    spec = hf_stages.model_spec(family, "tiny", seed=2)
    plain = hf_stages.model_spec(family, "tiny", seed=2)
    spec["config"].update(window)
    ps = hf_stages.prompts(spec, 2, 2, PROMPT)
    want = hf_stages.generate_reference(hf_stages.load_model(spec, "cpu"), ps, TOKENS)
    stages = _staged(spec)
    assert any(w == 4 for s in stages for w in s.windows)
    assert hf_stages.first_difference(_decode_here(stages, ps), want) is None
    # The window matters here: without it, other tokens.
    unwindowed = hf_stages.generate_reference(hf_stages.load_model(plain, "cpu"), ps, TOKENS)
    assert hf_stages.first_difference(unwindowed, want) is not None


def test_uneven_split_and_one_stage(llama):
    spec, ps, want = llama
    spans = [(0, 1), (1, 4)]
    stages = [hf_stages.HFStage(spec, a, b, 2, 2, MAX_SEQ, "cpu") for a, b in spans]
    assert hf_stages.first_difference(_decode_here(stages, ps), want) is None
    assert hf_stages.first_difference(_decode_here(_staged(spec, 1), ps), want) is None


def test_a_compiled_stage_gives_the_same_tokens():
    """``compile=True``: the layers through ``torch.compile`` (fp32 on the CPU: equal here)."""
    spec = hf_stages.model_spec("llama", "tiny", seed=2)
    ps = hf_stages.prompts(spec, 1, 2, PROMPT)
    want = hf_stages.generate_reference(hf_stages.load_model(spec, "cpu"), ps, 4)
    stage = hf_stages.HFStage(spec, 0, 4, 1, 2, MAX_SEQ, "cpu", compile=True)
    assert all(type(m).__name__ == "OptimizedModule" for m in stage.layers)
    assert hf_stages.first_difference(_decode_here([stage], ps, 4), want) is None


def test_the_comparison_can_fail(llama):
    spec, ps, want = llama
    other = hf_stages.model_spec("llama", "tiny", seed=6)  # other weights, other tokens
    got = _decode_here(_staged(other), ps)
    assert hf_stages.first_difference(got, want).startswith("microbatch 0, sequence 0, token 0")
    where = hf_stages.divergence(hf_stages.load_model(spec, "cpu"), ps, got, want)
    assert (where["token"], where["want"], where["got"]) == (0, want[0][0, 0], got[0][0, 0])
    assert where["gap"] > 0 and where["rank_got"] >= 1  # generate's choice is the top logit
    assert hf_stages.divergence(hf_stages.load_model(spec, "cpu"), ps, want, want) is None


@pytest.mark.parametrize("shard", [None, "40KB"], ids=["one_file", "sharded"])
@pytest.mark.parametrize("family,tied", [("llama", False), ("qwen2", True)])
def test_checkpoint_round_trip_reads_only_each_stages_keys(tmp_path, family, tied, shard):
    spec = hf_stages.model_spec(family, "tiny", seed=4)
    spec["config"]["tie_word_embeddings"] = tied
    kwargs = {"max_shard_size": shard} if shard else {}
    hf_stages.load_model(spec, "cpu").save_pretrained(tmp_path, **kwargs)
    assert (tmp_path / "model.safetensors.index.json").exists() == bool(shard)
    ck = hf_stages.model_spec(checkpoint=str(tmp_path))
    ps = hf_stages.prompts(ck, 2, 2, PROMPT)
    # The user's way of loading it, in one process:
    model = getattr(transformers, ck["arch"]).from_pretrained(tmp_path)
    want = hf_stages.generate_reference(model, ps, TOKENS)
    stages = _staged(ck)
    assert hf_stages.first_difference(_decode_here(stages, ps), want) is None

    from safetensors import safe_open

    on_disk = set()
    for f in tmp_path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            on_disk |= set(h.keys())
    read = [set(s.loaded_keys()) for s in stages]
    assert read[0] == {k for k in on_disk if k.startswith(("model.embed_tokens.",
                                                           "model.layers.0.",
                                                           "model.layers.1."))}
    rest = {k for k in on_disk if not k.startswith(("model.embed_tokens.", "model.layers.0.",
                                                    "model.layers.1."))}
    # A tied head is the embedding: the last stage reads that key for it.
    assert read[1] == rest | ({"model.embed_tokens.weight"} if tied else set())
    assert ("lm_head.weight" in on_disk) is not tied
    # Each holds its share of the weights, measured (a tied head is a second copy of the
    # embedding on the last stage: counted in the whole as the state dict lists it twice).
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for s in stages:
        assert s.memory()["weights"] <= 1.1 * total / 2


def test_checkpoint_missing_a_key_is_refused(tmp_path):
    spec = hf_stages.model_spec("llama", "tiny")
    model = hf_stages.load_model(spec, "cpu")
    from safetensors.torch import save_file

    model.save_pretrained(tmp_path)
    state = {k: v for k, v in model.state_dict().items() if "layers.3.mlp" not in k}
    save_file(state, str(tmp_path / "model.safetensors"))
    ck = hf_stages.model_spec(checkpoint=str(tmp_path))
    hf_stages.HFStage(ck, 0, 2)  # its keys are there
    with pytest.raises(KeyError, match="model.layers.3.mlp"):
        hf_stages.HFStage(ck, 2, 4)


def test_bad_arguments_are_refused(llama):
    spec, ps, _ = llama
    with pytest.raises(ValueError, match="layers \\[2, 5\\)"):
        hf_stages.HFStage(spec, 2, 5)
    with pytest.raises(ValueError, match="attention 'flash"):
        hf_stages.model_spec("llama", attn="flash_attention_2")
    with pytest.raises(ValueError, match="model 'gpt2'"):
        hf_stages.model_spec("gpt2")
    stage = hf_stages.HFStage(spec, 0, 4, 1, 2, 8)
    with pytest.raises(ValueError, match="positions 6..8"):
        stage.forward(ps[0][:, :3], 0, 6)
    with pytest.raises(ValueError, match="microbatch 1"):
        stage.forward(ps[0], 1, 0)
    assert stage.forward(ps[0], 0, 0).shape == (2,)


# ---------------------------------------------------------------- on actors


def test_cgc_pipeline_with_cuda_graphs_asked_for_is_exact(shipped, llama):
    """Two stage actors, CUDA graphs marked (eager on the CPU: the same code path up to the
    capture)."""
    spec, ps, want = llama
    dag = hf_decode.build_dag(spec, 2, 2, 2, MAX_SEQ, "cpu", cuda_graph=True)
    plan = cgc.compile(dag, name="hf")
    assert [n.cuda_graph for n in plan.proto.graph.nodes if n.kind == pb.CALL] == [True, True]
    assert all(len(p.captured_ops) == 1 for p in plan.proto.lowered.programs)
    with plan.start(get_timeout=120) as g:
        got = tinygpt.generate(g.execute, lambda r: r.get(), ps, TOKENS)
    assert hf_stages.first_difference(got, want) is None
    assert_varied(token_rows(got))


def test_model_file_runs_its_example_inputs(shipped):
    """``examples/hf_decode.py`` as a model file (what ``cgc compile`` reads)."""
    from cgc.plan_schema.values import decode_value

    plan = cgc.compile_file(ROOT / "examples" / "hf_decode.py")
    args = [decode_value(v) for v in plan.proto.example_args]
    with plan.start(get_timeout=120) as g:
        got = g.execute(*args).get()
    mb, tokens, pos = hf_decode.example_inputs()
    spec = hf_stages.model_spec("llama", "tiny")
    want = hf_stages.run_stages(_staged(spec), tokens, mb, pos)
    assert got.tolist() == want.tolist()


def test_ray_program_through_the_drop_in(shipped, llama):
    spec, ps, want = llama
    cgc.ray_compat.install()
    try:
        actors = ray_hf_decode.make_stages(spec, 2, 2, 2, MAX_SEQ)
        compiled = ray_hf_decode.build_dag(actors).experimental_compile()
        try:
            got = tinygpt.generate(compiled.execute, ray.get, ps, TOKENS)
        finally:
            compiled.teardown()
            for a in actors:
                ray.kill(a)
    finally:
        cgc.ray_compat.uninstall()
    assert hf_stages.first_difference(got, want) is None


def test_command_line_with_a_checkpoint_prints_json_last(tmp_path, ray_address):
    spec = hf_stages.model_spec("qwen2", "tiny", seed=9)
    hf_stages.load_model(spec, "cpu").save_pretrained(tmp_path)
    ran = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hf_decode.py"), "--checkpoint",
         str(tmp_path), "--stages", "2", "--batch", "2", "--prompt-len", "5", "--tokens", "6",
         "--seed", "3", "--json"],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "RAY_ADDRESS": ray_address})
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["equal"] is True
    assert len(out["prompts"]) == len(out["tokens"]) == 4  # 2 microbatches of 2
    assert all(len(p) == 5 for p in out["prompts"]) and all(len(t) == 6 for t in out["tokens"])
    want = hf_stages.prompts(spec, 2, 2, 5, 4)  # --seed 3: prompts from seed 4
    assert out["prompts"] == [r for t in want for r in t.tolist()]
