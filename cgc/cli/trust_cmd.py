"""``cgc trust``: the modules whose classes unsigned plans may use.

    cgc trust add-module mypkg      # unsigned plans may create actors of mypkg's classes
    cgc trust remove-module mypkg
    cgc trust list                  # trusted modules and keys, and where they are kept

Being installed, or marked ``@ray.remote``, vouches for nothing: a module is trusted only
once you add it here (``cgc.plan_schema.trusted_modules``). Signed plans (``cgc keys``) and
``--trust`` do not need it.
"""

from __future__ import annotations

import click

__all__ = ["trust_cmd"]


@click.group("trust")
def trust_cmd() -> None:
    """Trust modules whose classes unsigned plans may use."""


@trust_cmd.command("add-module")
@click.argument("names", metavar="MODULE...", nargs=-1, required=True)
def add_module_cmd(names: tuple[str, ...]) -> None:
    """Trust MODULE and everything below it (mypkg covers mypkg.models).

    Add a module only if you vouch for what every public method of every actor class in it
    does with arguments a stranger's plan chooses.
    """
    from cgc.plan_schema.trusted_modules import add_trusted_module, load_trusted_modules

    for name in names:
        added = add_trusted_module(name)
        click.echo(f"{'trusted' if added else 'already trusted'}: {name}")
    click.echo(f"(in {load_trusted_modules().source})", err=True)


@trust_cmd.command("remove-module")
@click.argument("names", metavar="MODULE...", nargs=-1, required=True)
def remove_module_cmd(names: tuple[str, ...]) -> None:
    """Stop trusting MODULE (the exact entry)."""
    from cgc.plan_schema.trusted_modules import remove_trusted_module

    for name in names:
        removed = remove_trusted_module(name)
        click.echo(f"{'removed' if removed else 'not trusted'}: {name}")


@trust_cmd.command("list")
def list_cmd() -> None:
    """List the modules and keys you trust."""
    from cgc.plan_schema import signing
    from cgc.plan_schema.trusted_modules import load_trusted_modules

    mods = load_trusted_modules()
    click.echo(f"trusted modules ({len(mods.names)}, in {mods.source}):")
    for name in mods.names:
        click.echo(f"  {name}")
    ring = signing.load_keyring()
    click.echo(f"trusted keys ({len(ring.trusted)} besides your own; `cgc keys list`)")
