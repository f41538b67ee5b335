"""Recording what ran: per-op time slices in every actor and the driver, written as Chrome
trace-event JSON that Perfetto (ui.perfetto.dev) and chrome://tracing open.

Recording is off unless ``start(trace=PATH)`` / ``cgc run --trace PATH`` asks for it; off,
the loops run the very same compiled ops as always (no wrapper, no check per op). On, each
op is wrapped once at set-up to append ``(op index, execution, t0, t1)`` to a bounded
buffer. Clocks: ``time.monotonic_ns()`` is one system-wide clock on a node; for actors on
other nodes the driver estimates the offset at set-up (round trip / 2).

Layout of the file: one process per actor (its name and class), with one track for ops on
the compute stream and one for ops on the comm stream; the driver is a process of its own
(submits and output reads). Each slice is named by the op's token and task
(``3C w1.fwd#0``) and carries the execution index; a flow arrow joins every WRITE/SEND to
the READ/RECV of the same channel and execution.

Example::

    with plan.start(trace="run.json") as graph:
        graph.execute(1).get()
    # teardown wrote run.json: open it in https://ui.perfetto.dev
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op

__all__ = ["Recorder", "traced", "write_chrome_trace", "MAX_EVENTS"]

MAX_EVENTS = 1_000_000  # per process: a long run keeps its most recent events


class Recorder:
    """A bounded buffer of ``(op index, execution, t0_ns, t1_ns)`` tuples."""

    def __init__(self, limit: int = MAX_EVENTS) -> None:
        self.events: collections.deque[tuple[int, int, int, int]] = collections.deque(
            maxlen=limit)

    def snapshot(self) -> list[tuple[int, int, int, int]]:
        """A copy of the events so far (safe while the loop keeps recording)."""
        return list(self.events)


def traced(op: Callable[[], None], index: int, exec_of: Callable[[], int],
           rec: Recorder) -> Callable[[], None]:
    """``op`` wrapped to record its slice; ``exec_of()`` gives the execution it serves."""
    append, now = rec.events.append, time.monotonic_ns

    def run() -> None:
        t0 = now()
        op()  # an op that raises (teardown woke it) did not run: no slice
        append((index, exec_of(), t0, now()))
    return run


def _op_name(op: pb.Op, plan: pb.Plan) -> str:
    node = plan.graph.nodes[op.task] if op.task < len(plan.graph.nodes) else None
    return f"{format_op(op)} {node.name}" if node is not None else format_op(op)


def write_chrome_trace(path: str | os.PathLike[str], plan: pb.Plan,
                       actors: Iterable[dict[str, Any]],
                       driver: Iterable[tuple[str, int, int, int]]) -> int:
    """Write the trace file; return the number of slices written.

    ``actors``: per actor ``{"actor", "pid", "offset_ns", "prologue": [...events],
    "events": [...]}`` (events as ``Recorder`` keeps them; ``offset_ns`` added to the
    actor's clock gives the driver's). ``driver``: ``(what, execution, t0, t1)`` with what
    ``"submit"`` or ``"read c<id>"``.

    Raises:
        OSError: the file cannot be written.
    """
    progs = {p.actor: p for p in plan.lowered.programs}
    classes = {a.name: a.cls.qualname or a.external.name or a.name for a in plan.graph.actors}
    events: list[dict[str, Any]] = []
    writes: dict[tuple[int, int], tuple[int, int, float]] = {}  # (channel, exec) -> end
    reads: list[tuple[int, int, int, int, float]] = []  # channel, exec, pid, tid, arrival
    all_t0: list[int] = []
    for a in actors:
        all_t0 += [e[2] + a.get("offset_ns", 0) for e in a["events"][:1] + a["prologue"][:1]]
    drv = list(driver)
    all_t0 += [d[2] for d in drv[:1]]
    base = min(all_t0, default=0)

    def us(t: int) -> float:
        return (t - base) / 1000.0

    pids = {DRIVER: 0}
    for n, a in enumerate(actors, start=1):
        name, off = a["actor"], a.get("offset_ns", 0)
        pids[name] = pid = n
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": f"{name} ({classes.get(name, '?')}, pid {a['pid']})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                       "args": {"sort_index": n}})
        for tid, label in ((0, "compute stream"), (1, "comm stream")):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": label}})
        prog = progs[name]
        for part, ops in (("prologue", prog.prologue), ("events", prog.ops)):
            for i, e, t0, t1 in a[part]:
                op = ops[i]
                tid = 1 if op.stream == pb.COMM_STREAM else 0
                start, end = us(t0 + off), us(t1 + off)
                events.append({"ph": "X", "name": _op_name(op, plan),
                               "cat": pb.OpKind.Name(op.kind), "pid": pid, "tid": tid,
                               "ts": start, "dur": max(end - start, 0.001),
                               "args": {"execution": e, "op": i}})
                if op.kind in (pb.WRITE, pb.SEND):
                    # The arrow leaves at the write's start: its end is stamped after the
                    # value is published, and a preempted writer may stamp it after the
                    # reader already returned (an arrow pointing back in time).
                    writes[(op.channel, e)] = (pid, tid, start)
                elif op.kind in (pb.READ, pb.RECV):
                    # The value arrived when the read returned: the arrow ends inside the
                    # slice, just before its end (a read may wait long before it).
                    reads.append((op.channel, e, pid, tid, max(start, end - 0.001)))
    events.append({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "driver"}})
    for what, e, t0, t1 in drv:
        start = us(t0)
        events.append({"ph": "X", "name": what, "cat": "driver", "pid": 0, "tid": 0,
                       "ts": start, "dur": max(us(t1) - start, 0.001),
                       "args": {"execution": e}})
        cid = int(what.split("c")[-1]) if what.startswith("read c") else 0
        if cid:
            reads.append((cid, e, 0, 0, max(start, us(t1) - 0.001)))
        elif what == "submit":
            for c in plan.lowered.input_channels:
                writes[(c, e)] = (0, 0, start)
    flow = 0
    for cid, e, pid, tid, start in sorted(reads):
        src = writes.get((cid, e))
        if src is None:
            continue
        flow += 1
        spid, stid, sent = src
        events.append({"ph": "s", "id": flow, "name": f"c{cid}", "cat": "channel",
                       "pid": spid, "tid": stid, "ts": sent})
        events.append({"ph": "f", "bp": "e", "id": flow, "name": f"c{cid}", "cat": "channel",
                       "pid": pid, "tid": tid, "ts": start})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns",
                   "otherData": {"plan": plan.name}}, f)
    return sum(1 for ev in events if ev["ph"] == "X")
