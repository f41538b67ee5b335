"""``cgc inspect PLAN [--json]``: a plan as readable text, or as protobuf's JSON mapping."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["inspect_cmd", "header_text"]


@click.command("inspect")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print protobuf's JSON mapping of the plan.")
def inspect_cmd(plan_path: Path, as_json: bool) -> None:
    """Print a plan: header, actors, nodes, channels, one line per actor program."""
    from cgc.plan_schema.errors import PlanFormatError
    from cgc.plan_schema.planfile import read_header, read_plan_bytes

    try:
        data = plan_path.read_bytes()
    except OSError as exc:
        raise PlanFormatError(f"{plan_path}: cannot read plan file ({exc.strerror})") from None
    # Inspecting never runs the plan's code, so pickled values need no trust here.
    plan = read_plan_bytes(data, str(plan_path), trust=True)
    if as_json:
        from google.protobuf import json_format

        click.echo(json_format.MessageToJson(plan, indent=2))
        return
    header, _ = read_header(data, str(plan_path))
    click.echo(header_text(header, len(data)))
    from cgc.plan_schema.text import format_plan_text

    click.echo(format_plan_text(plan))


def header_text(header, size: int) -> str:  # noqa: ANN001
    """One line about the file: format, producer, size, checksum, trust."""
    fv = header.format_version
    trust = ", needs trust (pickled values)" if header.needs_trust else ""
    return (
        f"plan {header.name!r}: format {fv.major}.{fv.minor}, {header.producer}, "
        f"{size:,} bytes, payload sha256 {header.payload_sha256.hex()[:16]}{trust}"
    )
