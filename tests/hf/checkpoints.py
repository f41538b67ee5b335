"""Tiny random checkpoints written as a user would: the library's ``from_config``, weights
redrawn from a seed (the library's own init, std 0.02, makes a tiny model repeat one token),
``save_pretrained``. Nothing of cgc.hf is used to make them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
            tie_word_embeddings=False)
SLIDING = ["sliding_attention", "full_attention", "sliding_attention"]
# Per architecture: its model_type and what the tiny config sets beyond BASE, chosen so each
# extra of its forward changes the tokens (windows shorter than the decode, multipliers
# away from 1, one layer type per rotary).
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", dict(use_sliding_window=True, sliding_window=3, max_window_layers=1)),
    "qwen3": ("qwen3", dict(head_dim=16)),
    "mistral": ("mistral", dict(sliding_window=4)),
    "gemma": ("gemma", dict(head_dim=16)),
    "gemma2": ("gemma2", dict(head_dim=16, sliding_window=3, layer_types=SLIDING)),
    "gemma3_text": ("gemma3_text", dict(head_dim=16, sliding_window=3, layer_types=SLIDING)),
    "phi3": ("phi3", dict(sliding_window=4, pad_token_id=0)),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", dict(embedding_multiplier=4.0, logits_scaling=2.0,
                                residual_multiplier=0.5, attention_multiplier=0.3)),
    "cohere": ("cohere", dict(logit_scale=0.5)),
    "stablelm": ("stablelm", {}),
    "qwen2_moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=32,
                                    shared_expert_intermediate_size=64)),
}


def library_model(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    """The library's model of a tiny config, with weights redrawn from ``seed``."""
    config = transformers.AutoConfig.for_model(model_type, **{**BASE, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                scale = 1.0 if "norm" in name and name.endswith("weight") else 0.0
                p.copy_(scale + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                std = 1.0 if "embed_tokens" in name else p.shape[-1] ** -0.5
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.eval()


def write(path: Path, name: str, seed: int = 0, **save: Any) -> Path:
    """The checkpoint of ``CONFIGS[name]`` at ``path``."""
    model_type, overrides = CONFIGS[name]
    library_model(model_type, seed, **overrides).save_pretrained(path, **save)
    return path
