"""The cgc graph of stage actors and the public way in: a checkpoint directory (or a config
and a seed) to a started, pipelined generator, stage actors each loading only their own weights.

    from cgc.hf import pipeline
    with pipeline("path/to/checkpoint", stages=2, batch=2) as gen:
        tokens = gen.generate(prompt_ids, new_tokens=32)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import cgc
from cgc import InputNode
from cgc.hf.architectures import UnsupportedModelError
from cgc.hf.decode import generate, split_layers
from cgc.hf.reference import GenerationSettings, generation_settings
from cgc.hf.sampling import Sampling
from cgc.hf.spec import ModelSpec, model_spec
from cgc.hf.stage import HFStage

Stage = cgc.actor(HFStage)


def stage_options(device: str, stages: int, num_gpus: float = 0.0,
                  cuda_graph: bool = False) -> dict[str, Any]:
    """Ray options of one stage actor: a share of the GPU with ``device="cuda"``.

    Example:

    >>> stage_options("cuda", 2)
    {'num_gpus': 0.45}
    """
    opts: dict[str, Any] = {"num_cpus": 0.5}
    if device == "cuda":
        opts = {"num_gpus": num_gpus or round(0.9 / stages, 2)}
    if cuda_graph:
        opts["cuda_graph"] = True
    return opts


def build_dag(spec: ModelSpec, stages: int = 2, microbatches: int = 2, batch: int = 2,
              max_seq: int = 64, device: str = "cpu", num_gpus: float = 0.0,
              cuda_graph: bool = False, transport: str = "auto", compile: bool = False,
              sampling: Sampling | None = None) -> Any:
    """``(mb, tokens, pos) -> next tokens`` through ``stages`` stage actors of ``spec``.

    Example: ``cgc.compile(build_dag(model_spec("llama")), name="hf")``.

    Raises:
        ValueError: more stages than layers, or sampling with CUDA graphs (a replayed step
            cannot reseed its generators).
    """
    if sampling is not None and cuda_graph:
        raise ValueError("sampling with cuda_graph: a replayed step cannot reseed its "
                         "generators; sample eagerly")
    opts = stage_options(device, stages, num_gpus, cuda_graph)
    plain = None if sampling is None else dataclasses.asdict(sampling)
    actors = [Stage.options(**opts).bind(spec.plain(), a, b, microbatches, batch, max_seq,
                                         device, compile, plain)
              for a, b in split_layers(spec.num_layers, stages)]
    with InputNode() as inp:
        mb, x, pos = inp[0], inp[1], inp[2]
        for i, actor in enumerate(actors):
            x = actor.forward.bind(x, mb, pos)
            if i < len(actors) - 1:
                x = x.with_tensor_transport(transport)
        return x.with_tensor_transport(device="cpu")


class Pipeline:
    """A started pipeline of stage actors and the settings its decode honours.

    Example: ``with pipeline(DIR) as gen: gen.generate(ids, 16)``.
    """

    def __init__(self, graph: Any, spec: ModelSpec, settings: GenerationSettings,
                 microbatches: int, batch: int) -> None:
        self.graph, self.spec, self.settings = graph, spec, settings
        self.microbatches, self.batch = microbatches, batch
        self.seconds = 0.0

    def generate(self, prompt_list: Sequence[torch.Tensor] | torch.Tensor, new_tokens: int,
                 on_token: Callable[[int, int], None] | None = None) -> list[torch.Tensor]:
        """Decode ``prompt_list`` (one ``(batch, length)`` tensor of ids per microbatch, or
        one tensor for one microbatch): one ``(batch, n <= new_tokens)`` tensor each.

        Raises:
            ValueError: more microbatches or another batch than the pipeline was built for.
        """
        ps: list[torch.Tensor] = ([prompt_list] if isinstance(prompt_list, torch.Tensor)
                                  else list(prompt_list))
        if len(ps) > self.microbatches or any(p.shape[0] != self.batch for p in ps):
            raise ValueError(f"{len(ps)} microbatches of batch {[p.shape[0] for p in ps]}: "
                             f"the pipeline holds {self.microbatches} of batch {self.batch}")
        t0 = time.perf_counter()
        out = generate(self.graph.execute, lambda ref: ref.get(), ps, new_tokens,
                       self.settings.eos, self.settings.pad, on_token)
        self.seconds = time.perf_counter() - t0
        return out

    def close(self) -> None:
        """Stop the actors."""
        self.graph.__exit__(None, None, None)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pipeline(checkpoint: str | None = None, *, spec: ModelSpec | None = None,
             stages: int = 2, microbatches: int = 1, batch: int = 1, max_seq: int = 256,
             device: str = "cpu", dtype: str = "float32", attn: str | None = None,
             cuda_graph: bool = False, compile: bool = False, seed: int = 0,
             get_timeout: float = 300, **generation: Any) -> Pipeline:
    """A started pipeline decoding ``checkpoint`` (a ``save_pretrained`` directory) or
    ``spec``, as the library's ``generate`` would with the model's generation config
    (``generation`` overrides its fields: ``do_sample``, ``temperature``, ``top_k``,
    ``top_p``, ``eos_token_id``...). ``seed`` seeds sampling per sequence.

    Example: ``pipeline(DIR, stages=2, batch=2, device="cuda", cuda_graph=True)``.

    Raises:
        UnsupportedModelError: the model or its generation config is refused (see
            ``model_spec`` and ``generation_settings``), before any weight is read.
        ValueError: neither or both of ``checkpoint`` and ``spec``.
    """
    if (checkpoint is None) == (spec is None):
        raise ValueError("give a checkpoint directory or a spec (model_spec(...)), not both")
    spec = spec or model_spec(checkpoint=checkpoint, dtype=dtype, attn=attn)
    settings = generation_settings(spec, seed=seed, **generation)
    if settings.sampling is not None and cuda_graph:
        raise UnsupportedModelError("the generation config samples (do_sample): sampling "
                                    "runs eagerly, without cuda_graph")
    dag = build_dag(spec, stages, microbatches, batch, max_seq, device,
                    cuda_graph=cuda_graph, compile=compile, sampling=settings.sampling)
    graph = cgc.compile(dag, name="hf").start(get_timeout=get_timeout)
    return Pipeline(graph.__enter__(), spec, settings, microbatches, batch)
