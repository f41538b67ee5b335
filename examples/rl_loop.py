"""An RL loop with weight sync, in one plan: rollout actors sample with the current policy,
a learner takes a policy-gradient step on their samples, and the new weights go back to
every rollout actor, all inside one execution (one iteration). The weight sync is a
compiled transfer plan (``cgc.weight_sync``, docs/weight_sync.md): the policy's parameter
list, its buckets and digest are in the plan, and each rollout's parameters are written
in place.

``execute(iteration)`` returns each rollout's mean reward; the curve over K iterations
equals the single-process reference (`rl_policy.reference`).

    cgc compile examples/rl_loop.py -o rl.cgplan && cgc run rl.cgplan
    python examples/rl_loop.py                         # 20 iterations, checked
    python examples/rl_loop.py --size gpu --gpus 0.33
"""

from __future__ import annotations

import argparse
import time

import rl_policy

import cgc
from cgc import InputNode, MultiOutputNode

Rollout = cgc.actor(rl_policy.Rollout)
Learner = cgc.actor(rl_policy.Learner)


def build_dag(size: str = "tiny", num_gpus: float = 0.0, transport: str = "auto",
              bucket_bytes: int = 256 << 20):
    """One iteration: sample on every rollout, train, sync the weights back in place."""
    cfg = rl_policy.SIZES[size]
    opts = {"num_gpus": num_gpus} if num_gpus else {"num_cpus": 0.5}
    rollouts = [Rollout.options(**opts).bind(cfg, r) for r in range(cfg["rollouts"])]
    learner = Learner.options(**opts).bind(cfg)
    spec = cgc.WeightSpec.from_module(lambda: rl_policy.Policy(cfg))
    with InputNode() as it:
        trajs = [r.sample.bind(it).with_tensor_transport(transport) for r in rollouts]
        loss = learner.train.bind(*trajs)
        synced = cgc.weight_sync(learner, rollouts, spec, after=loss, attr="policy",
                                 bucket_bytes=bucket_bytes, transport=transport)
        return MultiOutputNode([r.report.bind(s) for r, s in zip(rollouts, synced, strict=True)])


def build_nccl_dag():
    """The tiny loop with one GPU per actor: samples and weights over NCCL (or the CPU
    communicator without GPUs)."""
    return build_dag(num_gpus=1, transport="nccl")


def example_inputs():
    return (0,)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=sorted(rl_policy.SIZES))
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--gpus", type=float, default=0.0)
    ap.add_argument("--bucket-bytes", type=int, default=256 << 20,
                    help="the weight sync's bucket size (default 256 MiB)")
    args = ap.parse_args()
    cfg = rl_policy.SIZES[args.size]
    plan = cgc.compile(build_dag(args.size, args.gpus, bucket_bytes=args.bucket_bytes),
                       name="rl_loop")
    sync = plan.proto.lowered.transfers[0]
    print(f"weight sync: {sync.total_bytes:,} bytes in {len(sync.buckets)} buckets per "
          f"rollout, digest {sync.digest.hex()[:16]}")
    with plan.start() as graph:
        t0 = time.perf_counter()
        rows = [[r.get() for r in graph.execute(it)] for it in range(args.iterations)]
        dt = time.perf_counter() - t0
    want = rl_policy.reference(cfg, args.iterations)
    worst = max(abs(a - b) for r, w in zip(rows, want, strict=True)
                for a, b in zip(r, w, strict=True))
    curve = [round(sum(r) / len(r), 4) for r in rows]
    print(f"{args.iterations} iterations in {dt:.3f} s ({args.iterations / dt:,.1f}/s); "
          f"mean reward {curve[0]} -> {curve[-1]}; largest difference from the "
          f"single-process reference {worst:.2e}")


if __name__ == "__main__":
    main()
