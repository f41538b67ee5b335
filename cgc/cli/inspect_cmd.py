"""``cgc inspect PLAN [--json | --code]``: a plan as readable text, as protobuf's JSON
mapping, or the source code it embeds. Inspecting never runs anything from the plan: pickled
values show as ``<pickled, N bytes>`` and embedded source is printed, never executed. A plan
beyond ``Limits`` is refused first (``cgc.plan_schema.verify.bounds.check_limits``), as check
and viz do."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # the command imports the schema when it runs
    from cgc.plan_schema import plan_pb2 as pb

__all__ = ["inspect_cmd", "header_text", "code_text"]


@click.command("inspect")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print protobuf's JSON mapping of the plan.")
@click.option("--code", "as_code", is_flag=True,
              help="Print the source of every module the plan embeds (what would run).")
def inspect_cmd(plan_path: Path, as_json: bool, as_code: bool) -> None:
    """Print a plan: header, signer, what needs trust, actors, nodes, channels, programs.

    A plan beyond cgc's bounds (``Limits``) is refused, as ``cgc check`` and ``cgc viz``
    refuse it (exit code 4); a plan that is malformed otherwise is still printed.
    """
    from cgc.plan_schema.planfile import open_plan
    from cgc.plan_schema.verify.bounds import check_limits

    pf = open_plan(plan_path)
    check_limits(pf.plan)
    if as_json:
        from google.protobuf import json_format

        click.echo(json_format.MessageToJson(pf.plan, indent=2))
        return
    if as_code:
        click.echo(code_text(pf.plan), nl=False)
        return
    from cgc.cli.trust_text import trust_lines
    from cgc.plan_schema.text import format_plan_text

    # The trust lines last, after all plan content: what the verifier decided is what a
    # reader sees at the bottom (every line escaped: cgc.plan_schema.display).
    click.echo(header_text(pf.header, pf.size))
    click.echo(format_plan_text(pf.plan))
    click.echo("\n".join(trust_lines(pf)))


def header_text(header: pb.PlanHeader, size: int) -> str:
    """One line about the file: format, producer, size, checksum."""
    from cgc.plan_schema.display import escape

    fv = header.format_version
    return (
        f"plan {header.name!r}: format {fv.major}.{fv.minor}, {escape(header.producer)}, "
        f"{size:,} bytes, payload sha256 {header.payload_sha256.hex()[:16]}"
    )


def code_text(plan: pb.Plan) -> str:
    """Every embedded module's source, each under a header line naming it and its digest,
    each line numbered as Python's compiler numbers it (``\\r``, ``\\r\\n`` and ``\\n`` end a
    line; see ``cgc.plan_schema.display.code_lines``) and escaped.

    Example: ``code_text(plan).startswith("# ---- embedded module")``.

    Raises:
        Nothing.
    """
    from cgc.plan_schema.display import code_lines
    from cgc.plan_schema.trust import plan_needs

    needs = plan_needs(plan)
    by_name = {m.name: m for m in plan.graph.modules}
    out: list[str] = []
    for code in needs.modules:
        m = by_name.get(code.name)
        out.append(f"# ---- {code.text()}\n")
        lines = code_lines(m.source if m is not None else "")
        out.extend(f"{n:>5}| {line}\n" for n, line in enumerate(lines, 1))
    if not out:
        out.append(f"# plan {plan.name!r} embeds no source code\n")
    if needs.pickles:
        out.append(f"# ---- and {len(needs.pickles)} pickled values (not shown: code "
                   "that runs when unpickled):\n")
        out.extend(f"#   {p.text()}\n" for p in needs.pickles)
    return "".join(out)
