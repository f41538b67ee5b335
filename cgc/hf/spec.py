"""The model a pipeline runs, as plain frozen data (it travels to each stage actor): the
architecture, the config, where the weights come from, the dtype and the attention
implementation. Everything a checkpoint says is checked here, before any weight is read."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import transformers

from cgc.hf.architectures import (
    ARCHITECTURES,
    ATTENTION,
    Architecture,
    UnsupportedModelError,
    architecture,
    dtype_of,
)

# Configs by family for runs without a checkpoint (weights drawn from a seed).
FAMILIES = {a.model_type: a.cls for a in ARCHITECTURES.values()}
SIZES: dict[str, dict[str, Any]] = {
    # CI on two CPU cores: GQA (4 heads, 2 KV heads), 4 layers so 2 stages hold 2 each.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 max_position_embeddings=512, tie_word_embeddings=False),
    # Llama-3.2-1B's shape (its RoPE scaling left out: default RoPE, as for Qwen2).
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
               max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True),
}


@dataclass(frozen=True)
class ModelSpec:
    """What a stage builds: ``arch`` (an accepted class name), the config (kept as JSON
    text so the spec is immutable and its bytes deterministic), ``checkpoint`` (a
    ``save_pretrained`` directory, or None: weights drawn from ``seed``), ``dtype`` and
    ``attn``. Made by ``model_spec``, which checks each field.

    Example: ``model_spec("qwen2").arch == "Qwen2ForCausalLM"``.
    """

    arch: str
    config_json: str
    checkpoint: str | None
    dtype: str
    attn: str
    seed: int

    def plain(self) -> dict[str, Any]:
        """The spec as plain data (what a plan stores as a stage's constructor argument)."""
        return dict(arch=self.arch, config_json=self.config_json, checkpoint=self.checkpoint,
                    dtype=self.dtype, attn=self.attn, seed=self.seed)

    @classmethod
    def of(cls, spec: ModelSpec | dict[str, Any]) -> ModelSpec:
        """``spec``, or the spec ``plain()`` gave, its fields checked against the allow-lists.

        Raises:
            UnsupportedModelError: an architecture, dtype or attention outside them.
        """
        if isinstance(spec, ModelSpec):
            return spec
        out = cls(**spec)
        dtype_of(out.dtype)
        if out.attn not in out.architecture.attention:
            raise UnsupportedModelError(f"attention {out.attn!r} for {out.arch}")
        return out

    @property
    def config(self) -> dict[str, Any]:
        """A fresh copy of the config as a dict."""
        return dict(json.loads(self.config_json))

    @property
    def architecture(self) -> Architecture:
        """Its entry in the allow-list."""
        return architecture(self.arch)

    @property
    def num_layers(self) -> int:
        """The number of decoder layers."""
        return int(build_config(self).num_hidden_layers)


def _read_config(checkpoint: str) -> dict[str, Any]:
    path = os.path.join(checkpoint, "config.json")
    if not os.path.isfile(path):
        raise UnsupportedModelError(f"{checkpoint}: no config.json (not a save_pretrained "
                                    f"directory)")
    with open(path) as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise UnsupportedModelError(f"{path}: not a JSON object")
    return cfg


def model_spec(family: str | None = None, size: str = "tiny", checkpoint: str | None = None,
               dtype: str = "float32", attn: str | None = None, seed: int = 0,
               **overrides: Any) -> ModelSpec:
    """The model a pipeline runs: from ``checkpoint`` (a ``save_pretrained`` directory), or
    ``family`` (a ``model_type`` of an accepted architecture) and ``size`` with weights drawn
    from ``seed``. ``overrides`` replace config entries. ``attn`` defaults to the
    architecture's first allowed implementation.

    Example:

    >>> model_spec("llama", "tiny", num_hidden_layers=2).num_layers
    2

    Raises:
        UnsupportedModelError: an architecture outside the verified list, a config with
            ``auto_map`` (remote code), a ``model_type`` that is not the architecture's, a
            sliding window on an architecture without one, an unknown family, size, dtype or attention implementation.
    """
    dtype_of(dtype)
    if checkpoint is not None:
        cfg = _read_config(checkpoint)
        if "auto_map" in cfg:
            raise UnsupportedModelError(
                f"{checkpoint}: config.json has 'auto_map' (the model's own remote code, "
                f"{sorted(cfg['auto_map'])}); cgc.hf runs only the library's verified classes "
                f"and never replaces remote code by one of them")
        names = cfg.get("architectures") or []
        if len(names) != 1 or not isinstance(names[0], str):
            raise UnsupportedModelError(f"{checkpoint}: config.json 'architectures' is "
                                        f"{names!r}, expected one class name")
        arch = architecture(names[0])
        checkpoint = os.path.realpath(checkpoint)
    else:
        if family not in FAMILIES or size not in SIZES:
            raise UnsupportedModelError(f"model {family!r} size {size!r}: choose from "
                                        f"{sorted(FAMILIES)} and {sorted(SIZES)}")
        arch = architecture(FAMILIES[family])
        cfg = dict(SIZES[size], model_type=arch.model_type, architectures=[arch.cls])
    if cfg.get("model_type") != arch.model_type:
        raise UnsupportedModelError(f"model_type {cfg.get('model_type')!r} with architecture "
                                    f"{arch.cls} (expected {arch.model_type!r})")
    cfg.update(overrides)
    if arch.windows == "never":
        for key in ("sliding_window", "attention_chunk_size"):
            if cfg.get(key) is not None:
                raise UnsupportedModelError(
                    f"{arch.cls} with {key}={cfg[key]!r}: its forward ignores it but the "
                    f"library's generate cuts its cache to it, so the two disagree; remove "
                    f"{key!r} from config.json")
    attn = attn or arch.attention[0]
    if attn not in ATTENTION or attn not in arch.attention:
        raise UnsupportedModelError(f"attention {attn!r} for {arch.cls}: choose from "
                                    f"{[a for a in arch.attention if a in ATTENTION]}")
    return ModelSpec(arch=arch.cls, config_json=json.dumps(cfg, sort_keys=True),
                     checkpoint=checkpoint, dtype=dtype, attn=attn, seed=seed)


def build_config(spec: ModelSpec) -> Any:
    """The library's config object for ``spec``, with its attention implementation set.

    Example:

    >>> build_config(model_spec("llama")).num_hidden_layers
    4

    Raises:
        UnsupportedModelError: the library rejects the config.
    """
    cfg = spec.config
    try:
        config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    except (ValueError, TypeError, KeyError) as e:
        raise UnsupportedModelError(f"{spec.arch}: the library rejects its config: {e}") from e
    config._attn_implementation = spec.attn
    return config


def model_class(spec: ModelSpec) -> Any:
    """The library's class for ``spec`` (looked up by the allow-list's name)."""
    return getattr(transformers, spec.architecture.cls)
