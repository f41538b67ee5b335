"""``cgc viz PLAN [-o FILE] [--schedule] [--ascii]``: draw a plan, offline."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

__all__ = ["viz_cmd"]


@click.command("viz")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Picture to write; its suffix picks the format (png, svg, pdf, dot) "
    "[default: the plan's name with .png (.schedule.png), beside the plan].",
)
@click.option(
    "--schedule", is_flag=True,
    help="Draw the schedule (every actor's ops on one time grid) instead of the graph.",
)
@click.option(
    "--ascii", "as_ascii", is_flag=True,
    help="Print to the terminal instead of writing a picture (with --schedule: the time grid).",
)
@click.option(
    "--verbose", is_flag=True,
    help="Also show Fontconfig's warnings about the system's font configuration.",
)
def viz_cmd(plan_path: Path, output: Path | None, schedule: bool, as_ascii: bool,
            verbose: bool) -> None:
    """Draw a plan: its graph (actors, transports) or its schedule (ops per actor and step).

    png/svg/pdf are drawn by Graphviz: the dot program if on PATH, else pygraphviz's
    bundled one (a dependency of cgc); .dot and --ascii need nothing.
    """
    from cgc import viz
    from cgc.plan_schema.planfile import read_plan

    if output is not None and not as_ascii:
        viz.output_format(output)  # a usage error before any work
    from cgc.plan_schema.verify import check_structure

    plan = read_plan(plan_path, trust=True)  # drawing never unpickles or executes anything
    # A malformed plan (checksummed, but not what a compiler writes) is refused with the
    # structure check's typed error, not drawn half-way into a KeyError.
    check_structure(plan)
    if as_ascii:
        width = shutil.get_terminal_size((100, 24)).columns
        text = viz.schedule_ascii(plan, width) if schedule else viz.ascii_view(plan, width)
        click.echo(text, nl=False)
        return
    source = viz.schedule_dot(plan) if schedule else viz.graph_dot(plan)
    suffix = ".schedule.png" if schedule else ".png"
    out = output or plan_path.with_name(plan_path.stem + suffix)
    click.echo(str(viz.render(source, out, verbose=verbose)))
