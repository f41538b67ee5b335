"""Trust lines the CLI prints about a plan file (inspect, check, compile): who signed it,
what in it needs trust, and whether it would run here without ``--trust``.

Nothing here unpickles or executes anything from the plan.
"""

from __future__ import annotations

from cgc.plan_schema.planfile import PlanFile

__all__ = ["trust_lines"]


def trust_lines(pf: PlanFile, *, detail: bool = True) -> list[str]:
    """Lines on the plan's signature, its needs and the rule that decides whether it runs
    here without ``--trust``; ``detail`` lists every item that needs trust. The names the
    user's trusted modules do not cover are always listed. The rule ("runs here: ...") is
    the last line, after every line that quotes the plan.

    Example: ``trust_lines(open_plan("x.cgplan"))[0]`` -> ``"signature: signed by ..."``.
    """
    from cgc.plan_schema.display import escape
    from cgc.plan_schema.signing import KeyFileError
    from cgc.plan_schema.trust import decide

    try:
        decision = decide(pf, trust=False)
    except KeyFileError as exc:  # still show the file; say why keys were not consulted
        from cgc.plan_schema.signing import fingerprint
        from cgc.plan_schema.trust import plan_needs

        needs = plan_needs(pf.plan)
        fp = fingerprint(pf.header.signer_key) if pf.header.signature else ""
        lines = [f"signature: {'by ' + fp if fp else 'unsigned'} "
                 f"(cannot check against your keys: {exc})"]
        lines.append(f"needs trust: {needs.short()}" if needs.needs_trust
                     else "needs trust: no code from the file (installed classes and plain "
                          "values only)")
        lines.append("runs here: not known (your trust files could not be read)")
        if detail:
            lines.extend(f"  {line}" for line in needs.lines())
        return [escape(line) for line in lines]
    lines = [f"signature: {decision.signer}"]
    needs = decision.needs
    if not needs.needs_trust:
        verdict = "no code from the file (installed classes and plain values only)"
    else:  # whether it runs here is the rule's line, printed last: said once
        verdict = needs.short()
    if pf.header.signature and not pf.signature_valid:
        verdict += "; refused without --trust: its signature does not verify"
    lines.append(f"needs trust: {verdict}")
    if detail:
        lines.extend(f"  {line}" for line in needs.lines())
    lines.extend(f"  {line}" for line in decision.unvouched)
    lines.append(decision.rule())  # the verifier's verdict, after every plan-derived line
    return [escape(line) for line in lines]
