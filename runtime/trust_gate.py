"""The trust gate of ``Plan.start()``: nothing from a plan runs before it passes.

``require_trusted(plan)`` checks ``plan.trust`` (the decision ``load`` made, or "built in
this process") still covers ``plan.proto``, and raises ``UntrustedPlanError`` with the
summary of what would run otherwise. It creates no actor and executes nothing from the plan.

A plan allowed because it holds nothing that needs trust (basis ``plain``: installed
classes, plain values) gets two more checks, because naming an installed callable with
plain arguments can be as strong as code (``subprocess.Popen(["sh", "-c", ...])``):

- every actor class must be one its author marked as an actor (``@cgc.actor`` or
  ``@ray.remote``) in an importable module — importing an installed module runs only
  installed code;
- no task calls a private method (a name starting with ``_``, except ``__call__``).

Signed plans, ``--trust`` and in-process plans skip them: their author is vouched for.

Example: ``require_trusted(plan)`` (``Plan.start()`` calls it first; idempotent).
"""

from __future__ import annotations

import importlib
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import UntrustedPlanError
from cgc.plan_schema.trust import PLAIN, REFUSED, TrustDecision, plan_needs, untrusted_error

__all__ = ["require_trusted"]


def require_trusted(plan: Any) -> None:
    """Raise unless ``plan`` (a ``cgc.runtime.Plan``) may start under its trust decision.

    Raises:
        UntrustedPlanError: the decision refuses the plan, no longer covers its content, or
            a plain plan names a class not marked as an actor or a private method.
    """
    decision: TrustDecision = plan.trust
    proto: pb.Plan = plan.proto
    if not decision.permits(proto):
        refused = TrustDecision(needs=plan_needs(proto), allowed=False, basis=REFUSED,
                                signer=decision.signer)
        raise untrusted_error(refused, proto.name)
    if decision.basis == PLAIN:
        _check_plain(proto)


def _is_marked_actor(obj: Any) -> bool:
    # @ray.remote makes a ray.actor.ActorClass; @cgc.actor a cgc.frontend.actors.ActorClass
    # (matched by name: the runtime never imports the compiler).
    if hasattr(obj, "__ray_metadata__"):
        return True
    t = type(obj)
    return t.__name__ == "ActorClass" and t.__module__ == "cgc.frontend.actors"


def _refuse(proto: pb.Plan, why: str) -> UntrustedPlanError:
    return UntrustedPlanError(
        f"plan {proto.name!r} is unsigned and {why}; start it only if you trust where it "
        "came from (`cgc run --trust`, cgc.load(..., trust=True)), or sign it "
        "(`cgc compile` signs with your key)")


def _check_plain(proto: pb.Plan) -> None:
    for actor in proto.graph.actors:
        ref = actor.cls
        where = f"actor {actor.name} ({ref.module}.{ref.qualname})"
        try:
            obj: Any = importlib.import_module(ref.module)
            for part in ref.qualname.split("."):
                obj = getattr(obj, part)
        except Exception as exc:  # noqa: BLE001 - any failure: cannot vouch for it
            raise _refuse(proto, f"{where} cannot be imported here to check it "
                                 f"({type(exc).__name__}: {exc})") from None
        if not _is_marked_actor(obj):
            raise _refuse(proto, f"{where} is not marked as an actor class "
                                 "(@cgc.actor or @ray.remote) in its module")
    for node in proto.graph.nodes:
        if node.kind == pb.CALL and node.method.startswith("_") and node.method != "__call__":
            raise _refuse(proto, f"node {node.name} calls the private method "
                                 f"{node.method!r} of actor {node.actor}")
