"""The ranks of a communicator as threads of one test process (CPU stand-ins of devices)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def run_ranks(*fns: Any, timeout: float = 60.0) -> list[Any]:
    """Run one function per rank in threads; return results (exceptions re-raised)."""
    out: list[Any] = [None] * len(fns)
    errs: list[BaseException | None] = [None] * len(fns)

    def wrap(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errs[i] = exc

    ts = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
        assert not t.is_alive(), "a rank hung"
    for e in errs:
        if e is not None:
            raise e
    return out


def ended_by(call: Callable[[], Any], end: Callable[[], None], settle: float = 0.2,
             timeout: float = 30.0) -> BaseException | None:
    """Run ``call`` in a thread, let it block for ``settle`` s, run ``end`` (e.g. an abort)
    here, and return what ``call`` raised (None if it returned). Fails if it still runs."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["e"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(settle)
    end()
    t.join(timeout)
    assert not t.is_alive(), "the call still blocks"
    return box.get("e")
