"""One stage in this process: it reads only its own tensors from a checkpoint (one file or
sharded), refuses a checkpoint missing one of them and bad arguments, runs through
``torch.compile``, and the comparison helpers can tell two decodes apart."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
from checkpoints import write  # noqa: E402
from test_architectures import decode_here  # noqa: E402

from cgc import hf  # noqa: E402

PROMPT, TOKENS, MAX_SEQ = 6, 8, 24


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = write(tmp_path_factory.mktemp("llama"), "llama", seed=5)
    spec = hf.model_spec(checkpoint=str(path))
    ps = hf.prompts(256, 2, 2, PROMPT)
    model = hf.reference_model(str(path), spec)
    return spec, ps, model, hf.generate_reference(model, ps, TOKENS)


@pytest.mark.parametrize("shard", [None, "40KB"], ids=["one_file", "sharded"])
@pytest.mark.parametrize("name,tied", [("llama", False), ("qwen2", True)])
def test_each_stage_reads_only_its_own_keys(tmp_path, name, tied, shard):
    kwargs = {"max_shard_size": shard} if shard else {}
    from checkpoints import CONFIGS, library_model

    model_type, overrides = CONFIGS[name]
    model = library_model(model_type, 4, **{**overrides, "tie_word_embeddings": tied})
    model.save_pretrained(tmp_path, **kwargs)
    assert (tmp_path / "model.safetensors.index.json").exists() == bool(shard)
    spec = hf.model_spec(checkpoint=str(tmp_path))
    ps = hf.prompts(256, 1, 2, PROMPT)
    want = hf.generate_reference(hf.reference_model(str(tmp_path), spec), ps, TOKENS)
    spans = [(0, 1), (1, 3)]
    stages = [hf.HFStage(spec, a, b, 1, 2, MAX_SEQ, "cpu") for a, b in spans]
    got = hf.generate(lambda m, t, p: hf.run_stages(stages, t, m, p), lambda r: r, ps, TOKENS,
                      *_eos(spec))
    assert hf.first_difference(got, want) is None

    from safetensors import safe_open

    on_disk = set()
    for f in tmp_path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            on_disk |= set(h.keys())
    first = ("model.embed_tokens.", "model.layers.0.")
    read = [set(s.loaded_keys()) for s in stages]
    assert read[0] == {k for k in on_disk if k.startswith(first)}
    rest = {k for k in on_disk if not k.startswith(first)}
    assert read[1] == rest | ({"model.embed_tokens.weight"} if tied else set())
    assert ("lm_head.weight" in on_disk) is not tied


def _eos(spec):
    s = hf.generation_settings(spec)
    return s.eos, s.pad


def test_a_checkpoint_missing_a_key_is_refused(tmp_path):
    from checkpoints import library_model
    from safetensors.torch import save_file

    model = library_model("llama")
    model.save_pretrained(tmp_path)
    state = {k: v for k, v in model.state_dict().items() if "layers.2.mlp" not in k}
    save_file(state, str(tmp_path / "model.safetensors"))
    spec = hf.model_spec(checkpoint=str(tmp_path))
    hf.HFStage(spec, 0, 2, device="cpu")  # its keys are there
    with pytest.raises(KeyError, match="model.layers.2.mlp"):
        hf.HFStage(spec, 2, 3, device="cpu")


def test_bad_arguments_are_refused(llama):
    spec, ps, _, _ = llama
    with pytest.raises(ValueError, match="layers \\[2, 5\\)"):
        hf.HFStage(spec, 2, 5)
    stage = hf.HFStage(spec, 0, 3, 1, 2, 8, "cpu")
    with pytest.raises(ValueError, match="positions 6..8"):
        stage.forward(ps[0][:, :3], 0, 6)
    with pytest.raises(ValueError, match="microbatch 1"):
        stage.forward(ps[0], 1, 0)
    assert stage.forward(ps[0], 0, 0).shape == (2,)


def test_a_compiled_stage_gives_the_same_tokens(llama):
    spec, ps, model, _ = llama
    want = hf.generate_reference(model, ps[:1], 4)
    stage = hf.HFStage(spec, 0, 3, 1, 2, MAX_SEQ, "cpu", compile=True)
    assert all(type(m).__name__ == "OptimizedModule" for m in stage.layers)
    got = hf.generate(lambda m, t, p: stage.forward(t, m, p), lambda r: r, ps[:1], 4,
                      *_eos(spec))
    assert hf.first_difference(got, want) is None


def test_the_comparison_can_fail(llama, tmp_path):
    spec, ps, model, want = llama
    other = hf.model_spec(checkpoint=str(write(tmp_path, "llama", seed=6)))
    got = decode_here(other, ps)
    assert hf.first_difference(got, want).startswith("microbatch 0, sequence 0, token 0")
    where = hf.divergence(model, ps, got, want)
    assert (where["token"], where["want"], where["got"]) == (0, want[0][0, 0], got[0][0, 0])
    assert where["gap"] > 0 and where["rank_got"] >= 1  # generate's choice is the top logit
    assert hf.divergence(model, ps, want, want) is None


def test_import_cgc_does_not_import_transformers():
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", "import sys, cgc; print('transformers' in "
                          "sys.modules, 'cgc.hf' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert ran.stdout.split() == ["False", "False"], ran.stderr[-2000:]
