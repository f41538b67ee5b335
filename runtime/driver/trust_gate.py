"""The trust gate of ``Plan.start()``: nothing from a plan runs before it passes.

``require_trusted(plan)`` checks that ``plan.trust`` (the decision ``load`` made, or "built
in this process") still covers ``plan.proto`` — the content may have changed since it was
loaded — and raises ``UntrustedPlanError`` with the summary of what would run otherwise.
It reads the plan and the decision only: it imports, creates and executes nothing.

The rules themselves live in ``cgc.plan_schema.trust``: an unsigned plan without
``--trust`` may hold no code and name only classes from modules the user trusts, and
public methods. When its classes are later loaded (``cgc.runtime.actor.host.load_class``),
each must be defined in the module the plan names under the name it gives, so a trusted
module's imports (``mypkg.subprocess.Popen``) do not smuggle in another module's class.

Example: ``require_trusted(plan)`` (``Plan.start()`` calls it first; idempotent).
"""

from __future__ import annotations

from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.trust import (
    REFUSED,
    TrustDecision,
    plan_needs,
    untrusted_error,
    unvouched_names,
)

__all__ = ["require_trusted"]


def require_trusted(plan: Any) -> None:
    """Raise unless ``plan`` (a ``cgc.runtime.Plan``) may start under its trust decision.

    Raises:
        UntrustedPlanError: the decision refuses the plan or no longer covers its content
            (code added since it was loaded, a class from a module the user does not trust,
            a private method).
    """
    decision: TrustDecision = plan.trust
    proto: pb.Plan = plan.proto
    if not decision.permits(proto):
        refused = TrustDecision(needs=plan_needs(proto), allowed=False, basis=REFUSED,
                                signer=decision.signer, modules=decision.modules,
                                unvouched=tuple(unvouched_names(proto, decision.modules)))
        raise untrusted_error(refused, proto.name)
