"""Ray's per-task profiling records (``cgc.runtime.actor.ray_events``) exist before the
task's value can reach a reader, as in Ray: READ and COMPUTE are recorded before the write,
the WRITE record is in the list when the write runs (its end filled in after)."""

from __future__ import annotations

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.actor.ray_events import EVENTS_ATTR, record_ray_events


class Holder:
    """An actor instance's stand-in: the records land on it."""


def _plan_and_program(kinds: list[int]) -> tuple[pb.Plan, pb.Program]:
    plan = pb.Plan()
    plan.graph.nodes.add(id=0, name="a.inc#0", method="inc")
    program = pb.Program()
    for kind in kinds:
        program.ops.add(kind=kind, task=0)
    return plan, program


def _seen_by_ops(obj: Holder, n: int) -> tuple[list, list[list[str]]]:
    seen: list[list[str]] = []

    def op() -> None:
        seen.append([e.operation for e in getattr(obj, EVENTS_ATTR)])
    return [op] * n, seen


def test_a_tasks_records_are_there_when_its_write_runs(ray_cluster):
    obj = Holder()
    plan, program = _plan_and_program([pb.READ, pb.COMPUTE, pb.WRITE, pb.SEND])
    ops, seen = _seen_by_ops(obj, 4)
    wrapped = record_ray_events(ops, program, plan, obj)
    for _ in range(2):  # two executions
        for op in wrapped:
            op()
    # The write (and the send after it) saw READ, COMPUTE and WRITE already recorded.
    assert seen[2] == seen[3] == ["READ", "COMPUTE", "WRITE"]
    assert seen[6] == seen[7] == ["READ", "COMPUTE", "WRITE"] * 2
    events = getattr(obj, EVENTS_ATTR)
    assert [e.operation for e in events] == ["READ", "COMPUTE", "WRITE"] * 2
    for r, c, w in (events[:3], events[3:]):
        assert r.start_t <= r.end_t <= c.start_t <= c.end_t <= w.start_t <= w.end_t
        assert {e.method_name for e in (r, c, w)} == {"inc"} and w.bind_index == 0


def test_a_task_without_writes_is_recorded_after_its_last_op(ray_cluster):
    obj = Holder()
    plan, program = _plan_and_program([pb.READ, pb.COMPUTE])
    ops, seen = _seen_by_ops(obj, 2)
    for op in record_ray_events(ops, program, plan, obj):
        op()
    assert seen == [[], []]
    events = getattr(obj, EVENTS_ATTR)
    assert [e.operation for e in events] == ["READ", "COMPUTE", "WRITE"]
    assert events[2].start_t == events[2].end_t == events[1].end_t
