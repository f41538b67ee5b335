"""On graphs small enough to enumerate, the simulator agrees with exhaustive search.

The search is written here from the semantics in docs/architecture.md, independently of
cgc.plan_schema.verify: it explores every interleaving of the processes (every enabled op of every
process, rendezvous moving both ends) and says whether some reachable state is stuck.
"""

from __future__ import annotations

from collections import Counter

import pytest
import shapes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from randgraphs import random_plans

from cgc.passes import LowerOptions, lower
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.verify import VerifyError
from cgc.plan_schema.verify.simulate import simulate


def _procs(plan: pb.Plan, n: int, cap: int) -> dict[str, list[tuple]]:
    procs = {}
    for p in plan.lowered.programs:
        ops = [(op, op.exec_offset) for op in p.prologue]
        for e in range(n):
            ops += [(op, e + op.exec_offset) for op in p.ops if e + op.exec_offset < n]
        procs[p.actor] = ops
    outs = list(dict.fromkeys(plan.lowered.output_channels))
    drv, read = [], 0
    for e in range(n):
        while e - read >= cap:
            drv += [(pb.Op(kind=pb.READ, channel=c), read) for c in outs]
            read += 1
        drv += [(pb.Op(kind=pb.WRITE, channel=c), e) for c in plan.lowered.input_channels]
    drv += [(pb.Op(kind=pb.READ, channel=c), e) for e in range(read, n) for c in outs]
    procs[DRIVER] = drv
    return procs


def exhaustive_deadlocks(plan: pb.Plan, n: int, cap: int) -> bool:
    """True if some interleaving reaches a state where nothing can move before the end."""
    procs = _procs(plan, n, cap)
    names = sorted(procs)
    chans = {c.id: c for c in plan.lowered.channels}
    coll = {m: c.id for c in plan.graph.collectives for m in c.nodes}
    members = {c.id: [plan.graph.nodes[m].actor for m in c.nodes] for c in plan.graph.collectives}
    start = (
        tuple(0 for _ in names),
        tuple(sorted((c, 0) for c in chans)),
        tuple(sorted(((c, r), 0) for c in chans for r in chans[c].readers)),
    )
    seen, stack = {start}, [start]
    while stack:
        pcs, wr, rd = stack.pop()
        pc, w, r = dict(zip(names, pcs, strict=True)), dict(wr), dict(rd)
        head = {a: procs[a][pc[a]] if pc[a] < len(procs[a]) else None for a in names}
        if all(h is None for h in head.values()):
            continue
        moves = []
        for a in names:
            if head[a] is None:
                continue
            op, e = head[a]
            if op.kind == pb.COMPUTE:
                moves.append(({a}, {}, {}))
            elif op.kind == pb.READ and w[op.channel] > r[(op.channel, a)]:
                moves.append(({a}, {}, {(op.channel, a): 1}))
            elif op.kind == pb.WRITE:
                low = min(r[(op.channel, x)] for x in chans[op.channel].readers)
                if w[op.channel] - low < chans[op.channel].slots:
                    moves.append(({a}, {op.channel: 1}, {}))
            elif op.kind == pb.SEND and head.get(op.peer):
                q, qe = head[op.peer]
                if (
                    q.kind == pb.RECV
                    and q.peer == a
                    and (q.channel, q.seq, qe) == (op.channel, op.seq, e)
                ):
                    moves.append(({a, op.peer}, {}, {}))
            elif op.kind == pb.COLL:
                ms = members[coll[op.task]]
                if all(
                    head[m]
                    and head[m][0].kind == pb.COLL
                    and head[m][1] == e
                    and coll.get(head[m][0].task) == coll[op.task]
                    for m in ms
                ):
                    moves.append((set(ms), {}, {}))
        if not moves:
            return True
        for moved, dw, dr in moves:
            npc = tuple(pc[a] + (a in moved) for a in names)
            nw = tuple(sorted((c, v + dw.get(c, 0)) for c, v in w.items()))
            nr = tuple(sorted((k, v + dr.get(k, 0)) for k, v in r.items()))
            state = (npc, nw, nr)
            if state not in seen:
                seen.add(state)
                stack.append(state)
    return False


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_plans(max_tasks=5, max_actors=3), st.data())
def test_simulator_agrees_with_exhaustive_search(plan, data):
    out = lower(plan, LowerOptions(overlap=False))
    out.config.capacity = data.draw(st.integers(1, 3))
    slots = data.draw(st.integers(1, 2))
    for ch in out.lowered.channels:
        ch.slots = slots
    for prog in out.lowered.programs:  # random reorderings of communication ops
        comm = [i for i, op in enumerate(prog.ops) if op.kind in (pb.SEND, pb.RECV, pb.COLL)]
        if len(comm) >= 2 and data.draw(st.booleans()):
            i, j = data.draw(st.lists(st.sampled_from(comm), min_size=2, max_size=2, unique=True))
            ops = list(prog.ops)
            ops[i], ops[j] = ops[j], ops[i]
            del prog.ops[:]
            prog.ops.extend(ops)
    n = out.config.capacity + 1
    try:
        simulate(out, n, out.config.capacity)
        sim_ok = True
    except VerifyError:
        sim_ok = False
    assert sim_ok == (not exhaustive_deadlocks(out, n, out.config.capacity))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_plans(max_tasks=5, max_actors=3), st.data())
def test_two_executions_decide_more_executions(plan, data):
    """cgc.plan_schema.verify.simulate's claim: with every driver ring holding the capacity and no
    prefetch, stepping 2 executions decides deadlock-freedom for any number of them."""
    out = lower(plan, LowerOptions(overlap=False))
    cap = out.config.capacity = data.draw(st.integers(1, 3))
    low = out.lowered
    driver = {*low.input_channels, *low.output_channels}
    for ch in low.channels:
        ch.slots = cap + data.draw(st.integers(0, 1)) if ch.id in driver else data.draw(
            st.integers(1, 2)
        )
    for prog in low.programs:  # random reorderings of communication ops
        comm = [i for i, op in enumerate(prog.ops) if op.kind in (pb.SEND, pb.RECV, pb.COLL)]
        if len(comm) >= 2 and data.draw(st.booleans()):
            i, j = data.draw(st.lists(st.sampled_from(comm), min_size=2, max_size=2, unique=True))
            ops = list(prog.ops)
            ops[i], ops[j] = ops[j], ops[i]
            del prog.ops[:]
            prog.ops.extend(ops)
    try:
        simulate(out, 2, cap)
        two_ok = True
    except VerifyError:
        two_ok = False
    assert two_ok == (not exhaustive_deadlocks(out, cap + 2, cap))


def _moves(plan: pb.Plan):
    """Every plan with one op of one program moved to another position."""
    for k, prog in enumerate(plan.lowered.programs):
        for i in range(len(prog.ops)):
            for j in range(len(prog.ops)):
                if i == j:
                    continue
                out = pb.Plan()
                out.CopyFrom(plan)
                ops = list(out.lowered.programs[k].ops)
                ops.insert(j, ops.pop(i))
                del out.lowered.programs[k].ops[:]
                out.lowered.programs[k].ops.extend(ops)
                yield out


@pytest.mark.parametrize("name", ["chain", "two_way_nccl", "two_writer_nccl", "two_communicators"])
def test_two_executions_decide_every_single_move(name):
    """Each op moved anywhere in its program, at capacity 1 and 2: the two-execution verdict
    equals an exhaustive search over capacity + 2 executions."""
    verdicts = Counter()
    for cap in (1, 2):
        plan = lower(shapes.ALL[name](), LowerOptions(overlap=False, slots=1, capacity=cap))
        plan.config.capacity = cap
        for ch in plan.lowered.channels:
            ch.slots = cap if ch.writer == DRIVER or DRIVER in ch.readers else 1
        for moved in _moves(plan):
            try:
                simulate(moved, 2, cap)
                two_ok = True
            except VerifyError:
                two_ok = False
            assert two_ok == (not exhaustive_deadlocks(moved, cap + 2, cap))
            verdicts[two_ok] += 1
    assert verdicts[True] and verdicts[False]  # both verdicts occur: the test has teeth
