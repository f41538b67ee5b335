"""The user's cgc config folder and the small text files in it, read with care.

The folder (``config_dir()``: ``$CGC_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/cgc``, else
``~/.config/cgc``; created with mode 0700) holds what decides whether a plan runs here:
the user's signing key, the keys they trust (``cgc.plan_schema.signing``) and the modules
they trust (``cgc.plan_schema.trusted_modules``). Whoever can write one of those files can
make their plans run as the user, so each read checks, on the open file, that the user owns
it and nobody else may write it; and list files are split into lines at ``\\n`` only, so
a line that another program shows as two (U+2028, NEL, form feed, a bare CR) is refused
rather than read one way and shown another.

Example::

    text = read_text(config_dir() / "trusted_keys", "chmod 600 ~/.config/cgc/trusted_keys")
    for n, line in list_lines(text, "trusted_keys"):
        ...
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from cgc.plan_schema.errors import EXIT_USAGE, CgcError

__all__ = [
    "CONFIG_ENV",
    "KeyFileError",
    "config_dir",
    "check_owned",
    "ensure_dir",
    "check_dir",
    "read_checked",
    "read_text",
    "list_lines",
    "append_line",
]

CONFIG_ENV = "CGC_CONFIG_DIR"

# Characters some reader takes for a line break (str.splitlines, editors, terminals), and
# the other C0 controls: none belongs in a key or module list line.
_BREAKS = frozenset("\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
_CONTROLS = frozenset(chr(c) for c in range(32) if chr(c) != "\t") | {"\x7f"}


class KeyFileError(CgcError):
    """A file in the user's cgc config folder is unreadable, malformed or unsafely shared."""

    exit_code = EXIT_USAGE


def config_dir() -> Path:
    """The user's cgc config directory (not created here).

    Example: ``CGC_CONFIG_DIR=/tmp/k cgc keys show`` uses /tmp/k.
    """
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "cgc"


def check_owned(st: os.stat_result, path: Path, forbidden: int, fix: str) -> None:
    """Refuse a file another user owns, or whose mode has any bit of ``forbidden``.

    Raises:
        KeyFileError: naming the file and the command that fixes it.
    """
    # Why: a trust file someone else can write lets them swap in their own key or module,
    # and then their plans run here as "yours".
    if st.st_uid != os.geteuid():
        raise KeyFileError(f"{path} belongs to another user (uid {st.st_uid}); cgc will not "
                           "use it — remove it, or point CGC_CONFIG_DIR at your own folder")
    if st.st_mode & forbidden:
        raise KeyFileError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}, open to other "
                           f"users; fix it with: {fix}")


def ensure_dir(d: Path) -> None:
    """Create ``d`` (mode 0700) if needed and check it is the user's alone.

    Raises:
        KeyFileError: another user owns it or may write it.
    """
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_owned(d.stat(), d, stat.S_IWGRP | stat.S_IWOTH, f"chmod 700 {d}")


def check_dir(d: Path) -> None:
    """Check an existing ``d`` as ``ensure_dir`` does; an absent one is fine.

    Raises:
        KeyFileError: another user owns it or may write it.
    """
    if d.is_dir():  # whoever may write the folder may swap the files in it
        check_owned(d.stat(), d, stat.S_IWGRP | stat.S_IWOTH, f"chmod 700 {d}")


def read_checked(path: Path, forbidden: int, fix: str) -> bytes | None:
    """The file's bytes after checking owner and mode on the open file; None if absent.

    Raises:
        KeyFileError: unreadable, another user's, or open to others (``forbidden``).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        check_owned(os.fstat(f.fileno()), path, forbidden, fix)
        return f.read()


def read_text(path: Path, fix: str) -> str:
    """A list file's UTF-8 text ("" when absent), refused if others may write it.

    Raises:
        KeyFileError: as ``read_checked``, or not UTF-8.
    """
    raw = read_checked(path, stat.S_IWGRP | stat.S_IWOTH, fix)
    try:
        return "" if raw is None else raw.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: not UTF-8 text") from None


def list_lines(text: str, where: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of every entry of a list file: split at ``\\n`` only,
    blank lines and ``#`` comments skipped.

    Example: ``list(list_lines("# c\\nmypkg\\n", "f"))`` -> ``[(2, "mypkg")]``.

    Raises:
        KeyFileError: a line (comments too) holds another line break or control character,
            so it could show as two lines while cgc reads one (``where:N`` names it).
    """
    for n, line in enumerate(text.split("\n"), 1):
        odd = next((c for c in line if c in _BREAKS or c in _CONTROLS), None)
        if odd is not None:
            raise KeyFileError(
                f"{where}:{n}: the line holds the character U+{ord(odd):04X}, which some "
                "programs show as a line break; cgc reads lines split at \\n only — "
                "remove it")
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield n, stripped


def append_line(path: Path, line: str, fix: str) -> None:
    """Append ``line`` to the user's list file ``path`` (created 0600), starting on a line
    of its own even when the file does not end with a newline.

    Raises:
        KeyFileError: the file is another user's or open to others.
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "r+b") as f:
        check_owned(os.fstat(f.fileno()), path, stat.S_IWGRP | stat.S_IWOTH, fix)
        size = os.fstat(f.fileno()).st_size
        lead = b""
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                lead = b"\n"
        f.write(lead + line.encode("utf-8") + b"\n")
