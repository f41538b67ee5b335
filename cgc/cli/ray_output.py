"""What of Ray's own output ``cgc run`` shows.

- Ray's token-authentication notice ("Token authentication is enabled for this Ray
  cluster. Set RAY_AUTH_MODE=disabled to opt out...") is printed every time a local Ray
  starts. For the local Ray cgc starts itself (no ``--address``) it says nothing the user
  asked about: hidden unless ``--verbose``. Joining a cluster keeps it.
- The ``(Actor pid=...)`` prefixes of the actors' output and Ray's "[repeated 2x across
  cluster]" are coloured by Ray with ANSI codes: always plain text (``RAY_COLOR_PREFIX=0``,
  and the process's text streams drop ANSI colour codes), on a terminal too: cgc's display
  rule lets no escape sequence through (``cgc.plan_schema.display``), so a colour code
  would show as its escaped text.

Example: ``quiet_ray_output(address=None, verbose=False)`` before ``plan.start()``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

__all__ = ["quiet_ray_output", "show_progress", "PlainText", "TOKEN_AUTH_LOGGER",
           "PROGRESS_LOGGER"]

# Where the runtime says what ``start()`` is doing (starting Ray, creating actors, ...).
PROGRESS_LOGGER = "cgc.runtime.progress"

# Where Ray 2.60 logs the notice (ray/_private/authentication/authentication_token_setup.py).
TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def quiet_ray_output(address: str | None, verbose: bool) -> None:
    """Set up Ray's output for this ``cgc run`` (see the module docstring)."""
    os.environ["RAY_COLOR_PREFIX"] = "0"
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, PlainText):
            setattr(sys, name, PlainText(stream))
    if address is None and not verbose:
        # Errors (no token where one is needed) still show.
        logging.getLogger(TOKEN_AUTH_LOGGER).setLevel(logging.ERROR)


def show_progress(prefix: str) -> None:
    """Print the runtime's progress lines (``PROGRESS_LOGGER``) on stderr, each after
    ``prefix``, while a plan starts (once per process)."""
    logger = logging.getLogger(PROGRESS_LOGGER)
    if any(isinstance(h, _StderrHandler) for h in logger.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg, unused-ignore]
    """Writes to whatever ``sys.stderr`` is at the time (a CLI run in-process swaps it)."""

    @property  # type: ignore[override, unused-ignore]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # StreamHandler.__init__ sets it; the current sys.stderr is always used


_SGR = re.compile(r"\x1b\[[0-9;]*m")  # ANSI colour and style codes


class PlainText:
    """A text stream that writes through to ``stream`` without ANSI colour codes.

    Example: ``PlainText(sys.stderr).write("\x1b[36m(A pid=1)\x1b[0m hi")`` writes
    ``"(A pid=1) hi"``.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` less its colour codes; return ``len(text)``, as asked."""
        self._stream.write(_SGR.sub("", text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

