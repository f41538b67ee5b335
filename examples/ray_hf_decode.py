"""Pipelined decode of a Hugging Face model written for Ray Compiled Graph, as Ray users
write it: live actors from ``.remote()``, Ray's DAG API, ``experimental_compile()``.

    python examples/ray_hf_decode.py --model llama --stages 2        # Ray Compiled Graph
    python examples/ray_hf_decode.py --model llama --stages 2 --cgc  # cgc's drop-in

``--cgc`` adds exactly one line before compiling: ``cgc.ray_compat.install()``. The stages
are ``cgc.hf.HFStage``; the command line and the check against the library's
``from_pretrained`` + ``generate`` are ``hf_decode.py``'s (without ``--cuda-graph``: Ray's
graphs do not capture).
"""

from __future__ import annotations

import time

import hf_decode
import ray
from ray.dag import InputNode

from cgc import hf


def make_stages(spec: hf.ModelSpec, stages: int = 2, microbatches: int = 2, batch: int = 2,
                max_seq: int = 64, device: str = "cpu", num_gpus: float = 0.0,
                rdt: bool = False, sampling: hf.Sampling | None = None) -> list:
    """The stage actors, one per span of layers (live handles, as Ray programs hold them);
    ``rdt``: their calls may send by Ray Direct Transport (``rdt_hf_decode.py``)."""
    opts = hf.stage_options(device, stages, num_gpus)
    if rdt:
        opts["enable_tensor_transport"] = True
    cls = ray.remote(**opts)(hf.HFStage)
    return [cls.remote(spec, a, b, microbatches, batch, max_seq, device, False, sampling)
            for a, b in hf.split_layers(spec.num_layers, stages)]


def build_dag(actors: list, transport: str = "auto"):
    """mb, tokens, pos -> next tokens, through every stage."""
    with InputNode() as inp:
        mb, x, pos = inp[0], inp[1], inp[2]
        for i, actor in enumerate(actors):
            x = actor.forward.bind(x, mb, pos)
            if i < len(actors) - 1 and transport != "shm":
                x = x.with_tensor_transport(transport)
        return x


def main() -> None:
    args = hf_decode.parse_args(doc=__doc__)
    if args.cgc:
        import cgc.ray_compat

        cgc.ray_compat.install()
    ray.init()
    spec = hf_decode.spec_of(args)
    settings = hf.generation_settings(spec, seed=args.seed,
                                      **hf_decode.generation_options(args))
    actors = make_stages(spec, args.stages, args.microbatches, args.batch,
                         args.prompt_len + args.tokens, args.device, args.gpus,
                         sampling=settings.sampling)
    compiled = build_dag(actors).experimental_compile()
    ps = hf_decode.prompts_of(args, spec)
    t0 = time.perf_counter()
    got = hf.generate(compiled.execute, ray.get, ps, args.tokens, settings.eos, settings.pad)
    dt = time.perf_counter() - t0
    compiled.teardown()
    if not hf_decode.report(args, spec, ps, got, dt, "cgc drop-in" if args.cgc else "Ray CG"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
