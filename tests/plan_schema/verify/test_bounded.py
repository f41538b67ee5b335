"""Bounded verification (issue 20): the deadlock check needs few executions whatever the
capacity, and the structure check and the simulator do work linear in the plan's size.

The first half checks the argument in ``plan_schema/verify/simulate.py`` against the criterion it
rests on, computed here independently: the plan as a marked graph, a deadlock iff some
cycle of places holds no more than 0 tokens (Bellman-Ford), on random plans with random
prefetch ops, capacities and ring sizes, and against long simulations at the plan's own
capacity. The second half counts work (Python bytecodes executed, ops stepped) on the
audit's plan shapes at two sizes: no wall-clock anywhere.
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace

import dos_plans
import pytest
import shapes
from randgraphs import random_plans

from cgc.passes import LowerOptions, lower
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS
from cgc.plan_schema.verify import PlanLimitError, VerifyError, check_structure, verify_plan
from cgc.plan_schema.verify.simulate import bounded_run, prefetch_depth, simulate

# ---------------------------------------------------------------- the cycle criterion


def _transitions(plan: pb.Plan) -> tuple[dict, list[tuple[object, object, int]]]:
    """The plan as a marked graph: transitions and places ``(s, t, m)``, "firing j of t
    needs firing j - m of s", one firing per execution (written from the program
    semantics in docs/architecture.md, not from cgc.plan_schema.verify)."""
    low, g = plan.lowered, plan.graph
    cap = plan.config.capacity
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    def union(a, b):
        parent[find(a)] = find(b)

    # rendezvous: a SEND and its RECV, the members of one collective, are one transition
    sends, recvs, colls = {}, {}, {}
    for p in low.programs:
        for i, op in enumerate(p.ops):
            if op.kind == pb.SEND:
                sends[(op.channel, op.peer, op.seq)] = (p.actor, i)
            elif op.kind == pb.RECV:
                recvs[(op.channel, p.actor, op.seq)] = (p.actor, i)
            elif op.kind == pb.COLL:
                colls.setdefault(g.nodes[op.task].collective, []).append((p.actor, i))
    for key, s in sends.items():
        union(s, recvs[key])
    for members in colls.values():
        for m in members[1:]:
            union(members[0], m)
    places = []
    # program order; the driver's loop is its writes then its reads, which serve the
    # execution capacity - 1 before (offset 1 - capacity)
    seqs = [(p.actor, [(i, op.exec_offset) for i, op in enumerate(p.ops)])
            for p in low.programs]
    ins = list(low.input_channels)
    outs = list(dict.fromkeys(low.output_channels))
    seqs.append((DRIVER, [(("w", c), 0) for c in ins] + [(("r", c), 1 - cap) for c in outs]))
    for proc, ops in seqs:
        for k, (i, off) in enumerate(ops):
            j, off2 = ops[(k + 1) % len(ops)]
            m = off2 - off + (1 if k + 1 == len(ops) else 0)
            places.append((find((proc, i)), find((proc, j)), m))
    # data and ring space of host channels
    for ch in low.channels:
        if ch.kind != pb.CHAN_HOST:
            continue
        if ch.writer == DRIVER:
            w = find((DRIVER, ("w", ch.id)))
        else:
            prog = next(p for p in low.programs if p.actor == ch.writer)
            w = find((ch.writer, next(i for i, op in enumerate(prog.ops)
                                      if op.kind == pb.WRITE and op.channel == ch.id)))
        for r in ch.readers:
            if r == DRIVER:
                rd = find((DRIVER, ("r", ch.id)))
            else:
                prog = next(p for p in low.programs if p.actor == r)
                rd = find((r, next(i for i, op in enumerate(prog.ops)
                                   if op.kind == pb.READ and op.channel == ch.id)))
            places.append((w, rd, 0))
            places.append((rd, w, ch.slots))
    return parent, places


def cycle_criterion_deadlocks(plan: pb.Plan) -> bool:
    """True iff some cycle of places holds <= 0 tokens (then some firing never happens)."""
    _, places = _transitions(plan)
    nodes = sorted({x for s, t, _ in places for x in (s, t)}, key=repr)
    big = len(nodes) + 1
    # a cycle of <= V places sums to <= 0 iff it sums to < 0 with weights m * big - 1
    dist = dict.fromkeys(nodes, 0)
    edges = [(s, t, m * big - 1) for s, t, m in places]
    for _ in range(len(nodes)):
        changed = False
        for s, t, w in edges:
            if dist[s] + w < dist[t]:
                dist[t] = dist[s] + w
                changed = True
        if not changed:
            return False
    return True


def _with_prefetch(plan: pb.Plan, rnd: random.Random, p: float) -> pb.Plan:
    """Some ops moved to serve the next execution (receives mostly), prologue to match."""
    out = pb.Plan()
    out.CopyFrom(plan)
    for prog in out.lowered.programs:
        for op in prog.ops:
            if op.kind in (pb.READ, pb.RECV) and rnd.random() < p:
                op.exec_offset = 1
            elif rnd.random() < p / 6:
                op.exec_offset = 1
        del prog.prologue[:]
        for op in prog.ops:
            if op.exec_offset:
                prog.prologue.add().CopyFrom(op)
                prog.prologue[-1].exec_offset = 0
    return out


def _verdict(fn) -> bool:
    try:
        fn()
        return True
    except VerifyError:
        return False


def _random_cases(n: int, seed: int):
    """(plan, what) pairs that pass the structure check: random graphs, prefetch ops,
    capacities and ring sizes."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    found = []

    @settings(max_examples=n, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(random_plans(max_tasks=8, max_actors=4), st.integers(0, 2**32))
    def collect(plan, s):
        rnd = random.Random(s ^ seed)
        out = lower(plan, LowerOptions(overlap=False))
        cap = out.config.capacity = rnd.randint(1, 6)
        low = out.lowered
        driver = {*low.input_channels, *low.output_channels}
        for ch in low.channels:
            if ch.kind == pb.CHAN_HOST:
                ch.slots = cap + rnd.randint(0, 2) if ch.id in driver else rnd.randint(1, 3)
        pre = _with_prefetch(out, rnd, rnd.choice([0.0, 0.2, 0.5, 0.9]))
        try:
            check_structure(pre)
        except VerifyError:
            return
        found.append(pre)

    collect()
    return found


@pytest.fixture(scope="module")
def prefetch_plans() -> list[pb.Plan]:
    return _random_cases(400, 20261202)


def test_bounded_run_decides_like_the_cycle_criterion(prefetch_plans):
    """verify_plan's few executions (at a capacity and ring sizes cut to K + 2) say what the
    marked graph says at the plan's own capacity, deadlocks included."""
    verdicts = {True: 0, False: 0}
    with_prefetch = 0
    for plan in prefetch_plans:
        ok = _verdict(lambda plan=plan: verify_plan(plan))
        assert ok == (not cycle_criterion_deadlocks(plan)), (
            f"K={prefetch_depth(plan)} capacity={plan.config.capacity} {bounded_run(plan)}")
        verdicts[ok] += 1
        with_prefetch += prefetch_depth(plan) > 0
    # the test has teeth: both verdicts, and many plans with prefetch places
    assert verdicts[True] > 20 and verdicts[False] > 20 and with_prefetch > 40, verdicts


def test_bounded_run_agrees_with_long_runs_at_the_plans_capacity(prefetch_plans):
    """The plain simulator at the plan's own capacity and ring sizes, stepped for many more
    executions than the argument needs, reaches the same verdict."""
    for plan in prefetch_plans[:150]:
        cap, k = plan.config.capacity, prefetch_depth(plan)
        long_ok = _verdict(lambda plan=plan, n=cap + 2 * k + 6, c=cap: simulate(plan, n, c))
        assert _verdict(lambda plan=plan: verify_plan(plan)) == long_ok


def test_executions_do_not_grow_with_the_capacity():
    for cap in (2, 64, 1024):
        plan = dos_plans.prefetch_capacity(nodes=50, capacity=cap)
        run = bounded_run(plan)
        assert prefetch_depth(plan) == 1
        assert (run.executions, run.capacity) == (min(cap, 3) + 1, min(cap, 3))
    # a plan the compiler wrote: 2 executions at its own capacity
    plan = lower(shapes.chain(), LowerOptions(capacity=8))
    assert (bounded_run(plan).executions, bounded_run(plan).capacity) == (2, 8)


def test_a_prefetch_deadlock_far_from_execution_0_is_still_found():
    """The audit's prefetch plan, changed to need 2 executions in flight, at capacity 1
    (structure allows it with one slot): a deadlock stepping finds at once."""
    plan = dos_plans.prefetch_capacity(nodes=20, capacity=2)
    plan.config.capacity = 1
    with pytest.raises(VerifyError, match="deadlock"):
        verify_plan(plan)


# ---------------------------------------------------------------- linear work


def _bytecodes(fn, *args, **kwargs) -> int:
    """Python bytecodes executed by ``fn(*args, **kwargs)``: a deterministic measure of
    work (what C code does inside one bytecode, such as a protobuf field read, is not
    counted)."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "opcode":
            count += 1
        return local

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return local

    sys.settrace(tracer)
    try:
        fn(*args, **kwargs)
    finally:
        sys.settrace(None)
    return count


ROOMY = replace(LIMITS, keyword_fields=1 << 20)
SIZES = {
    # generator -> (arguments at size 1, the argument that doubles)
    "actors_channels": ({"actors": 64, "channels": 600}, "channels"),
    "actors_channels_actors": ({"actors": 300, "channels": 600}, "actors"),
    "prefetch_capacity": ({"nodes": 400, "capacity": 1024}, "nodes"),
    "keyword_inputs": ({"fields": 300}, "fields"),
    "wide_collective": ({"members": 150}, "members"),
}


def _make(name: str, kw: dict) -> pb.Plan:
    fn = dos_plans.GENERATORS[name.removesuffix("_actors")][0]
    return fn(**kw)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_verification_work_is_linear_in_the_plan(name):
    """Doubling the audit's plan shapes doubles the verifier's work (structure check plus
    simulation, counted in bytecodes), and the simulator's op steps."""
    kw, grow = SIZES[name]
    big = {**kw, grow: kw[grow] * 2}
    small_plan, big_plan = _make(name, kw), _make(name, big)
    size = big_plan.ByteSize() / small_plan.ByteSize()
    work = [_bytecodes(verify_plan, p, None, limits=ROOMY) for p in (small_plan, big_plan)]
    steps = [verify_plan(p, limits=ROOMY).ops_stepped for p in (small_plan, big_plan)]
    assert work[1] / work[0] < 1.15 * size, (work, size)
    assert steps[1] / steps[0] < 1.15 * size, (steps, size)


def test_capacity_does_not_change_the_work():
    small, big = (dos_plans.prefetch_capacity(nodes=300, capacity=c) for c in (3, 1024))
    assert verify_plan(small).ops_stepped == verify_plan(big).ops_stepped


def test_a_plan_that_needs_more_steps_than_the_budget_is_refused(prefetch_plans):
    """Past 4 executions' worth and past Limits.verify_steps, the check fails closed."""
    many = [p for p in prefetch_plans if bounded_run(p).executions > 4]
    assert many
    tight = replace(LIMITS, verify_steps=10)
    for plan in many[:5]:
        with pytest.raises(PlanLimitError, match="Limits.verify_steps"):
            verify_plan(plan, limits=tight)
    one = dos_plans.prefetch_capacity(nodes=40, capacity=64)  # K = 1: 4 executions at most
    assert verify_plan(one, limits=tight).executions == 4
