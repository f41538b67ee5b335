"""The ``cgc`` program's entry point: takes over Ctrl-C before any heavy import.

The console script imports this module, then calls ``main()``. Importing the command line
(``cgc.cli.main``: click, protobuf, hashlib) takes a second or more on a loaded machine; a
Ctrl-C meanwhile would end the process with Python's ``KeyboardInterrupt`` traceback (and
rc -2). So this module imports nothing but the standard library's ``signal`` and ``sys``
(``import cgc`` and ``import cgc.cli`` import nothing of cgc's own), and ``main()`` holds
SIGINT while the command line is imported: a Ctrl-C then ends the program quietly, with
"Aborted." and exit code 130, once the import is done or abandoned.

Run as ``cgc ARGS`` or ``python -m cgc.cli.entry ARGS``.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

__all__ = ["main", "forget_caught_interrupts"]

# The exit code of a command ended by Ctrl-C (128 + SIGINT), as cgc.cli.main returns it.
ABORTED = 130


def main() -> int:
    """Run the ``cgc`` command line; a Ctrl-C while it loads ends it with exit code 130.

    Example (what the ``cgc`` console script does)::

        import sys
        from cgc.cli.entry import main
        sys.exit(main())

    Raises:
        SystemExit: never itself; the exit code is returned (``cgc.cli.main.main``'s, or
            130 for a Ctrl-C during the import).
    """
    seen: list[int] = []

    def interrupted(signum: int, frame: Any) -> None:
        seen.append(signum)
        if len(seen) == 1:  # the first one stops the import; later ones are absorbed
            raise KeyboardInterrupt

    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        signal.signal(signal.SIGINT, interrupted)
    try:
        from cgc.cli import main as command_line
    except KeyboardInterrupt:
        return _aborted()
    if seen:  # one that some import caught and dropped: still an abort
        return _aborted()
    try:
        if ours:  # cgc.cli.main.main() takes over from Python's handler
            signal.signal(signal.SIGINT, signal.default_int_handler)
        return command_line.main()
    except KeyboardInterrupt:  # before main() began to handle Ctrl-C: nothing started yet
        return _aborted()

def _aborted() -> int:
    """Say "Aborted." and make later Ctrl-Cs harmless (the exit code is decided)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stderr.write("Aborted.\n")
    sys.stderr.flush()
    return ABORTED


def forget_caught_interrupts() -> None:
    """Under ``python -m``, keep the exit code of a Ctrl-C that was caught and handled.

    Why: CPython (3.11, 3.12) flags any ``exec`` of a string (dataclasses, namedtuple) that
    ends in ``KeyboardInterrupt``, even one a caller then catches, and a ``-m`` run whose
    flag is set ends by SIGINT (rc -2) instead of its ``sys.exit`` code. A string ``exec``
    that ends normally clears the flag. (The ``cgc`` script, a file, is not affected.)

    >>> forget_caught_interrupts()

    Raises:
        Nothing.
    """
    exec("None")  # noqa: S102 - a constant: clears the flag, runs nothing else


if __name__ == "__main__":
    code = main()
    forget_caught_interrupts()
    sys.exit(code)
