"""``cgc check PLAN``: verify a plan file's format, checksum and deadlock-freedom.

Exit 0 with ``ok: ...`` when every check holds; otherwise the error propagates and
``cgc.cli.main`` prints it (a deadlock as its per-actor table) and exits with its code
(4: not a valid plan file, 5: verification failed).
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["check_cmd"]


@click.command("check")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--executions",
    type=click.IntRange(min=1),
    default=None,
    help="Executions to step, at the plan's capacity (default: as many as decide every "
    "number of executions: 2 for plans cgc compiles).",
)
def check_cmd(plan_path: Path, executions: int | None) -> None:
    """Verify PLAN: magic, version, checksum, structure, and no deadlock.

    Also says who signed it, what in it needs trust and which modules it needs installed.
    Checking runs nothing from the plan.
    """
    from cgc.cli.trust_text import trust_lines
    from cgc.plan_schema.planfile import open_plan
    from cgc.plan_schema.requirements import requirements
    from cgc.plan_schema.verify import verify_plan

    pf = open_plan(plan_path)  # read once: magic, version, length, checksum, signature
    # Checking never unpickles values, so a plan that needs trust is still checkable.
    report = verify_plan(pf.plan, executions)
    at = f"capacity {report.capacity}"
    if report.stepped_capacity and report.stepped_capacity != report.capacity:
        at = f"capacity {report.stepped_capacity} (which decides capacity {report.capacity})"
    click.echo(
        f"ok: {plan_path}: {report.programs} programs, {report.channels} channels; "
        f"stepped {report.executions} executions ({report.ops_stepped} ops) with "
        f"{at}: no deadlock"
    )
    needs = requirements(pf.plan)
    if needs:
        click.echo("  needs installed where it runs: "
                   + "; ".join(f"{r.module} ({r.why})" for r in needs))
    else:
        click.echo("  needs installed where it runs: cgc and Ray only")
    for line in trust_lines(pf, detail=False):  # last: the verdict after all plan content
        click.echo(f"  {line}")
