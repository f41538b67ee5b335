"""What cgc.hf refuses, and that it refuses before reading any weight: architectures outside
the verified list, remote code, configs the library itself decodes two ways, generation
settings the stages do not apply, dtypes and attention outside the allow-lists, and weight
maps that point outside the checkpoint's folder. A ``.bin``-only checkpoint is read."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from checkpoints import library_model, write  # noqa: E402

from cgc import hf  # noqa: E402
from cgc.hf import UnsupportedModelError  # noqa: E402


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write(tmp_path_factory.mktemp("llama"), "llama")


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_an_unverified_architecture_is_refused_before_any_weight_is_read(tmp_path):
    library_model("gpt_neox", hidden_size=64, num_attention_heads=4).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UnsupportedModelError) as e:
        hf.model_spec(checkpoint=str(tmp_path))
    msg = str(e.value)
    assert "'GPTNeoXForCausalLM'" in msg and "LlamaForCausalLM" in msg
    assert "Qwen2MoeForCausalLM" in msg and "to add one" in msg


def test_remote_code_is_refused_naming_auto_map(tmp_path, llama_dir):
    for f in llama_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    _edit_config(tmp_path, auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    with pytest.raises(UnsupportedModelError, match="auto_map"):
        hf.model_spec(checkpoint=str(tmp_path))


def test_a_window_the_architecture_ignores_is_refused(tmp_path, llama_dir):
    for f in llama_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    _edit_config(tmp_path, sliding_window=3)
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM with sliding_window=3"):
        hf.model_spec(checkpoint=str(tmp_path))


def test_model_type_must_match_the_architecture(tmp_path, llama_dir):
    for f in llama_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    _edit_config(tmp_path, model_type="gpt2")
    with pytest.raises(UnsupportedModelError, match="model_type 'gpt2'"):
        hf.model_spec(checkpoint=str(tmp_path))


def test_dtype_and_attention_come_from_allow_lists(llama_dir):
    with pytest.raises(UnsupportedModelError, match="dtype 'Tensor'"):
        hf.model_spec(checkpoint=str(llama_dir), dtype="Tensor")
    with pytest.raises(UnsupportedModelError, match="attention 'flash_attention_2'"):
        hf.model_spec(checkpoint=str(llama_dir), attn="flash_attention_2")
    with pytest.raises(UnsupportedModelError, match="attention 'sdpa' for Gemma2"):
        hf.model_spec("gemma2", attn="sdpa")
    with pytest.raises(UnsupportedModelError, match="model 'gpt2'"):
        hf.model_spec("gpt2")


def test_a_shard_outside_the_folder_is_refused(tmp_path, llama_dir):
    for f in llama_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "../elsewhere/model.safetensors"}}))
    spec = hf.model_spec(checkpoint=str(tmp_path))
    with pytest.raises(UnsupportedModelError, match="outside the checkpoint's folder"):
        hf.HFStage(spec, 0, 1, device="cpu")


def test_a_checkpoint_without_weights_says_what_it_looked_for(tmp_path, llama_dir):
    (tmp_path / "config.json").write_bytes((llama_dir / "config.json").read_bytes())
    spec = hf.model_spec(checkpoint=str(tmp_path))
    with pytest.raises(UnsupportedModelError, match="pytorch_model.bin"):
        hf.HFStage(spec, 0, 1, device="cpu")


def test_a_bin_only_checkpoint_is_read_with_weights_only(tmp_path, llama_dir):
    model = library_model("llama", seed=0)
    (tmp_path / "config.json").write_bytes((llama_dir / "config.json").read_bytes())
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    spec = hf.model_spec(checkpoint=str(tmp_path))
    ps = hf.prompts(256, 1, 2, 6, seed=3)
    stages = [hf.HFStage(spec, a, b, 1, 2, 16, "cpu") for a, b in hf.split_layers(3, 2)]
    got = hf.generate(lambda m, t, p: hf.run_stages(stages, t, m, p), lambda r: r, ps, 6)
    want = hf.generate_reference(model, ps, 6, eos_token_id=None, pad_token_id=0)
    assert hf.first_difference(got, want) is None


def test_generation_settings_the_stages_do_not_apply_are_refused(tmp_path, llama_dir):
    for f in llama_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    gc = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps(
        dict(gc, repetition_penalty=1.1)))
    spec = hf.model_spec(checkpoint=str(tmp_path))
    with pytest.raises(UnsupportedModelError, match="repetition_penalty=1.1"):
        hf.generation_settings(spec)
    assert hf.generation_settings(spec, repetition_penalty=1.0).sampling is None
    with pytest.raises(UnsupportedModelError, match="num_beams=2"):
        hf.generation_settings(hf.model_spec("llama"), num_beams=2)
