"""The architectures ``cgc.hf`` accepts, and what each one's forward does beyond
"embed -> decoder layers -> norm -> head" (the part a stage must repeat outside the library's
decoder layers).

Only the classes in ``ARCHITECTURES`` are built: each is verified token for token against the
library's ``from_pretrained`` + ``generate`` by ``tests/hf/test_architectures.py``. A class
is looked up in ``transformers`` by the name held here, never by a name read from a config.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16,
                                  "bfloat16": torch.bfloat16}
ATTENTION = ("sdpa", "eager")  # the implementations whose mask a stage builds


@dataclass(frozen=True)
class Architecture:
    """One accepted ``transformers`` causal LM and its extras.

    ``windows``: which layers get a sliding window, as the library's model applies it:
    ``"never"`` (a ``sliding_window`` in the config is ignored), ``"always"`` (every layer,
    when the config sets one), ``"layer_types"`` (layers whose ``layer_types`` entry is
    ``"sliding_attention"``). ``embedding_multiplier``, ``logit_divisor``,
    ``logit_multiplier``, ``logit_softcap``: the config attribute the model's forward scales
    the embeddings / logits by (None: it does not). ``rotary_per_layer_type``: one rotary
    call per layer type (Gemma3). ``experts``: the checkpoint's per-expert keys are fused as
    ``from_pretrained`` fuses them (Qwen2-MoE). ``attention``: the implementations the
    library allows for it (the first is the default).
    """

    cls: str
    model_type: str
    windows: str = "never"
    embedding_multiplier: str | None = None
    logit_divisor: str | None = None
    logit_multiplier: str | None = None
    logit_softcap: str | None = None
    rotary_per_layer_type: bool = False
    experts: bool = False
    attention: tuple[str, ...] = ATTENTION


_LIST = [
    Architecture("LlamaForCausalLM", "llama"),
    Architecture("MistralForCausalLM", "mistral", windows="always"),
    Architecture("Qwen2ForCausalLM", "qwen2", windows="layer_types"),
    Architecture("Qwen3ForCausalLM", "qwen3", windows="layer_types"),
    Architecture("GemmaForCausalLM", "gemma"),
    # The library refuses SDPA for Gemma2 (no soft-capping of attention logits there).
    Architecture("Gemma2ForCausalLM", "gemma2", windows="layer_types",
                 logit_softcap="final_logit_softcapping", attention=("eager",)),
    Architecture("Gemma3ForCausalLM", "gemma3_text", windows="layer_types",
                 logit_softcap="final_logit_softcapping", rotary_per_layer_type=True),
    Architecture("Phi3ForCausalLM", "phi3", windows="always"),
    Architecture("Olmo2ForCausalLM", "olmo2"),
    Architecture("GraniteForCausalLM", "granite", embedding_multiplier="embedding_multiplier",
                 logit_divisor="logits_scaling"),
    Architecture("CohereForCausalLM", "cohere", logit_multiplier="logit_scale"),
    Architecture("StableLmForCausalLM", "stablelm"),
    Architecture("Qwen2MoeForCausalLM", "qwen2_moe", windows="layer_types", experts=True),
]
ARCHITECTURES: dict[str, Architecture] = {a.cls: a for a in _LIST}

HOW_TO_ADD = ("to add one: give it an entry in cgc/hf/architectures.py (what its forward does "
              "outside the decoder layers) and a checkpoint in tests/hf/test_architectures.py "
              "that shows it token-exact against from_pretrained + generate")


class UnsupportedModelError(ValueError):
    """A checkpoint or config ``cgc.hf`` refuses (before any weight is read)."""


def architecture(name: str) -> Architecture:
    """The accepted architecture called ``name`` (a ``config.json``'s ``architectures[0]``).

    Example:

    >>> architecture("LlamaForCausalLM").model_type
    'llama'

    Raises:
        UnsupportedModelError: ``name`` is not verified here (the message lists those that
            are, and how to add one).
    """
    if name not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {name!r} is not verified by cgc.hf (verified: "
            f"{', '.join(sorted(ARCHITECTURES))}); {HOW_TO_ADD}")
    return ARCHITECTURES[name]


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (from ``DTYPES`` only).

    Example:

    >>> dtype_of("bfloat16")
    torch.bfloat16

    Raises:
        UnsupportedModelError: another name.
    """
    if name not in DTYPES:
        raise UnsupportedModelError(f"dtype {name!r}: choose from {sorted(DTYPES)}")
    return DTYPES[name]


def window_of(arch: Architecture, config: object, index: int) -> int | None:
    """The sliding window of layer ``index`` as the library's model applies it, or None.

    Example: ``window_of(architecture("LlamaForCausalLM"), config, 0) is None``.
    """
    window = getattr(config, "sliding_window", None)
    if arch.windows == "never" or window is None:
        return None
    if arch.windows == "always":
        return int(window)
    types = getattr(config, "layer_types", None) or []
    return int(window) if types[index] == "sliding_attention" else None
