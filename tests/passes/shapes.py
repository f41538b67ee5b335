"""Graph shapes the compiler must handle (shared by tests and the golden dumps)."""

from __future__ import annotations

from builders import GraphBuilder

from cgc.plan_schema import plan_pb2 as pb


def chain() -> pb.Plan:
    """inp -> a.f -> b.g -> a.h, returning (a.h, b.g): host channels, a local edge."""
    b = GraphBuilder()
    b.actor("a")
    b.actor("b")
    x = b.input(0)
    y = b.call("a", "f", x)
    z = b.call("b", "g", y, "k")
    w = b.call("a", "h", z, y)
    b.output(w, z)
    return b.plan("chain")


def two_writer_nccl() -> pb.Plan:
    """a sends to b and c over NCCL; a.f takes NCCL inputs from both (Ray asserts here)."""
    b = GraphBuilder()
    for n in ("a", "b", "c"):
        b.actor(n, gpus=1)
    x = b.input(0)
    y = b.call("a", "src", x, hint=pb.NCCL)
    u = b.call("b", "f", y, hint=pb.NCCL)
    v = b.call("c", "g", y, hint=pb.NCCL)
    w = b.call("a", "join", u, v)
    b.output(w)
    return b.plan("two_writer_nccl")


def two_way_nccl() -> pb.Plan:
    """NCCL edges both ways between a and b, twice."""
    b = GraphBuilder()
    b.actor("a", gpus=1)
    b.actor("b", gpus=1)
    x = b.input(0)
    y = b.call("a", "f", x, hint=pb.NCCL)
    z = b.call("b", "g", y, hint=pb.NCCL)
    w = b.call("a", "h", z, hint=pb.NCCL)
    v = b.call("b", "k", w)
    b.output(v)
    return b.plan("two_way_nccl")


def one_f_one_b(stages: int = 2, micro: int = 4) -> pb.Plan:
    """1F1B pipeline: forwards over NCCL to the next stage, gradients back over NCCL.

    Calls are bound in the 1F1B order of each stage (warm-up forwards, then one forward
    and one backward alternating, then the cool-down backwards).
    """
    b = GraphBuilder()
    names = [f"s{i}" for i in range(stages)]
    for n in names:
        b.actor(n, gpus=1)
    xs = [b.input(m) for m in range(micro)]
    orders = []
    for s in range(stages):
        warm = min(stages - s - 1, micro)
        seq = [("F", m) for m in range(warm)]
        f, bw = warm, 0
        while bw < micro:
            if f < micro:
                seq.append(("F", f))
                f += 1
            seq.append(("B", bw))
            bw += 1
        orders.append(seq)
    fwd: dict[tuple[int, int], int] = {}
    bwd: dict[tuple[int, int], int] = {}
    outs: list[int] = []
    pos = [0] * stages
    while any(pos[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while pos[s] < len(orders[s]):
                kind, m = orders[s][pos[s]]
                if kind == "F":
                    src = xs[m] if s == 0 else fwd.get((s - 1, m))
                    if src is None:
                        break
                    last = s == stages - 1
                    fwd[(s, m)] = b.call(names[s], "fwd", src, hint=None if last else pb.NCCL)
                else:
                    src = fwd[(s, m)] if s == stages - 1 else bwd.get((s + 1, m))
                    if src is None:
                        break
                    bwd[(s, m)] = b.call(names[s], "bwd", src, hint=pb.NCCL if s else None)
                    if s == 0:
                        outs.append(bwd[(s, m)])
                pos[s] += 1
                progressed = True
        assert progressed
    b.output(*outs)
    return b.plan(f"1f1b_{stages}x{micro}")


def allreduce() -> pb.Plan:
    """Two GPU workers compute, allreduce, and return both results."""
    b = GraphBuilder()
    b.actor("w0", gpus=1)
    b.actor("w1", gpus=1)
    x = b.input(0)
    g0 = b.call("w0", "grad", x)
    g1 = b.call("w1", "grad", x)
    r0, r1 = b.allreduce([g0, g1])
    o0 = b.call("w0", "apply", r0)
    o1 = b.call("w1", "apply", r1)
    b.output(o0, o1)
    return b.plan("allreduce")


def whole_input() -> pb.Plan:
    """a takes the whole input and inp[0] (taken out of it); b takes inp[1] alone."""
    b = GraphBuilder()
    b.actor("a")
    b.actor("b")
    x = b.whole()
    i0, i1 = b.input(0), b.input(1)
    f = b.call("a", "f", x)
    g = b.call("a", "g", i0, f)
    h = b.call("b", "h", i1)
    b.output(g, h)
    return b.plan("whole_input")


def two_communicators() -> pb.Plan:
    """An NCCL edge w0 -> w1 and an allreduce ranked (w1, w0): two communicators."""
    b = GraphBuilder()
    b.actor("w0", gpus=1)
    b.actor("w1", gpus=1)
    x = b.input(0)
    f = b.call("w0", "f", x, hint=pb.NCCL)
    g = b.call("w1", "g", f)
    h = b.call("w0", "h", x)
    r1, r0 = b.allreduce([g, h])
    b.output(r1, r0)
    return b.plan("two_communicators")


ALL = {
    "chain": chain,
    "two_writer_nccl": two_writer_nccl,
    "two_way_nccl": two_way_nccl,
    "1f1b_2x4": one_f_one_b,
    "allreduce": allreduce,
    "whole_input": whole_input,
    "two_communicators": two_communicators,
}
