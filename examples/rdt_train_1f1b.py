"""A 1F1B pipeline-parallel training step written as Ray code is written now: plain actor
calls in 1F1B order, activations and gradients sent with Ray Direct Transport hints.

    python examples/rdt_train_1f1b.py                 # eager Ray, RDT over gloo (CPU)
    python examples/rdt_train_1f1b.py --cgc           # the same step traced by cgc

``--cgc`` adds exactly one line: ``step = cgc.trace(step)``. The stages and the
single-process reference are `pipe_train.py`'s, shared with `train_1f1b.py`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import pipe_train
import ray
import rdt_common


def make_stages(size: str = "tiny", stages: int = 2, num_gpus: float = 0.0) -> list:
    """The stage actors (live handles)."""
    cfg = pipe_train.SIZES[size]
    cls = rdt_common.actor_class(pipe_train.TrainStage, num_gpus)
    return [cls.remote(cfg, s, stages) for s in range(stages)]


def train_step(actors: list, microbatches: int, transport: str = "gloo") -> Callable[..., Any]:
    """The step: ``(xs, ys)`` -> a list of refs, each stage's ``step()`` result."""

    def send(s: int, method: Any) -> Any:  # stage 0's backward result stays on stage 0
        return method if s == 0 else rdt_common.send(method, transport)

    def step(xs, ys):
        done: list[list] = [[] for _ in actors]
        acts, grads = {}, {}
        for s, kind, mb in pipe_train.one_f_one_b(len(actors), microbatches):
            x = xs if s == 0 else acts.get((s - 1, mb))
            if kind == "F":
                acts[s, mb] = rdt_common.send(actors[s].forward, transport).remote(x, mb)
                continue
            if kind == "FB":
                g = send(s, actors[s].forward_backward).remote(x, ys, mb)
            else:
                g = send(s, actors[s].backward).remote(grads[s + 1, mb], mb)
            grads[s, mb] = g
            done[s].append(g)
        return [a.step.remote(*d) for a, d in zip(actors, done, strict=True)]

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cgc", action="store_true", help="trace the step with cgc")
    ap.add_argument("--transport", default="gloo", choices=rdt_common.TRANSPORTS)
    ap.add_argument("--size", default="tiny", choices=sorted(pipe_train.SIZES))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gpus", type=float, default=0.0)
    args = ap.parse_args()
    ray.init()
    cfg = pipe_train.SIZES[args.size]
    actors = make_stages(args.size, args.stages, args.gpus)
    rdt_common.setup_transport(actors, args.transport)
    step = train_step(actors, cfg["microbatches"], args.transport)
    if args.cgc:
        import cgc

        step = cgc.trace(step)
    t0 = time.perf_counter()
    rows = [ray.get(step(*pipe_train.batch(cfg, k))) for k in range(args.steps)]
    dt = time.perf_counter() - t0
    want = pipe_train.reference(cfg, args.stages, args.steps)
    worst = max(abs(a - b) for r, w in zip(rows, want, strict=True)
                for a, b in zip(r, w, strict=True))
    print(f"{'cgc' if args.cgc else 'eager Ray'} ({args.transport}): {args.steps} steps in "
          f"{dt:.3f} s ({args.steps / dt:,.1f} steps/s); largest difference from the "
          f"single-process reference {worst:.2e}")


if __name__ == "__main__":
    main()
