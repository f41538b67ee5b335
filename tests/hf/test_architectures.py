"""Every accepted architecture, token for token against the library itself: a tiny random
checkpoint written with ``save_pretrained``, the oracle ``AutoModelForCausalLM.from_pretrained``
+ ``generate`` (with the checkpoint's ``generation_config.json``), cgc.hf's stages in this
process on two uneven stages (CPU, fp32)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from checkpoints import CONFIGS, write  # noqa: E402

from cgc import hf  # noqa: E402

TOKENS, PROMPT, MAX_SEQ = 8, 6, 24


def decode_here(spec, ps, tokens=TOKENS, stages=2, settings=None, spans=None):
    settings = settings or hf.generation_settings(spec)
    batch = ps[0].shape[0]
    spans = spans or hf.split_layers(spec.num_layers, stages)
    staged = [hf.HFStage(spec, a, b, len(ps), batch, MAX_SEQ, "cpu",
                         sampling=settings.sampling) for a, b in spans]
    return hf.generate(lambda m, t, p: hf.run_stages(staged, t, m, p), lambda r: r, ps,
                       tokens, settings.eos, settings.pad)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """One checkpoint per architecture, written once for the module."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = write(tmp_path_factory.mktemp(name), name)
        return made[name]

    return get


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_staged_tokens_equal_the_librarys_generate(checkpoint, name):
    path = checkpoint(name)
    spec = hf.model_spec(checkpoint=str(path))
    ps = hf.prompts(256, 1, 2, PROMPT, seed=3)
    want = hf.generate_reference(hf.reference_model(str(path), spec), ps, TOKENS)
    got = decode_here(spec, ps, spans=[(0, 1), (1, spec.num_layers)])
    assert hf.first_difference(got, want) is None
    rows = [r for t in got for r in t.tolist()]
    assert all(len(set(r)) >= len(r) // 2 for r in rows), rows  # varied: a strong check


def test_every_accepted_architecture_is_in_the_matrix():
    tested = {mt for mt, _ in CONFIGS.values()}
    assert {a.model_type for a in hf.ARCHITECTURES.values()} == tested


def test_the_extras_change_the_tokens(checkpoint):
    """Each extra matters in its checkpoint: the same model without it decodes otherwise
    (so the matrix would see it skipped)."""
    path = checkpoint("granite")
    spec = hf.model_spec(checkpoint=str(path))
    ps = hf.prompts(256, 1, 2, PROMPT, seed=3)
    want = decode_here(spec, ps)
    plain = hf.model_spec(checkpoint=str(path), embedding_multiplier=1.0)
    assert hf.first_difference(decode_here(plain, ps), want) is not None
    path = checkpoint("gemma3_text")
    spec = hf.model_spec(checkpoint=str(path))
    want = decode_here(spec, ps)
    one_window = hf.model_spec(checkpoint=str(path), sliding_window=None,
                               layer_types=["full_attention"] * 3)
    assert hf.first_difference(decode_here(one_window, ps), want) is not None


def test_moe_per_expert_keys_are_fused_as_from_pretrained_does(checkpoint):
    path = checkpoint("qwen2_moe")
    spec = hf.model_spec(checkpoint=str(path))
    stage = hf.HFStage(spec, 0, 1, 1, 1, MAX_SEQ, "cpu")
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in stage.loaded_keys()
    model = hf.reference_model(str(path), spec)
    fused = model.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
    assert stage.layers[0].mlp.experts.gate_up_proj.equal(fused)
