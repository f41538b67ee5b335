"""``cgc compile FILE[:ATTR] -o PLAN``: model file → verified .cgplan, signed with the user's
key (``--no-sign`` skips it), with a short summary."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # the command imports the schema when it runs
    from cgc.plan_schema import plan_pb2 as pb

__all__ = ["compile_cmd", "summarize"]


@click.command("compile")
@click.argument("target", metavar="FILE[:ATTR]")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Plan file to write [default: FILE's name with .cgplan, in the current folder].",
)
@click.option(
    "--allow-pickle",
    is_flag=True,
    help="Store constants that are not plain values as pickles (the plan then needs trust).",
)
@click.option(
    "--overlap/--no-overlap",
    default=None,
    help="Overlap communication with compute [default: where it helps].",
)
@click.option(
    "--no-sign",
    is_flag=True,
    help="Do not sign the plan with your key (it then needs --trust if it embeds code).",
)
@click.option(
    "--cost",
    "costs",
    multiple=True,
    metavar="ACTOR.METHOD=MICROS",
    help="Override the scheduler's cost estimate of a method (repeatable).",
)
def compile_cmd(
    target: str,
    output: Path | None,
    allow_pickle: bool,
    overlap: bool | None,
    no_sign: bool,
    costs: tuple[str, ...],
) -> None:
    """Compile the graph of a model file into a plan.

    The graph comes from build_dag() unless ATTR names another function or a DAG node;
    example_inputs(), if defined, is stored for `cgc run`. The plan is signed with your
    key (made on first use, see `cgc keys show`), so it runs here without --trust.
    """
    from cgc.api import compile_file
    from cgc.model_file import split_target

    path, _ = split_target(target)
    out = output or Path(path.stem + ".cgplan")
    # The warnings filters stay as they are (Ray's deprecation notices stay hidden).
    with warnings.catch_warnings(record=True) as caught:
        plan = compile_file(
            target, allow_pickle=allow_pickle, overlap=overlap, costs=_parse_costs(costs)
        )
    for w in caught:  # one line each, naming the user's line (not cgc's)
        click.echo(f"warning: {w.message}", err=True)
    from cgc.plan_schema import signing

    key_path = signing.config_dir() / signing.KEY_FILE
    had_key = no_sign or key_path.exists()
    plan.save(out, sign=not no_sign)
    if not had_key and key_path.exists():  # the first signed plan made the user's key: say so
        click.echo(f"made your plan-signing key: {key_path} (once; plans you sign run here "
                   "without --trust; `cgc keys show` prints its public line for others)",
                   err=True)
    data = out.read_bytes()
    click.echo(summarize(plan.proto, target, out, data))
    from cgc.cli.trust_text import trust_lines
    from cgc.plan_schema.planfile import open_plan_bytes

    for line in trust_lines(open_plan_bytes(data, str(out)), detail=False):
        click.echo(f"  {line}")


def _parse_costs(items: tuple[str, ...]) -> dict[str, float]:
    costs: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep or not key:
                raise ValueError
            costs[key] = float(value)
        except ValueError:
            raise click.BadParameter(
                f"{item!r} is not ACTOR.METHOD=MICROS (e.g. w0.forward=250)", param_hint="--cost"
            ) from None
    return costs


def summarize(proto: pb.Plan, target: str, out: Path, data: bytes | None) -> str:
    """A few lines on what was compiled: sizes, channels, capacity, schedule."""
    from cgc.plan_schema import plan_pb2 as pb

    graph, low = proto.graph, proto.lowered
    tasks = sum(1 for n in graph.nodes if n.kind in (pb.CALL, pb.COLLECTIVE))
    kinds = [c.kind for c in low.channels]
    host, nccl = kinds.count(pb.CHAN_HOST), kinds.count(pb.CHAN_NCCL)
    size = f"{len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]}" if data else ""
    sched = low.schedule
    lines = [
        f"compiled {target} -> {out} ({size})",
        f"  {len(graph.actors)} actors, {tasks} tasks, {len(low.channels)} channels "
        f"({host} host, {nccl} nccl), {len(low.communicators)} communicators",
        f"  capacity {proto.config.capacity} executions in flight; verified "
        f"{sched.verified_executions} executions (no deadlock with that many in flight)",
        f"  simulated makespan {sched.makespan_us:.0f} us (one execution, by the compiler's "
        "cost estimates)" + ("; overlap on" if sched.overlap else ""),
    ]
    if proto.has_example_inputs:
        lines.append(f"  example inputs stored: run it with `cgc run {out}`")
    return "\n".join(lines)
