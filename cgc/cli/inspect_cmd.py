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

    click.echo(header_text(pf.header, pf.size))
    click.echo("\n".join(trust_lines(pf)))
    click.echo(format_plan_text(pf.plan))


def header_text(header: pb.PlanHeader, size: int) -> str:
    """One line about the file: format, producer, size, checksum."""
    fv = header.format_version
    return (
        f"plan {header.name!r}: format {fv.major}.{fv.minor}, {header.producer}, "
        f"{size:,} bytes, payload sha256 {header.payload_sha256.hex()[:16]}"
    )


def code_text(plan: pb.Plan) -> str:
    """Every embedded module's source, each under a header line naming it and its digest.

    Example: ``code_text(plan).startswith("# ---- embedded module")``.
    """
    from cgc.plan_schema.trust import plan_needs

    needs = plan_needs(plan)
    by_name = {m.name: m for m in plan.graph.modules}
    out: list[str] = []
    for code in needs.modules:
        m = by_name.get(code.name)
        out.append(f"# ---- {code.text()}\n")
        source = m.source if m is not None else ""
        out.append(source if source.endswith("\n") or not source else source + "\n")
    if not out:
        out.append(f"# plan {plan.name!r} embeds no source code\n")
    if needs.pickles:
        out.append(f"# ---- and {len(needs.pickles)} pickled values (not shown: code "
                   "that runs when unpickled):\n")
        out.extend(f"#   {p.text()}\n" for p in needs.pickles)
    return "".join(out)
