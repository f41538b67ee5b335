"""A pipeline-parallel training step (1F1B): an MLP split into stages, each an actor with its
layers and optimizer; per execution every microbatch goes forward (activations over tensor
edges) and backward (gradients over tensor edges), then each stage takes an optimizer step.

cgc's scheduler orders each stage's forwards and backwards (one forward, one backward in
the steady state, as 1F1B does) and overlaps the stages; `cgc viz --schedule` shows it.
Losses after K steps equal the single-process reference (`pipe_train.reference`).

    cgc compile examples/train_1f1b.py -o train.cgplan && cgc viz train.cgplan --schedule
    python examples/train_1f1b.py                       # 5 steps, checked
    python examples/train_1f1b.py --size gpu --gpus 0.5 --steps 20
"""

from __future__ import annotations

import argparse
import time

import pipe_train

import cgc
from cgc import InputNode, MultiOutputNode

Stage = cgc.actor(pipe_train.TrainStage)


def build_dag(size: str = "tiny", stages: int = 2, num_gpus: float = 0.0,
              transport: str = "auto"):
    """One training step: ``execute(xs, ys)`` -> each stage's ``step()`` result."""
    cfg = pipe_train.SIZES[size]
    opts = {"num_gpus": num_gpus} if num_gpus else {"num_cpus": 0.5}
    actors = [Stage.options(**opts).bind(cfg, s, stages) for s in range(stages)]
    done: list[list] = [[] for _ in actors]
    with InputNode() as inp:
        xs, ys = inp[0], inp[1]
        acts: dict = {}  # (stage, mb) -> its forward's activations
        grads: dict = {}  # (stage, mb) -> the gradient of its input
        for s, kind, mb in pipe_train.one_f_one_b(stages, cfg["microbatches"]):
            actor = actors[s]
            if kind == "F":
                x = xs if s == 0 else acts[s - 1, mb]
                acts[s, mb] = actor.forward.bind(x, mb).with_tensor_transport(transport)
                continue
            if kind == "FB":
                x = xs if s == 0 else acts[s - 1, mb]
                g = actor.forward_backward.bind(x, ys, mb)
            else:
                g = actor.backward.bind(grads[s + 1, mb], mb)
            grads[s, mb] = g if s == 0 else g.with_tensor_transport(transport)
            done[s].append(g)
        return MultiOutputNode([a.step.bind(*d) for a, d in zip(actors, done, strict=True)])


def build_nccl_dag():
    """The tiny pipeline with one GPU per stage: tensors over NCCL (or the CPU
    communicator without GPUs)."""
    return build_dag(num_gpus=1, transport="nccl")


def example_inputs():
    """Step 0's microbatches."""
    return pipe_train.batch(pipe_train.SIZES["tiny"], 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=sorted(pipe_train.SIZES))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gpus", type=float, default=0.0)
    args = ap.parse_args()
    cfg = pipe_train.SIZES[args.size]
    dag = build_dag(args.size, args.stages, args.gpus)
    with cgc.compile(dag, name="train_1f1b").start() as graph:
        t0 = time.perf_counter()
        rows = [[r.get() for r in graph.execute(*pipe_train.batch(cfg, k))]
                for k in range(args.steps)]
        dt = time.perf_counter() - t0
    want = pipe_train.reference(cfg, args.stages, args.steps)
    worst = max(abs(a - b) for r, w in zip(rows, want, strict=True)
                for a, b in zip(r, w, strict=True))
    print(f"{args.steps} steps in {dt:.3f} s ({args.steps / dt:,.1f} steps/s); losses "
          f"{[round(r[-1], 6) for r in rows]}; largest difference from the single-process "
          f"reference {worst:.2e}")


if __name__ == "__main__":
    main()
