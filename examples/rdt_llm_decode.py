"""Pipelined LLM decode written as Ray code is written now: plain actor calls, one
``.remote()`` per stage, the activations sent with Ray Direct Transport (RDT) hints.

    python examples/rdt_llm_decode.py                 # eager Ray, RDT over gloo (CPU)
    python examples/rdt_llm_decode.py --cgc           # the same step traced by cgc

``--cgc`` adds exactly one line: ``step = cgc.trace(step)``. The model and the
single-process reference are `tinygpt.py`'s, shared with `llm_decode.py`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import ray
import rdt_common
import tinygpt


def make_stages(size: str = "tiny", stages: int = 2, microbatches: int = 2, batch: int = 2,
                num_gpus: float = 0.0) -> list:
    """The stage actors, one per span of layers (live handles)."""
    cfg = tinygpt.SIZES[size]
    cls = rdt_common.actor_class(tinygpt.GPTStage, num_gpus)
    return [cls.remote(cfg, a, b, microbatches, batch)
            for a, b in tinygpt.split_layers(cfg["n_layers"], stages)]


def decode_step(actors: list, transport: str = "gloo") -> Callable[..., Any]:
    """The step: ``(mb, tokens, pos)`` -> a ref of the next tokens, through every stage."""

    def step(mb, x, pos):
        for i, actor in enumerate(actors):
            last = i == len(actors) - 1
            fwd = actor.forward if last else rdt_common.send(actor.forward, transport)
            x = fwd.remote(x, mb, pos)
        return x

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cgc", action="store_true", help="trace the step with cgc")
    ap.add_argument("--transport", default="gloo", choices=rdt_common.TRANSPORTS)
    ap.add_argument("--size", default="tiny", choices=sorted(tinygpt.SIZES))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--gpus", type=float, default=0.0)
    args = ap.parse_args()
    ray.init()
    cfg = tinygpt.SIZES[args.size]
    actors = make_stages(args.size, args.stages, args.microbatches, args.batch, args.gpus)
    rdt_common.setup_transport(actors, args.transport)
    step = decode_step(actors, args.transport)
    if args.cgc:
        import cgc

        step = cgc.trace(step)
    ps = tinygpt.prompts(cfg, args.microbatches, args.batch, args.prompt)
    t0 = time.perf_counter()
    got = tinygpt.generate(step, ray.get, ps, args.tokens)
    dt = time.perf_counter() - t0
    want = tinygpt.reference(cfg, ps, args.tokens)
    same = all((g == w).all() for g, w in zip(got, want, strict=True))
    n = args.microbatches * args.batch * args.tokens
    print(f"{'cgc' if args.cgc else 'eager Ray'} ({args.transport}): {n} tokens in {dt:.3f} s "
          f"({n / dt:,.0f} tokens/s); equal to the single-process reference: {same}")


if __name__ == "__main__":
    main()
