"""Pipelined LLM decode written for Ray Compiled Graph, as Ray users write it: live actors
from ``.remote()``, Ray's DAG API, ``experimental_compile()``, ``ray.get``.

    python examples/ray_llm_decode.py            # on Ray Compiled Graph
    python examples/ray_llm_decode.py --cgc      # the same program on cgc's drop-in

``--cgc`` adds exactly one line before compiling: ``cgc.ray_compat.install()``. The model
and the single-process reference are `tinygpt.py`'s, shared with `llm_decode.py`.
"""

from __future__ import annotations

import argparse
import time

import ray
import tinygpt
from ray.dag import InputNode


def make_stages(size: str = "tiny", stages: int = 2, microbatches: int = 2, batch: int = 2,
                num_gpus: float = 0.0) -> list:
    """The stage actors, one per span of layers (live handles, as Ray programs hold them)."""
    cfg = tinygpt.SIZES[size]
    opts = {"num_gpus": num_gpus} if num_gpus else {"num_cpus": 0.5}
    cls = ray.remote(**opts)(tinygpt.GPTStage)
    return [cls.remote(cfg, a, b, microbatches, batch)
            for a, b in tinygpt.split_layers(cfg["n_layers"], stages)]


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cgc", action="store_true", help="run on cgc's drop-in")
    ap.add_argument("--size", default="tiny", choices=sorted(tinygpt.SIZES))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--gpus", type=float, default=0.0)
    args = ap.parse_args()
    if args.cgc:
        import cgc.ray_compat

        cgc.ray_compat.install()
    ray.init()
    cfg = tinygpt.SIZES[args.size]
    actors = make_stages(args.size, args.stages, args.microbatches, args.batch, args.gpus)
    compiled = build_dag(actors).experimental_compile()
    ps = tinygpt.prompts(cfg, args.microbatches, args.batch, args.prompt)
    t0 = time.perf_counter()
    got = tinygpt.generate(compiled.execute, ray.get, ps, args.tokens)
    dt = time.perf_counter() - t0
    compiled.teardown()
    want = tinygpt.reference(cfg, ps, args.tokens)
    same = all((g == w).all() for g, w in zip(got, want, strict=True))
    n = args.microbatches * args.batch * args.tokens
    print(f"{'cgc' if args.cgc else 'Ray CG'}: {n} tokens in {dt:.3f} s ({n / dt:,.0f} "
          f"tokens/s); equal to the single-process reference: {same}")


if __name__ == "__main__":
    main()
