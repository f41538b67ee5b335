"""The generation settings a checkpoint ships (``generation_config.json``) as the stages
honour them, and the independent oracle: the library's own ``from_pretrained`` +
``generate`` on the same directory, sharing nothing with the stages but the files."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import transformers

from cgc.hf.architectures import UnsupportedModelError, dtype_of
from cgc.hf.sampling import Sampling
from cgc.hf.spec import ModelSpec, build_config

# Fields of a GenerationConfig the stages honour (eos/pad, sampling) or that do not change
# the tokens of a decode from ids (lengths are the caller's, caches are the stages' own).
_HONOURED = {"eos_token_id", "pad_token_id", "bos_token_id", "do_sample", "temperature",
             "top_k", "top_p", "max_length", "max_new_tokens", "use_cache",
             "cache_implementation", "transformers_version", "return_dict_in_generate",
             "output_scores", "output_logits", "output_attentions", "output_hidden_states",
             "num_return_sequences", "_from_model_config"}
# Values of other fields that leave the tokens as they are (the field is off).
_NEUTRAL = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "num_beams": 1,
            "num_beam_groups": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
            "min_length": 0, "min_new_tokens": 0, "typical_p": 1.0, "diversity_penalty": 0.0,
            "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "renormalize_logits": False}


@dataclass(frozen=True)
class GenerationSettings:
    """What a decode honours of the model's generation config: the end-of-sequence ids,
    the pad id put after them, and sampling (None: greedy).

    Example: ``generation_settings(spec).eos``.
    """

    eos: tuple[int, ...] = ()
    pad: int | None = None
    sampling: Sampling | None = None


def library_generation_config(spec: ModelSpec) -> Any:
    """The ``GenerationConfig`` the library's ``generate`` starts from for ``spec``: the
    checkpoint's ``generation_config.json`` if it has one, else one from the model config."""
    if spec.checkpoint is not None:
        try:
            return transformers.GenerationConfig.from_pretrained(spec.checkpoint)
        except OSError:
            pass
    return transformers.GenerationConfig.from_model_config(build_config(spec))


def _ids(value: Any) -> tuple[int, ...]:
    """An id or a list of ids as a tuple."""
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list | tuple) else [value]))


def generation_settings(spec: ModelSpec, seed: int = 0, **options: Any) -> GenerationSettings:
    """The model's generation config (``options`` override its fields, as ``generate``'s
    keyword arguments do) as the stages honour it; ``seed`` seeds sampling.

    Example: ``generation_settings(model_spec(checkpoint=DIR), do_sample=True, seed=3)``.

    Raises:
        UnsupportedModelError: the config asks for something the stages do not do
            (e.g. ``repetition_penalty``, beams), naming the field.
    """
    gc = copy.deepcopy(library_generation_config(spec))
    for k, v in options.items():
        setattr(gc, k, v)
    default = transformers.GenerationConfig()
    for k, v in gc.to_diff_dict().items():
        if k in _HONOURED or v is None or v is False or v == getattr(default, k, None):
            continue
        if k not in _NEUTRAL or v != _NEUTRAL[k]:
            raise UnsupportedModelError(
                f"generation config field {k}={v!r}: cgc.hf stages do not apply it (they "
                f"honour end-of-sequence, pad and sampling: temperature, top_k, top_p); pass "
                f"{k}={_NEUTRAL.get(k)!r} to turn it off, knowing the tokens then differ "
                f"from the library's generate with the model's config")
    eos = _ids(gc.eos_token_id)
    pad = _ids(gc.pad_token_id)
    sampling = None
    if gc.do_sample:
        sampling = Sampling(temperature=1.0 if gc.temperature is None else gc.temperature,
                            top_k=gc.top_k, top_p=1.0 if gc.top_p is None else gc.top_p,
                            seed=seed)
    return GenerationSettings(eos=eos, pad=pad[0] if pad else (eos[0] if eos else None),
                              sampling=sampling)


def reference_model(checkpoint: str, spec: ModelSpec, device: str = "cpu") -> Any:
    """``AutoModelForCausalLM.from_pretrained(checkpoint)`` in ``spec``'s dtype and attention
    implementation: the oracle, loaded as the library loads it.

    Example: ``reference_model(DIR, model_spec(checkpoint=DIR))``.

    Raises:
        UnsupportedModelError: an unknown dtype.
    """
    auto: Any = transformers.AutoModelForCausalLM
    model = auto.from_pretrained(checkpoint, dtype=dtype_of(spec.dtype),
                                 attn_implementation=spec.attn)
    return model.to(device).eval()


def generate_reference(model: Any, prompt_list: Sequence[torch.Tensor], new_tokens: int,
                       seed: int | None = None, **options: Any) -> list[torch.Tensor]:
    """``model.generate`` per microbatch with the model's own generation config (``options``
    override it), ``max_new_tokens=new_tokens``: its new tokens, on the CPU. ``seed``:
    ``torch.manual_seed(seed + first row)`` before each call (sampling, one row per call).

    Example: ``generate_reference(reference_model(DIR, spec), prompts, 16)``.

    Raises:
        ValueError: a seed with more than one sequence per microbatch (the library draws
            every row from one generator).
    """
    dev = next(model.parameters()).device
    out = []
    with torch.inference_mode():
        for m, p in enumerate(prompt_list):
            if seed is not None:
                if p.shape[0] != 1:
                    raise ValueError("a seeded reference needs one sequence per microbatch")
                torch.manual_seed(seed + m)
            ids = p.to(dev)
            got = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=new_tokens, **options)
            out.append(got[:, p.shape[1]:].cpu())
    return out
