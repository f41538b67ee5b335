"""Compile-time benchmark: a generated graph of 1000 calls on 8 actors, lowered + verified.

Usage: ``python tools/bench/bench_compile.py [--calls 1000] [--actors 8] [--repeat 3]``.
Prints the best wall time of ``cgc.passes.lower`` (which ends by running the verifier)
and, separately, of ``cgc.plan_schema.verify.verify_plan`` alone. Target: well under 2 s.

``--write-ray-model FILE`` writes the same shape of graph as a model file in Ray's API
(``ray_model_source``) instead, for timing a whole ``cgc compile FILE`` process
(``tools/bench/compare.py`` does, on two commits side by side).
"""

from __future__ import annotations

import argparse
import random
import time

from cgc.passes import lower
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.verify import verify_plan


def make_graph(calls: int, actors: int, seed: int = 0) -> pb.Plan:
    """Layers of calls round-robin over GPU actors; each takes 1-2 earlier values.

    About a third of the values travel over NCCL, the rest through host memory; every
    tenth layer ends in an allreduce over all actors.
    """
    rnd = random.Random(seed)
    g = pb.Graph(num_positional=1)
    names = [f"w{i}" for i in range(actors)]
    for n in names:
        a = g.actors.add(name=n)
        a.cls.module, a.cls.qualname = "bench", "Worker"
        a.options.num_gpus = 1
    g.nodes.add(id=0, kind=pb.INPUT, name="input")
    g.nodes.add(id=1, kind=pb.INPUT_ATTR, key_kind=pb.INDEX, index=0, name="input[0]")
    bind = dict.fromkeys(names, 0)
    last = {n: 1 for n in names}
    recent: list[int] = [1]
    made, layer = 0, 0
    while made < calls:
        layer += 1
        for n in names:
            if made >= calls:
                break
            nid = len(g.nodes)
            node = g.nodes.add(
                id=nid,
                kind=pb.CALL,
                actor=n,
                method="step",
                name=f"{n}.step#{bind[n]}",
                bind_index=bind[n],
                num_returns=1,
            )
            bind[n] += 1
            srcs = {last[n], rnd.choice(recent[-2 * actors :])}
            for s in sorted(srcs):
                node.args.add().ref.node = s
            if rnd.random() < 0.33:
                node.hints.add(output_index=0).hint.transport = pb.NCCL
            last[n] = nid
            recent.append(nid)
            made += 1
        if layer % 10 == 0:
            c = g.collectives.add(id=len(g.collectives), kind=pb.ALLREDUCE)
            for n in names:
                nid = len(g.nodes)
                node = g.nodes.add(
                    id=nid,
                    kind=pb.COLLECTIVE,
                    actor=n,
                    method="allreduce",
                    name=f"{n}.allreduce#{bind[n]}",
                    bind_index=bind[n],
                    collective=c.id,
                )
                bind[n] += 1
                node.args.add().ref.node = last[n]
                c.nodes.append(nid)
                last[n] = nid
    out = g.nodes.add(id=len(g.nodes), kind=pb.OUTPUT, name="output", multi_output=True)
    for n in names:
        out.args.add().ref.node = last[n]
    # NCCL hints must not reach the driver: drop them on the returned values
    for n in names:
        del g.nodes[last[n]].hints[:]
    return pb.Plan(name="bench", graph=g)


_RAY_MODEL = '''"""A generated model file in Ray's API: {calls} calls on {actors} actors, each call
taking its actor's previous value and one recent value (tools/bench/bench_compile.py)."""

import random

import ray
from ray.dag import InputNode, MultiOutputNode


@ray.remote(num_cpus=0.1)
class Worker:
    def step(self, *xs):
        return xs[0]


def build_dag(calls={calls}, actors={actors}, seed={seed}):
    rnd = random.Random(seed)
    workers = [Worker.bind() for _ in range(actors)]
    with InputNode() as inp:
        last = [inp] * actors
        recent = [inp]
        for made in range(calls):
            i = made % actors
            other = rnd.choice(recent[-2 * actors :])
            args = [last[i]] if other is last[i] else [last[i], other]
            last[i] = workers[i].step.bind(*args)
            recent.append(last[i])
        return MultiOutputNode(last)
'''


def ray_model_source(calls: int = 1000, actors: int = 8, seed: int = 0) -> str:
    """The text of a model file in Ray's API shaped as ``make_graph``'s graph (layers of
    calls round-robin over CPU actors, each taking 1-2 earlier values; no collectives).

    >>> "def build_dag(calls=10," in ray_model_source(calls=10)
    True

    Raises:
        Nothing.
    """
    return _RAY_MODEL.format(calls=calls, actors=actors, seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--actors", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write-ray-model", metavar="FILE",
                    help="write the graph as a model file in Ray's API to FILE and exit")
    args = ap.parse_args()
    if args.write_ray_model:
        with open(args.write_ray_model, "w") as f:
            f.write(ray_model_source(args.calls, args.actors))
        return
    best, best_v = float("inf"), float("inf")
    for _ in range(args.repeat):
        plan = make_graph(args.calls, args.actors)
        t0 = time.perf_counter()
        lower(plan)
        best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        verify_plan(plan)
        best_v = min(best_v, time.perf_counter() - t0)
    low = plan.lowered
    ops = sum(len(p.ops) for p in low.programs)
    print(
        f"lower+verify: {best:.3f} s for {args.calls} calls on {args.actors} actors "
        f"({len(plan.graph.nodes)} nodes, {len(low.channels)} channels, {ops} ops, "
        f"capacity {plan.config.capacity}, overlap {low.schedule.overlap}); "
        f"verify alone: {best_v:.3f} s"
    )


if __name__ == "__main__":
    main()
