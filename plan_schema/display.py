"""How text that may come from a plan is shown: one escaping rule for every output path.

A plan is read before it is trusted (``cgc inspect``, ``cgc check``), so every string in it
(names, files, embedded sources, hints, and the error messages built from them) is shown
so that it cannot drive a terminal: what is shown is what the plan holds. ``escape`` writes
every character that is not plainly visible as a Python-style escape (``\\r``, ``\\x1b``,
``\\u202e``): C0 and C1 controls (CR, ESC, NUL, ...), DEL, bidi overrides and isolates
(U+202A-U+202E, U+2066-U+2069), the line and paragraph separators (U+2028, U+2029), and
every other character Python does not call printable. A line longer than ``MAX_LINE``
characters is cut, saying how much was cut.

``EscapedText`` applies the rule to a whole text stream (``cgc``'s stdout and stderr),
keeping its line ends. Imports nothing beyond the standard library (the runtime uses it).

>>> escape("ok\\x1b[1A\\x1b[2Ksigned\\r!")
'ok\\\\x1b[1A\\\\x1b[2Ksigned\\\\r!'
>>> escape("a\\u202eb")
'a\\\\u202eb'
"""

from __future__ import annotations

import re
import sys
from typing import Any

__all__ = ["escape", "escape_lines", "code_lines", "EscapedText", "unescaped", "MAX_LINE"]

MAX_LINE = 4096  # characters of one shown line; the rest is cut, saying how much

# Characters that are shown as they are; everything else not printable is escaped.
_UNSAFE = re.compile(r"[^\n\t -~]")
_ANY_UNSAFE = re.compile(r"[^ -~]")  # the same, line ends and tabs included
_NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t", "\0": "\\0"}  # escapes shown by name
_LINE_END = re.compile(r"\r\n|\r|\n")  # what Python's compiler takes as a line end


def _char(m: re.Match[str]) -> str:
    """One character as shown: itself when printable and not a bidi control, else escaped."""
    c = m.group()
    if c.isprintable() and not ("\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069"
                                or c in "\u200e\u200f\u061c"):
        return c
    n = ord(c)
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _cut(line: str, max_line: int) -> str:
    """``line`` cut to ``max_line`` characters, saying how many were left out."""
    if len(line) <= max_line:
        return line
    return f"{line[:max_line]}... ({len(line) - max_line:,} more characters)"


def escape(text: str, *, max_line: int = MAX_LINE) -> str:
    """``text`` as one line safe to show: every control, bidi and non-printable character
    (line ends and tabs too) escaped, and cut at ``max_line`` characters.

    Example: ``escape("a\\rb") == "a\\\\rb"``.

    >>> escape("x" * 10, max_line=4)
    'xxxx... (6 more characters)'

    Raises:
        Nothing.
    """
    return _cut(_ANY_UNSAFE.sub(_char, text), max_line)


def escape_lines(text: str, *, max_line: int = MAX_LINE) -> str:
    """``text`` safe to show, its ``\\n`` line ends kept: every other control character
    (CR included) escaped, each line cut at ``max_line`` characters.

    Example: ``escape_lines("a\\nb\\rc") == "a\\nb\\\\rc"``.

    >>> escape_lines("ok\\n\\x1b[2Kno")
    'ok\\n\\\\x1b[2Kno'

    Raises:
        Nothing.
    """
    return "\n".join(_cut(_UNSAFE.sub(_char, line), max_line) for line in text.split("\n"))


def code_lines(source: str) -> list[str]:
    """Python source split into lines as Python's compiler splits it (``\\r\\n``, ``\\r``
    and ``\\n`` end a line; form feeds, U+2028 and U+2029 do not), each line escaped.

    Example: ``code_lines("a = 1\\rb = 2") == ["a = 1", "b = 2"]``.

    >>> code_lines("x = 1\\u2028y = 2\\r\\nz")
    ['x = 1\\\\u2028y = 2', 'z']

    Raises:
        Nothing.
    """
    lines = _LINE_END.split(source)
    if lines and lines[-1] == "":
        lines.pop()
    return [_cut(_UNSAFE.sub(_char, line).replace("\t", "    "), MAX_LINE) for line in lines]


class EscapedText:
    """A text stream that writes ``escape_lines`` of everything written to it: what reaches
    ``stream`` holds no control sequence, only its ``\\n`` line ends. Lines are not cut
    here (``cgc inspect --json`` stays JSON: its escapes read back as the same string);
    the formatters cut the lines they build from a plan.

    Example: ``sys.stdout = EscapedText(sys.stdout)`` (``cgc``'s entry point does so).

    >>> import io; s = io.StringIO(); _ = EscapedText(s).write("a\\x1b[1Ab\\n"); s.getvalue()
    'a\\\\x1b[1Ab\\n'
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` escaped; return ``len(text)``, as asked."""
        self.stream.write(escape_lines(text, max_line=sys.maxsize))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def unescaped(stream: Any) -> Any:
    """The stream under ``EscapedText`` (and wrappers that pass attributes through), for
    cgc's own terminal control only (a progress bar's CR), never for text from a plan.

    Example: ``click.progressbar(..., label=escape(name), file=unescaped(sys.stderr))``.

    Raises:
        Nothing.
    """
    inner = getattr(stream, "stream", None)
    return unescaped(inner) if inner is not None else stream
