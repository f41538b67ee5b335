"""Turning DOT source into a picture file: png, svg, pdf, or the DOT itself.

Graphviz draws the pictures. The system's ``dot`` program is used when it is on PATH;
otherwise pygraphviz, a core dependency of cgc on the platforms where its wheels carry
Graphviz's libraries (Linux x86_64/aarch64, macOS arm64, Windows x86_64), so that a plain
``pip install`` draws with nothing from the system. ``.dot`` output needs neither.

Example::

    render(graph_dot(plan), Path("plan.svg"))
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from cgc.plan_schema.errors import EXIT_USAGE, CgcError

__all__ = ["FORMATS", "RenderError", "render", "picture_bytes", "output_format"]

FORMATS = ("png", "svg", "pdf", "dot")
_LAYOUT = re.compile(r"^\s*layout=(\w+)", re.MULTILINE)
_NO_GRAPHVIZ = (
    "drawing a .{fmt} picture needs Graphviz, and neither the dot program (not on PATH) "
    "nor pygraphviz ({why}) can draw: pip install pygraphviz (cgc's dependency; its wheels "
    "include Graphviz), or, where pip finds no wheel for this platform, install Graphviz "
    "(apt-get install graphviz, brew install graphviz, or conda install graphviz); "
    "or write the DOT source instead: -o {dot}"
)


class RenderError(CgcError):
    """A picture cannot be written: unknown format, no Graphviz, or an unwritable path.

    A usage problem: the CLI exits with 2, and the message names the fix.
    """

    exit_code = EXIT_USAGE


def _engine(dot_source: str) -> str:
    m = _LAYOUT.search(dot_source)
    return m.group(1) if m else "dot"


# Lines Graphviz's libraries print that say nothing about the picture: Fontconfig (bundled
# with pygraphviz's wheels, older than the system's font configuration) warns on every
# draw about elements of the system's config it does not know.
_NOISE = ("Fontconfig warning:", "Fontconfig error:")


@contextlib.contextmanager
def _graphviz_stderr(verbose: bool) -> Iterator[None]:
    """Collect what Graphviz writes to the process's stderr (file descriptor 2: its C
    libraries write there directly) while the block runs; then pass it on, less the
    Fontconfig lines unless ``verbose``."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable stderr: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            kept = [line for line in text.splitlines()
                    if verbose or not line.startswith(_NOISE)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")


def _with_system_dot(dot_source: str, fmt: str) -> bytes | None:
    """The picture drawn by the system's Graphviz, or None when it is not installed."""
    import graphviz

    try:
        return graphviz.Source(dot_source, engine=_engine(dot_source)).pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        return None
    except graphviz.CalledProcessError as exc:
        raise CgcError(f"Graphviz could not draw the {fmt}: {exc.stderr!r}") from None


def _with_pygraphviz(dot_source: str, fmt: str) -> bytes | str:
    """The picture drawn by pygraphviz's bundled Graphviz, or why it cannot draw."""
    try:
        import pygraphviz
    except ImportError as exc:
        # Not installed, or installed without its libraries (a source build gone wrong):
        # the message says which, for the error that names the fix.
        missing = isinstance(exc, ModuleNotFoundError) and exc.name == "pygraphviz"
        return "not installed" if missing else f"cannot be imported: {exc}"
    try:
        data = pygraphviz.AGraph(string=dot_source).draw(format=fmt, prog=_engine(dot_source))
    except ValueError as exc:  # pygraphviz's type for Graphviz's layout and render errors
        raise CgcError(f"Graphviz (pygraphviz) could not draw the {fmt}: {exc}") from None
    return bytes(data)


def picture_bytes(dot_source: str, fmt: str, out_hint: Path | None = None, *,
                  verbose: bool = False) -> bytes:
    """``dot_source`` drawn as ``fmt`` (png, svg or pdf). What Graphviz prints passes to
    stderr, less Fontconfig's warnings about the system's font configuration unless
    ``verbose``.

    Example: ``picture_bytes("digraph { a -> b }", "svg")[:5] == b"<?xml"``.

    Raises:
        RenderError: neither the ``dot`` program nor pygraphviz is installed; the message
            names what to install.
        CgcError: Graphviz is there but fails on the source.
    """
    with _graphviz_stderr(verbose):
        data = _with_system_dot(dot_source, fmt)
        if data is not None:
            return data
        drawn = _with_pygraphviz(dot_source, fmt)
    if isinstance(drawn, str):
        dot = (out_hint or Path("picture")).with_suffix(".dot")
        raise RenderError(_NO_GRAPHVIZ.format(fmt=fmt, why=drawn, dot=dot))
    return drawn


def output_format(out: Path) -> str:
    """The format ``out``'s suffix names. Example: ``output_format(Path("a.SVG")) == "svg"``.

    Raises:
        RenderError: the suffix is not one of ``FORMATS``.
    """
    fmt = out.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise RenderError(
            f"{out}: unknown picture format {fmt or '(no suffix)'!r}; the suffix picks it: "
            f"one of {', '.join('.' + f for f in FORMATS)} (e.g. -o {out.with_suffix('.png')})"
        )
    return fmt


def render(dot_source: str, out: Path, *, verbose: bool = False) -> Path:
    """Write ``dot_source`` to ``out`` as the format its suffix names (png, svg, pdf, dot);
    ``verbose`` keeps Fontconfig's warnings (see ``picture_bytes``).

    Example: ``render(graph_dot(plan), Path("plan.png"))``.

    Raises:
        RenderError: an unknown suffix, no Graphviz for a picture, or ``out`` cannot be
            written (its folder is missing, say).
    """
    fmt = output_format(out)
    data = (dot_source.encode() if fmt == "dot"
            else picture_bytes(dot_source, fmt, out, verbose=verbose))
    try:
        out.write_bytes(data)
    except OSError as exc:
        raise RenderError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out
