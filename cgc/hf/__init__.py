"""Hugging Face ``transformers`` causal LMs as cgc pipelines (needs the ``hf`` extra).

A decoder is split into stages, each an actor that reads only its own tensors from a
``save_pretrained`` directory and keeps a static KV cache per microbatch. Only the verified
architectures (``ARCHITECTURES``) are accepted; anything else is refused before any weight
is read. See docs/hf_models.md.

    from cgc.hf import pipeline
    with pipeline("path/to/checkpoint", stages=2, batch=2) as gen:
        tokens = gen.generate(prompt_ids, new_tokens=32)
"""

from __future__ import annotations

from cgc.hf.architectures import ARCHITECTURES, ATTENTION, DTYPES, UnsupportedModelError
from cgc.hf.decode import divergence, first_difference, generate, prompts, run_stages, split_layers
from cgc.hf.graph import Pipeline, build_dag, pipeline, stage_options
from cgc.hf.reference import (
    GenerationSettings,
    generate_reference,
    generation_settings,
    reference_model,
)
from cgc.hf.sampling import Sampling
from cgc.hf.spec import FAMILIES, SIZES, ModelSpec, model_spec
from cgc.hf.stage import HFStage, load_model, skeleton

__all__ = [
    "ARCHITECTURES", "ATTENTION", "DTYPES", "FAMILIES", "SIZES", "GenerationSettings",
    "HFStage", "ModelSpec", "Pipeline", "Sampling", "UnsupportedModelError", "build_dag",
    "divergence", "first_difference", "generate", "generate_reference", "generation_settings",
    "load_model", "model_spec", "pipeline", "prompts", "reference_model", "run_stages",
    "skeleton", "split_layers", "stage_options",
]
