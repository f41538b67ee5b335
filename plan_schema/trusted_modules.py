"""The modules a user vouches for: an unsigned plan may create actors of their classes.

A class being installed, or marked ``@ray.remote`` in some package, says nothing about
what its public methods do with a stranger's arguments (Ray's own libraries hold actor
classes that serve files). So an unsigned plan, run without ``--trust``, may name only
classes from modules the user listed in ``trusted_modules`` in their cgc config folder
(``cgc.plan_schema.userfiles.config_dir()``), one dotted module name per line::

    # modules whose classes unsigned plans may use (cgc trust add-module NAME)
    mylab.models
    mypkg

An entry covers that module and everything below it (``mypkg`` covers ``mypkg.sub``).
Nothing is trusted by default: not the standard library, not Ray, not site-packages.
The file is refused when another user owns it or others may write it, and lines end at
``\\n`` only (``userfiles.list_lines``). Reading it imports nothing.

Example::

    add_trusted_module("mypkg")
    load_trusted_modules().covering("mypkg.sub") == "mypkg"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cgc.plan_schema.userfiles import (
    KeyFileError,
    append_line,
    check_dir,
    config_dir,
    ensure_dir,
    list_lines,
    read_text,
)

__all__ = [
    "TRUSTED_MODULES_FILE",
    "ModuleTrust",
    "check_module_name",
    "load_trusted_modules",
    "add_trusted_module",
    "remove_trusted_module",
]

TRUSTED_MODULES_FILE = "trusted_modules"
_HEADER = "# modules whose classes unsigned plans may use (cgc trust add-module NAME)"


def check_module_name(name: str, where: str = "module") -> str:
    """``name`` if it is a dotted Python module name (``a.b_c``), else an error.

    Raises:
        KeyFileError: not a dotted name of identifiers (``where`` says which entry).
    """
    parts = name.split(".")
    if not name or not all(p.isidentifier() and p.isascii() for p in parts):
        raise KeyFileError(f"{where}: {name[:80]!r} is not a dotted module name "
                           "(like mypkg or mylab.models)")
    return name


@dataclass(frozen=True)
class ModuleTrust:
    """The user's trusted module names and the file they came from.

    Example: ``ModuleTrust(("mypkg",)).covering("mypkg.models") == "mypkg"``.
    """

    names: tuple[str, ...] = ()
    source: str = ""  # the file, for messages

    def covering(self, module: str) -> str | None:
        """The entry that covers ``module`` (itself or a parent package), or None."""
        for name in self.names:
            if module == name or module.startswith(name + "."):
                return name
        return None


def _path(directory: Path | None) -> Path:
    return (directory or config_dir()) / TRUSTED_MODULES_FILE


def load_trusted_modules(directory: Path | None = None) -> ModuleTrust:
    """Read ``trusted_modules`` (absent: nothing trusted); nothing is imported or created.

    Raises:
        KeyFileError: the file or folder is another user's or open to others, or a line is
            not a module name (``file:line`` names it).
    """
    d = directory or config_dir()
    check_dir(d)
    path = _path(d)
    text = read_text(path, f"chmod 600 {path}")
    names = {check_module_name(line, f"{path}:{n}") for n, line in list_lines(text, str(path))}
    return ModuleTrust(tuple(sorted(names)), str(path))


def add_trusted_module(name: str, directory: Path | None = None) -> bool:
    """Add ``name`` to ``trusted_modules``; False when it was there already.

    The file is read back afterwards: the module counts as added only once it says so.

    Example: ``add_trusted_module("mypkg")``.

    Raises:
        KeyFileError: ``name`` is not a module name, or the file is unsafe or malformed.
    """
    check_module_name(name)
    d = directory or config_dir()
    ensure_dir(d)
    if name in load_trusted_modules(d).names:
        return False
    path = _path(d)
    if not path.exists():
        append_line(path, _HEADER, f"chmod 600 {path}")
    append_line(path, name, f"chmod 600 {path}")
    if name not in load_trusted_modules(d).names:
        raise KeyFileError(f"{path}: {name} was appended but the file does not read back as "
                           "trusting it; check the file's last lines")
    return True


def remove_trusted_module(name: str, directory: Path | None = None) -> bool:
    """Remove the entry ``name`` (only that exact line); False when it was not there.

    Raises:
        KeyFileError: the file is unsafe or malformed.
    """
    d = directory or config_dir()
    if name not in load_trusted_modules(d).names:
        return False
    path = _path(d)
    text = read_text(path, f"chmod 600 {path}")
    kept = [line for line in text.split("\n") if line.strip() != name]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    append_line(tmp, "\n".join(kept).rstrip("\n"), f"chmod 600 {tmp}")
    tmp.replace(path)
    return True
