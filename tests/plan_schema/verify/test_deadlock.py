"""Hand-written deadlocking programs are rejected with the table and the cycle."""

from __future__ import annotations

import pytest
import shapes
from click.testing import CliRunner

from cgc.cli.check_cmd import check_cmd
from cgc.cli.main import main
from cgc.passes import LowerOptions, lower
from cgc.plan_schema import CgcError, write_plan
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import EXIT_VERIFY
from cgc.plan_schema.text import parse_program
from cgc.plan_schema.verify import DeadlockError, PlanStructureError, VerifyError, verify_plan
from cgc.plan_schema.verify.simulate import simulate


def _with_programs(plan: pb.Plan, *lines: str) -> pb.Plan:
    out = pb.Plan()
    out.CopyFrom(plan)
    for line in lines:
        prog = parse_program(line)
        i = [p.actor for p in out.lowered.programs].index(prog.actor)
        out.lowered.programs[i].CopyFrom(prog)
    return out


def test_recv_before_send_both_ways_deadlocks_with_table_and_cycle():
    plan = lower(shapes.two_way_nccl(), LowerOptions(overlap=False))
    # a waits for b's gradient before sending its own activation: a classic NCCL cycle
    bad = _with_programs(plan, "a: 2R:c1 2C 4RECV:c3←b#1 2SEND:c2→b#0 4C 4SEND:c4→b#2")
    with pytest.raises(DeadlockError) as ei:
        verify_plan(bad)
    msg = str(ei.value)
    assert ei.value.exit_code == EXIT_VERIFY
    assert "a         0     2/" in msg and "4RECV:c3←b@g0#1" in msg and "<-- stuck" in msg
    assert "b         0     0/" in msg
    assert (
        "wait-for cycle: a waits for b (RECV from b on c3), b waits for a (RECV from a on c2)"
        in msg
    )
    assert ">>4RECV:c3←b@g0#1<<" in msg
    assert sorted(ei.value.cycle) == ["a", "b"]


def test_collective_against_send_deadlocks():
    plan = lower(shapes.allreduce(), LowerOptions(overlap=False))
    plan.config.capacity = 1
    # w1 computes apply before joining the allreduce it needs: structure refuses it
    bad = _with_programs(plan, "w1: 3R:c1 3C 7C 5COLL#0 7W:c3")
    with pytest.raises(PlanStructureError, match="before"):
        verify_plan(bad)


def test_capacity_above_a_driver_rings_slots_is_refused():
    plan = lower(shapes.chain(), LowerOptions(slots=1))
    plan.config.capacity = 4  # more in flight than the driver's rings can hold
    with pytest.raises(PlanStructureError, match="driver channel c1 holds 1 values"):
        verify_plan(plan)


def test_full_rings_deadlock_driver_and_actor():
    plan = lower(shapes.chain(), LowerOptions(slots=1))
    plan.config.capacity = 4
    # stepped below the structure check (which refuses this capacity): the driver's rings
    # fill while it waits for an output
    with pytest.raises(DeadlockError) as ei:
        simulate(plan, 6, 4)
    msg = str(ei.value)
    assert "@driver" in msg and "ring of 1 full" in msg and "wait-for cycle" in msg


def test_a_prefetch_deadlocks_when_the_driver_holds_one_execution():
    # a reads execution e+1's input before it writes execution e's output: the driver
    # must have submitted e+1 before it reads e, so capacity 1 deadlocks and 2 does not
    plan = lower(shapes.chain(), LowerOptions(capacity=2))
    prefetching = _with_programs(plan, "a: [2R:c1] 2C 2W:c2 2R:c1+1 4R:c3 4C 4W:c4")
    report = verify_plan(prefetching)
    # one prefetch place (K = 1): capacity min(2, K + 2) = 2, stepped for 2 + K executions
    assert (report.executions, report.stepped_capacity) == (3, 2) and report.all_executions
    prefetching.config.capacity = 1
    with pytest.raises(DeadlockError, match="READ on c1: not written yet"):
        verify_plan(prefetching)


def test_swapped_recvs_from_two_peers_are_proven_safe():
    plan = lower(shapes.two_writer_nccl(), LowerOptions(overlap=False))
    prog = [p for p in plan.lowered.programs if p.actor == "a"][0]
    ops = list(prog.ops)
    i = next(k for k, op in enumerate(ops) if op.kind == pb.RECV)
    ops[i], ops[i + 1] = ops[i + 1], ops[i]
    del prog.ops[:]
    prog.ops.extend(ops)
    verify_plan(plan)  # NCCL matches p2p per peer: receiving from c first is fine


def test_nccl_order_mismatch_between_one_pair_is_rejected():
    plan = lower(shapes.one_f_one_b(), LowerOptions(overlap=False))
    bad = _with_programs(
        plan,
        "s0: 5R:c1 5C 6R:c2 6C 6SEND:c6→s1#1 5SEND:c5→s1#0 11RECV:c7←s1#2 "
        "11C 11W:c9 12R:c3 12C 12SEND:c10→s1#3 13RECV:c8←s1#4 13C 13W:c11 14R:c4 "
        "14C 14SEND:c12→s1#5 19RECV:c13←s1#6 19C 19W:c15 20RECV:c14←s1#7 20C 20W:c16",
    )
    with pytest.raises(VerifyError, match="NCCL order mismatch on communicator 0"):
        verify_plan(bad)


def test_structure_errors_name_the_problem():
    plan = lower(shapes.chain())
    plan.lowered.programs[1].ops.pop()  # b no longer writes its result
    with pytest.raises(PlanStructureError, match="actor b.*missing"):
        verify_plan(plan)
    plan = lower(shapes.two_way_nccl())
    for op in plan.lowered.programs[1].ops:
        if op.kind == pb.RECV:
            op.seq += 7
            break
    with pytest.raises(PlanStructureError, match="seq"):
        verify_plan(plan)


def test_cgc_check_ok_and_tampered(tmp_path, capsys):
    plan = lower(shapes.one_f_one_b())
    path = tmp_path / "p.cgplan"
    write_plan(plan, path)
    res = CliRunner().invoke(check_cmd, [str(path)])
    assert res.exit_code == 0 and res.output.startswith("ok: ") and "no deadlock" in res.output
    # a re-signed plan whose program was edited into a deadlock: exit 5 with the table
    bad = pb.Plan()
    bad.CopyFrom(plan)
    s0 = bad.lowered.programs[0]
    ops = list(s0.ops)
    first_recv = next(i for i, op in enumerate(ops) if op.kind == pb.RECV)
    ops.insert(0, ops.pop(first_recv))
    del s0.ops[:]
    s0.ops.extend(ops)
    write_plan(bad, path)
    assert main(["check", str(path)]) == EXIT_VERIFY
    err = capsys.readouterr().err
    assert "<-- stuck" in err and "wait-for" in err
    # a corrupted file: exit 4
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["check", str(path)]) == 4


def test_errors_are_cgc_errors():
    assert issubclass(DeadlockError, CgcError) and DeadlockError.exit_code == 5
