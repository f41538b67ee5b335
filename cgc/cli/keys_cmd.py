"""``cgc keys``: the user's plan-signing key and the keys they trust.

    cgc keys show            # your public key line (share it; made on first use)
    cgc keys add alice.pub   # trust plans signed by that key (``-`` reads stdin)
    cgc keys list            # your key and every trusted key, with fingerprints

Files live in the cgc config directory (``$CGC_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/cgc``,
else ``~/.config/cgc``); see ``cgc.plan_schema.signing`` for their format.
"""

from __future__ import annotations

import getpass
import socket
from typing import TextIO

import click

__all__ = ["keys_cmd"]


@click.group("keys")
def keys_cmd() -> None:
    """Show your plan-signing key; trust other people's keys."""


@keys_cmd.command("show")
def show_cmd() -> None:
    """Print your public key line (makes your key on first use).

    Give the line to a colleague: `cgc keys add` on their side makes your signed plans
    run there without --trust.
    """
    from cgc.plan_schema import signing

    public = signing.public_key_bytes(signing.load_or_create_key())
    click.echo(signing.public_key_line(public, _comment()))
    click.echo(f"{signing.fingerprint(public)} ({signing.config_dir() / signing.KEY_FILE})",
               err=True)


@keys_cmd.command("add")
@click.argument("keyfile", metavar="KEYFILE", type=click.File("r", encoding="utf-8"))
def add_cmd(keyfile: TextIO) -> None:
    """Trust the public key in KEYFILE (a line from `cgc keys show`; - reads stdin)."""
    from cgc.plan_schema import signing
    from cgc.plan_schema.userfiles import list_lines

    lines = [ln for _, ln in list_lines(keyfile.read(), keyfile.name)]
    if len(lines) != 1:
        raise signing.KeyFileError(
            f"{keyfile.name}: expected one public key line ('{signing.KEY_TYPE} BASE64 "
            f"[comment]'), found {len(lines)} lines")
    public, added = signing.add_trusted_key(lines[0])
    where = signing.config_dir() / signing.TRUSTED_KEYS_FILE
    verb = "trusted" if added else "already trusted"
    click.echo(f"{verb}: {signing.fingerprint(public)} (in {where})")


@keys_cmd.command("list")
def list_cmd() -> None:
    """List your key and the keys you trust, with fingerprints."""
    from cgc.plan_schema import signing

    ring = signing.load_keyring()
    d = signing.config_dir()
    if ring.own is None:
        click.echo(f"your key: none yet (made by `cgc compile` or `cgc keys show`, in {d})")
    else:
        click.echo(f"your key: {signing.fingerprint(ring.own)} ({d / signing.KEY_FILE})")
    click.echo(f"trusted keys ({len(ring.trusted)}, in {d / signing.TRUSTED_KEYS_FILE}):")
    for public, comment in sorted(ring.trusted.items(), key=lambda kv: kv[1]):
        click.echo(f"  {signing.fingerprint(public)} {comment}".rstrip())


def _comment() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # noqa: BLE001 - a comment is optional
        return ""
