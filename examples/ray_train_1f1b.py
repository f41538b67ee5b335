"""A 1F1B pipeline-parallel training step written for Ray Compiled Graph, as Ray users write
it: live stage actors from ``.remote()``, the step's calls bound in 1F1B order, tensors
between stages, ``experimental_compile()``.

    python examples/ray_train_1f1b.py            # on Ray Compiled Graph
    python examples/ray_train_1f1b.py --cgc      # the same program on cgc's drop-in

The stages and the single-process reference are `pipe_train.py`'s, shared with
`train_1f1b.py`.
"""

from __future__ import annotations

import argparse
import time

import pipe_train
import ray
from ray.dag import InputNode, MultiOutputNode


def make_stages(size: str = "tiny", stages: int = 2, num_gpus: float = 0.0) -> list:
    """The stage actors (live handles)."""
    cfg = pipe_train.SIZES[size]
    opts = {"num_gpus": num_gpus} if num_gpus else {"num_cpus": 0.5}
    cls = ray.remote(**opts)(pipe_train.TrainStage)
    return [cls.remote(cfg, s, stages) for s in range(stages)]


def build_dag(actors: list, microbatches: int, transport: str = "auto"):
    """One training step: ``execute(xs, ys)`` -> each stage's ``step()`` result."""
    hint = (lambda n: n) if transport == "shm" else \
        (lambda n: n.with_tensor_transport(transport))
    done: list[list] = [[] for _ in actors]
    with InputNode() as inp:
        xs, ys = inp[0], inp[1]
        acts, grads = {}, {}
        for s, kind, mb in pipe_train.one_f_one_b(len(actors), microbatches):
            if kind == "F":
                x = xs if s == 0 else acts[s - 1, mb]
                acts[s, mb] = hint(actors[s].forward.bind(x, mb))
                continue
            if kind == "FB":
                x = xs if s == 0 else acts[s - 1, mb]
                g = actors[s].forward_backward.bind(x, ys, mb)
            else:
                g = actors[s].backward.bind(grads[s + 1, mb], mb)
            grads[s, mb] = g if s == 0 else hint(g)
            done[s].append(g)
        return MultiOutputNode([a.step.bind(*d) for a, d in zip(actors, done, strict=True)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cgc", action="store_true", help="run on cgc's drop-in")
    ap.add_argument("--size", default="tiny", choices=sorted(pipe_train.SIZES))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gpus", type=float, default=0.0)
    args = ap.parse_args()
    if args.cgc:
        import cgc.ray_compat

        cgc.ray_compat.install()
    ray.init()
    cfg = pipe_train.SIZES[args.size]
    actors = make_stages(args.size, args.stages, args.gpus)
    compiled = build_dag(actors, cfg["microbatches"]).experimental_compile()
    t0 = time.perf_counter()
    rows = [ray.get(compiled.execute(*pipe_train.batch(cfg, k))) for k in range(args.steps)]
    dt = time.perf_counter() - t0
    compiled.teardown()
    want = pipe_train.reference(cfg, args.stages, args.steps)
    worst = max(abs(a - b) for r, w in zip(rows, want, strict=True)
                for a, b in zip(r, w, strict=True))
    print(f"{'cgc' if args.cgc else 'Ray CG'}: {args.steps} steps in {dt:.3f} s "
          f"({args.steps / dt:,.1f} steps/s); largest difference from the single-process "
          f"reference {worst:.2e}")


if __name__ == "__main__":
    main()
