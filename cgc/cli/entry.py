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

__all__ = ["main"]

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


if __name__ == "__main__":
    sys.exit(main())
