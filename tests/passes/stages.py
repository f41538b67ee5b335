"""Run the lowering pipeline up to one pass, to test that pass on its own."""

from __future__ import annotations

from cgc.ir.graph import build_graph
from cgc.passes import PIPELINE, LowerOptions, LowerState
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_program


def state_before(plan: pb.Plan, name: str, options: LowerOptions | None = None) -> LowerState:
    """The lowering state right before pass ``name`` (every earlier pass has run).

    Example: ``s = state_before(shapes.chain(), "schedule"); run_pass(s, "schedule")``.
    """
    names = [p.name for p in PIPELINE]
    assert name in names, f"no pass {name!r} in {names}"
    state = LowerState(plan=plan, options=options or LowerOptions())
    state.g = build_graph(plan.graph)
    for p in PIPELINE[: names.index(name)]:
        p.pre(state)
        p.run(state)
        p.post(state)
    return state


def run_pass(state: LowerState, name: str) -> LowerState:
    """Run pass ``name`` with its pre- and postcondition; return the state."""
    p = next(p for p in PIPELINE if p.name == name)
    p.pre(state)
    p.run(state)
    p.post(state)
    return state


def programs_text(plan: pb.Plan) -> str:
    """Every program as its text line, one per line."""
    return "\n".join(format_program(p) for p in plan.lowered.programs)


def channels_text(plan: pb.Plan) -> str:
    """The channel lines of the plan dump (``cgc inspect``), without the header line."""
    from cgc.plan_schema.text import format_plan_text

    lines = format_plan_text(plan).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("channels ("))
    end = next(i for i, ln in enumerate(lines) if ln.startswith(("communicators:", "programs:")))
    return "\n".join(ln.strip() for ln in lines[start + 1 : end])
