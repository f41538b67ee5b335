"""The stages honour the checkpoint's generation config as the library's ``generate`` does:
end-of-sequence (then padding, and stopping when every sequence has ended) and sampling
(temperature, top-k, top-p with a seed per sequence), equal to ``generate(do_sample=True)``
seeded alike, and reproducible."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")
from checkpoints import write  # noqa: E402
from test_architectures import decode_here  # noqa: E402

from cgc import hf  # noqa: E402

SAMPLE = dict(do_sample=True, temperature=0.8, top_k=40, top_p=0.9)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            made[name] = write(tmp_path_factory.mktemp(name), name, seed=1)
        return made[name]

    return get


def test_eos_in_the_generation_config_stops_as_generate_does(checkpoints, tmp_path):
    src = checkpoints("llama")
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    spec = hf.model_spec(checkpoint=str(tmp_path))
    ps = hf.prompts(256, 2, 2, 6, seed=3)
    free = decode_here(spec, ps, settings=hf.GenerationSettings())
    stop = int(free[0][0, 2])  # sequence 0 of microbatch 0 ends at its third token
    both = [int(free[1][0, 1]), int(free[1][1, 1])]  # microbatch 1 ends by its second
    gc = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps(
        dict(gc, eos_token_id=[stop, *both], pad_token_id=7)))
    want = hf.generate_reference(hf.reference_model(str(tmp_path), spec), ps, 8)
    got = decode_here(spec, ps)
    assert hf.first_difference(got, want) is None
    assert got[0][0, 3:].tolist() == [7] * (got[0].shape[1] - 3)
    assert got[1].shape[1] <= 2 < got[0].shape[1]


@pytest.mark.parametrize("name", ["llama", "gemma2", "granite", "cohere"])
def test_sampling_equals_the_librarys_for_the_same_generator_state(checkpoints, name):
    """One sequence per microbatch (the library draws a whole batch from one generator):
    temperature, top-k, top-p and each architecture's logit scaling or soft-capping."""
    path = checkpoints(name)
    spec = hf.model_spec(checkpoint=str(path))
    ps = hf.prompts(256, 2, 1, 6, seed=3)
    model = hf.reference_model(str(path), spec)
    want = hf.generate_reference(model, ps, 8, seed=11, **SAMPLE)
    got = decode_here(spec, ps, 8, settings=hf.generation_settings(spec, seed=11, **SAMPLE))
    assert hf.first_difference(got, want) is None
    greedy = hf.generate_reference(model, ps, 8)
    assert hf.first_difference(got, greedy) is not None  # it did sample


def test_sampling_is_reproducible_and_per_sequence(checkpoints):
    spec = hf.model_spec(checkpoint=str(checkpoints("llama")))
    ps = hf.prompts(256, 2, 2, 6, seed=3)
    settings = hf.generation_settings(spec, seed=5, **SAMPLE)
    a, b = decode_here(spec, ps, settings=settings), decode_here(spec, ps, settings=settings)
    assert hf.first_difference(a, b) is None
    other = decode_here(spec, ps, settings=hf.generation_settings(spec, seed=6, **SAMPLE))
    assert hf.first_difference(a, other) is not None
    # A sequence's tokens depend on its own seed only: alone in its batch, the same.
    seq = hf.Sampling(temperature=0.8, top_k=40, top_p=0.9, seed=5).seed_of(1, 2, 1)
    alone = decode_here(spec, [ps[1][1:]], settings=hf.generation_settings(
        spec, seed=seq, **SAMPLE))
    assert alone[0][0].tolist() == a[1][1].tolist()


def test_bad_sampling_settings_are_refused():
    with pytest.raises(ValueError, match="temperature 0"):
        hf.Sampling(temperature=0)
    with pytest.raises(ValueError, match="top_p 1.5"):
        hf.Sampling(top_p=1.5)
