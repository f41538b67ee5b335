"""Ray Compiled Graph's per-task profiling records, kept on the actor as Ray keeps them.

With ``RAY_CGRAPH_ENABLE_PROFILING=1`` Ray's actors append one record per operation of
each task - READ, COMPUTE, WRITE, in that order, every execution - to a list in the actor
instance's attribute ``__ray_cgraph_events``, which a user reads with an ordinary actor
method (``getattr(self, "__ray_cgraph_events", [])``). The drop-in turns on
``start(ray_events=True)`` then, and each actor's loop records the same, in Ray's record
type (``ray.dag.compiled_dag_node._ExecutableTaskRecord``, through
``cgc.runtime.ray_internals``): a task's READ spans its channel reads (none: a zero-length
READ where its compute starts, as a value handed over inside the actor), COMPUTE its method
call (a collective counts as its compute), WRITE its writes and sends (none: zero-length).
As in Ray, READ and COMPUTE are recorded before the write, and the WRITE record is in the
list before the write can deliver, so a driver holding a result finds its task's records.

Like tracing (``cgc.runtime.trace``), recording wraps each op once at set-up; off, the loop
runs the very same ops as always.

Example::

    ops = record_ray_events(ops, program, plan, obj)   # in the actor, before the loop runs
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["EVENTS_ATTR", "record_ray_events"]

EVENTS_ATTR = "__ray_cgraph_events"  # Ray's attribute name on the actor instance

_READS = (pb.READ, pb.RECV)
_COMPUTES = (pb.COMPUTE, pb.COLL)
_WRITES = (pb.WRITE, pb.SEND)


def _actor_identity() -> tuple[str, str]:
    import ray

    ctx = ray.get_runtime_context()
    return ctx.get_actor_name() or "", ctx.get_actor_id() or ""


def record_ray_events(ops: list[Callable[[], None]], program: pb.Program, plan: pb.Plan,
                      obj: Any) -> list[Callable[[], None]]:
    """``ops`` (the compiled ops of ``program``) wrapped to append Ray's records to
    ``obj.__ray_cgraph_events``: a task's READ and COMPUTE records and its WRITE record
    (whose end is filled in after) before its first write or send of an execution, so the
    records exist once its output can be read; a task without writes gets all three after
    its last op.

    Raises:
        cgc.runtime.errors.SetupError: this Ray has no record type to make.
    """
    from cgc.runtime.ray_internals import executable_task_record

    record = executable_task_record()
    events: list[Any] = getattr(obj, EVENTS_ATTR, None) or []
    setattr(obj, EVENTS_ATTR, events)
    name, actor_id = _actor_identity()
    cls = type(obj).__name__
    tasks = list(dict.fromkeys(o.task for o in program.ops if o.kind in _COMPUTES))
    bind = {t: i for i, t in enumerate(tasks)}  # the actor's tasks in program order
    last = {o.task: i for i, o in enumerate(program.ops)}
    spans: dict[int, dict[str, list[float]]] = {t: {} for t in tasks}
    writes: dict[int, Any] = {}  # task -> its WRITE record of the execution under way

    def wrap(op: Callable[[], None], o: pb.Op, index: int) -> Callable[[], None]:
        kind = ("READ" if o.kind in _READS else "COMPUTE" if o.kind in _COMPUTES
                else "WRITE")
        task = o.task
        span = spans.setdefault(task, {})
        node = plan.graph.nodes[task]
        method = node.method or node.name
        emit = index == last[task] and task in bind
        now = time.perf_counter

        def add(what: str, a: float, b: float) -> Any:
            rec = record(actor_classname=cls, actor_name=name, actor_id=actor_id,
                         method_name=method, bind_index=bind[task], operation=what,
                         start_t=a, end_t=b)
            events.append(rec)
            return rec

        def before_write(t0: float) -> None:
            # As Ray: READ and COMPUTE are recorded before the write starts, and the WRITE
            # record is in the list before its value can reach a reader (its end is set
            # when the write is done), so a result read implies its task's records.
            c = span.pop("COMPUTE", [t0, t0])
            r = span.pop("READ", [c[0], c[0]])
            add("READ", *r)
            add("COMPUTE", *c)
            writes[task] = add("WRITE", t0, t0)

        def run() -> None:
            t0 = now()
            if kind == "WRITE" and task in bind and task not in writes:
                before_write(t0)
            op()
            t1 = now()
            if kind == "WRITE" and task in writes:
                writes[task].end_t = t1
            else:
                s = span.get(kind)
                span[kind] = [t0, t1] if s is None else [s[0], t1]
            if not emit:
                return
            if writes.pop(task, None) is None:  # no write (a value kept in the actor)
                c = span.pop("COMPUTE", [t1, t1])
                add("READ", *span.pop("READ", [c[0], c[0]]))
                add("COMPUTE", *c)
                add("WRITE", c[1], c[1])
            span.clear()
        return run

    return [wrap(op, o, i) for i, (op, o) in enumerate(zip(ops, program.ops, strict=True))]
