"""Pass ``overlap``: communication on the comm stream, receives hoisted, re-verified.

When on, every SEND/RECV/COLL gets ``stream = COMM_STREAM`` and each RECV moves as early
in its actor's program as it safely can:

* never past another SEND/RECV/COLL of the actor (the per-communicator order, and the
  global order the scheduler placed, stay as they were);
* never before the last op of this actor that the matching SEND depends on, since the
  sender would then wait for an op stuck behind the receive. The dependencies are the
  verifier's own: happens-before clocks of one simulated execution
  (``cgc.plan_schema.verify.observers.vector_clocks``: program order, WRITE -> READ, rendezvous).

The overlapped programs are verified with the same simulator as every plan; if they fail,
the pass retries with receives that never pass a WRITE (no other actor observes what
they pass), and else keeps the scheduler's programs (comm ops still on the comm stream)
and records ``overlap = false``. ``LowerOptions.overlap``: None = on when the plan has NCCL ops between
GPU actors (where a separate stream can run a transfer under a computation), True/False
force it.

Not done, on purpose: posting the RECV for execution i+1 before execution i computes
(``exec_offset = 1``). Under the program semantics every op of a program is issued in
order by one thread, so such a prefetch makes execution i's result wait for execution
i+1's submission, which deadlocks a driver that waits for each result before submitting
the next. The runtime gets the same overlap from the hoisted receives on the comm stream.
"""

from __future__ import annotations

from cgc.ir import attrs as A
from cgc.passes.state import LowerState, require
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.verify import VerifyError, default_executions
from cgc.plan_schema.verify.observers import vector_clocks
from cgc.plan_schema.verify.simulate import simulate

__all__ = ["overlap", "hoist_recvs", "pre", "post"]

_NAME = "overlap"
_COMM = (pb.SEND, pb.RECV, pb.COLL)


def hoist_recvs(plan: pb.Plan, *, past_writes: bool = True) -> int:
    """Move every RECV of ``plan`` as early as is safe (see the module doc); return moves.

    Example: ``b: 1R:c1 1C 1W:c2 4RECV:c3←a#0 4C`` becomes ``b: 4RECV:c3←a#0~ 1R:c1 ...``
    when the SEND on ``a`` does not depend on anything ``b`` does first.
    """
    vc = vector_clocks(plan)
    progs = {p.actor: p for p in plan.lowered.programs}
    send_at: dict[tuple[int, str], tuple[str, int]] = {}
    for p in plan.lowered.programs:
        for i, op in enumerate(p.ops):
            if op.kind == pb.SEND:
                send_at[(op.channel, op.peer)] = (p.actor, i)
    # Without past_writes a RECV only passes COMPUTE and READ ops, which no other actor
    # observes within an execution: safe even when several hoists interact.
    stops = _COMM if past_writes else (*_COMM, pb.WRITE)
    moves = 0
    for actor in sorted(progs):
        prog = progs[actor]
        items = list(enumerate(prog.ops))  # (original index, op)
        for orig, op in list(items):
            if op.kind != pb.RECV:
                continue
            sender, j = send_at[(op.channel, actor)]
            bound = vc.get((sender, j - 1), {}).get(actor, -1) if j else -1
            cur = next(k for k, (o, _) in enumerate(items) if o == orig)
            k = cur
            while k > 0 and items[k - 1][0] > bound and items[k - 1][1].kind not in stops:
                k -= 1
            if k != cur:
                items.insert(k, items.pop(cur))
                moves += 1
        new_ops = [pb.Op() for _ in items]
        for dst, (_, op) in zip(new_ops, items, strict=True):
            dst.CopyFrom(op)
        del prog.ops[:]
        prog.ops.extend(new_ops)
    return moves


def _has_gpu_comm(state: LowerState) -> bool:
    """Some communicator has only GPU actors (``cgc.ir.graph.has_gpu``): its ops can run on
    a comm stream beside the compute stream."""
    gpu = state.g.graph[A.GPU_ACTORS]
    return any(all(m in gpu for m in c.members) for c in state.lowered.communicators)


def overlap(state: LowerState) -> None:
    """Put comm ops on the comm stream and hoist receives, if it helps and verifies.

    Example: ``lower(plan, LowerOptions(overlap=True)).lowered.schedule.overlap``.
    """
    plan, opt = state.plan, state.options.overlap
    on = _has_gpu_comm(state) if opt is None else opt
    state.lowered.schedule.overlap = False
    if not on:
        return
    for prog in plan.lowered.programs:
        for op in prog.ops:
            if op.kind in _COMM:
                op.stream = pb.COMM_STREAM
    streamed = pb.Lowered()
    streamed.CopyFrom(plan.lowered)
    # The vector-clock bound is exact for one hoist; several hoists can interact, so try
    # the bold variant, then the one that never passes a WRITE, then none. Hoisting only
    # moves RECVs earlier, so the structure stays valid and stepping decides (pass verify
    # checks everything afterwards).
    n = state.options.verify_executions or default_executions(plan)
    for past_writes in (True, False):
        hoist_recvs(plan, past_writes=past_writes)
        try:
            simulate(plan, n, plan.config.capacity)
        except VerifyError:
            plan.lowered.CopyFrom(streamed)
            continue
        plan.lowered.schedule.overlap = True
        return


def _comm_order(plan: pb.Plan) -> list[list[tuple[int, int, int, str]]]:
    return [
        [(op.kind, op.task, op.channel, op.peer) for op in p.ops if op.kind in _COMM]
        for p in plan.lowered.programs
    ]


def pre(state: LowerState) -> None:
    state.scratch["comm_order"] = _comm_order(state.plan)
    require(
        all(op.stream == pb.COMPUTE_STREAM for p in state.lowered.programs for op in p.ops),
        _NAME,
        "programs already overlapped",
    )


def post(state: LowerState) -> None:
    require(
        _comm_order(state.plan) == state.scratch["comm_order"],
        _NAME,
        "the order of an actor's comm ops changed",
    )
