"""The compiler's back half: lower a traced ``pb.Graph`` into verified per-actor programs.

``PIPELINE`` is the ordered list of passes; each is a plain function over ``LowerState``
with its pre- and postcondition checked around it. ``lower`` runs them all.

Example::

    from cgc.passes import lower, LowerOptions
    plan = lower(plan)                       # plan.graph filled by the frontend
    plan.lowered.programs[0].ops             # what actor 0 replays per execution
"""

from __future__ import annotations

from cgc.ir.graph import build_graph
from cgc.passes import (
    capacity,
    capture,
    channels,
    communicators,
    config,
    extract,
    overlap,
    schedule,
    transports,
    verify_pass,
    wake,
    weight_sync,
)
from cgc.passes.state import LowerOptions, LowerState, Pass, PassInvariantError
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["lower", "LowerOptions", "LowerState", "Pass", "PassInvariantError", "PIPELINE"]

PIPELINE: list[Pass] = [
    Pass("weight_sync", weight_sync.assign_transfers, weight_sync.pre, weight_sync.post),
    Pass("transports", transports.assign_transports, transports.pre, transports.post),
    Pass("channels", channels.build_channels, channels.pre, channels.post),
    Pass("communicators", communicators.build_communicators, communicators.pre, communicators.post),
    Pass("schedule", schedule.schedule, schedule.pre, schedule.post),
    Pass("extract", extract.assign_extracts, extract.pre, extract.post),
    Pass("capacity", capacity.assign_capacity, capacity.pre, capacity.post),
    Pass("config", config.fill_config, config.pre, config.post),
    Pass("overlap", overlap.overlap, overlap.pre, overlap.post),
    Pass("wake", wake.assign_wake_depths, wake.pre, wake.post),
    Pass("capture", capture.assign_captures, capture.pre, capture.post),
    Pass("verify", verify_pass.verify, verify_pass.pre, verify_pass.post),
]


def lower(plan: pb.Plan, options: LowerOptions | None = None) -> pb.Plan:
    """Fill ``plan.lowered`` and ``plan.config`` from ``plan.graph``; return ``plan``.

    Any earlier ``lowered``/``config`` is replaced. The result is verified (the verifier
    steps more executions than the capacity) before it is returned.

    Example: ``lower(plan, LowerOptions(overlap=False, costs={"w1.fwd": 500}))``.

    Raises:
        cgc.errors.CompileError: the graph cannot be lowered (a transport hint that cannot
            hold, a collective on one actor, bind orders that contradict the data flow).
        cgc.plan_schema.verify.VerifyError: the lowered programs fail verification (a compiler bug).
        PassInvariantError: a pass broke its own postcondition (a compiler bug).
    """
    options = options or LowerOptions()
    plan.ClearField("lowered")
    plan.ClearField("config")
    state = LowerState(plan=plan, options=options)
    state.g = build_graph(plan.graph)
    for p in PIPELINE:
        p.pre(state)
        p.run(state)
        p.post(state)
    return plan
