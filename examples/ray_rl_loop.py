"""An RL loop with weight sync written for Ray Compiled Graph, as Ray users write it: live
rollout and learner actors from ``.remote()``, samples and weights as tensor edges,
``experimental_compile()``, ``ray.get``.

    python examples/ray_rl_loop.py            # on Ray Compiled Graph
    python examples/ray_rl_loop.py --cgc      # the same program on cgc's drop-in

The actors and the single-process reference are `rl_policy.py`'s, shared with
`rl_loop.py`.
"""

from __future__ import annotations

import argparse
import time

import ray
import rl_policy
from ray.dag import InputNode, MultiOutputNode


def make_actors(size: str = "tiny", num_gpus: float = 0.0) -> tuple[list, object]:
    """The rollout actors and the learner (live handles)."""
    cfg = rl_policy.SIZES[size]
    opts = {"num_gpus": num_gpus} if num_gpus else {"num_cpus": 0.5}
    rollouts = [ray.remote(**opts)(rl_policy.Rollout).remote(cfg, r)
                for r in range(cfg["rollouts"])]
    return rollouts, ray.remote(**opts)(rl_policy.Learner).remote(cfg)


def build_dag(rollouts: list, learner, transport: str = "auto"):
    """One iteration: iteration -> each rollout's mean reward."""
    hint = (lambda n: n) if transport == "shm" else \
        (lambda n: n.with_tensor_transport(transport))
    with InputNode() as it:
        trajs = [hint(r.sample.bind(it)) for r in rollouts]
        weights = hint(learner.update.bind(*trajs))
        return MultiOutputNode([r.load.bind(weights) for r in rollouts])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cgc", action="store_true", help="run on cgc's drop-in")
    ap.add_argument("--size", default="tiny", choices=sorted(rl_policy.SIZES))
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--gpus", type=float, default=0.0)
    args = ap.parse_args()
    if args.cgc:
        import cgc.ray_compat

        cgc.ray_compat.install()
    ray.init()
    cfg = rl_policy.SIZES[args.size]
    rollouts, learner = make_actors(args.size, args.gpus)
    compiled = build_dag(rollouts, learner).experimental_compile()
    t0 = time.perf_counter()
    rows = [ray.get(compiled.execute(it)) for it in range(args.iterations)]
    dt = time.perf_counter() - t0
    compiled.teardown()
    want = rl_policy.reference(cfg, args.iterations)
    worst = max(abs(a - b) for r, w in zip(rows, want, strict=True)
                for a, b in zip(r, w, strict=True))
    print(f"{'cgc' if args.cgc else 'Ray CG'}: {args.iterations} iterations in {dt:.3f} s "
          f"({args.iterations / dt:,.1f}/s); largest difference from the single-process "
          f"reference {worst:.2e}")


if __name__ == "__main__":
    main()
