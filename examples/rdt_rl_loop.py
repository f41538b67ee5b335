"""An RL loop with weight sync written as Ray code is written now: plain actor calls,
samples and weights sent with Ray Direct Transport hints.

    python examples/rdt_rl_loop.py                 # eager Ray, RDT over gloo (CPU)
    python examples/rdt_rl_loop.py --cgc           # the same step traced by cgc

``--cgc`` adds exactly one line: ``step = cgc.trace(step)``. The actors and the
single-process reference are `rl_policy.py`'s, shared with `rl_loop.py`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import ray
import rdt_common
import rl_policy


def make_actors(size: str = "tiny", num_gpus: float = 0.0) -> tuple[list, Any]:
    """The rollout actors and the learner (live handles)."""
    cfg = rl_policy.SIZES[size]
    rollout = rdt_common.actor_class(rl_policy.Rollout, num_gpus)
    learner = rdt_common.actor_class(rl_policy.Learner, num_gpus)
    return [rollout.remote(cfg, r) for r in range(cfg["rollouts"])], learner.remote(cfg)


def rl_step(rollouts: list, learner: Any, transport: str = "gloo") -> Callable[..., Any]:
    """The step: ``iteration`` -> a list of refs, each rollout's mean reward."""

    def step(it):
        trajs = [rdt_common.send(r.sample, transport).remote(it) for r in rollouts]
        weights = rdt_common.send(learner.update, transport).remote(*trajs)
        return [r.load.remote(weights) for r in rollouts]

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cgc", action="store_true", help="trace the step with cgc")
    ap.add_argument("--transport", default="gloo", choices=rdt_common.TRANSPORTS)
    ap.add_argument("--size", default="tiny", choices=sorted(rl_policy.SIZES))
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--gpus", type=float, default=0.0)
    args = ap.parse_args()
    ray.init()
    cfg = rl_policy.SIZES[args.size]
    rollouts, learner = make_actors(args.size, args.gpus)
    rdt_common.setup_transport([*rollouts, learner], args.transport)
    step = rl_step(rollouts, learner, args.transport)
    if args.cgc:
        import cgc

        step = cgc.trace(step)
    t0 = time.perf_counter()
    rows = [ray.get(step(it)) for it in range(args.iterations)]
    dt = time.perf_counter() - t0
    want = rl_policy.reference(cfg, args.iterations)
    worst = max(abs(a - b) for r, w in zip(rows, want, strict=True)
                for a, b in zip(r, w, strict=True))
    print(f"{'cgc' if args.cgc else 'eager Ray'} ({args.transport}): {args.iterations} "
          f"iterations in {dt:.3f} s ({args.iterations / dt:,.1f}/s); largest difference "
          f"from the single-process reference {worst:.2e}")


if __name__ == "__main__":
    main()
