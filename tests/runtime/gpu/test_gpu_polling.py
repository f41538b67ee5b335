"""``gpu.polling.poll_until``: the back-off loop NCCL's non-blocking calls and CUDA events
are waited with (``nccl_lib.CtypesNccl._wait_ready``, ``streams.wait_event``)."""

from __future__ import annotations

import time

import pytest

from cgc.runtime.channels.errors import ChannelTimeoutError
from cgc.runtime.comm.sidechannel import SideKind
from cgc.runtime.gpu.polling import poll_until
from cgc.runtime.gpu.streams import wait_event


def test_done_at_once_returns_without_sleeping_or_polling():
    calls = []
    poll_until(lambda: True, time.monotonic() - 1, lambda: calls.append(1), "never")
    assert calls == []  # done() is checked before the deadline


def test_polls_between_checks_until_done():
    end = time.monotonic() + 0.2
    polls = []
    poll_until(lambda: time.monotonic() >= end, None, lambda: polls.append(1), "x")
    assert 1 <= len(polls) <= 5  # every 50 ms


def test_deadline_raises_the_callers_message_and_poll_can_end_the_wait():
    t0 = time.monotonic()
    with pytest.raises(ChannelTimeoutError, match=r"^copy not done$"):
        poll_until(lambda: False, t0 + 0.05, None, "copy not done")
    assert time.monotonic() - t0 >= 0.05  # not before its deadline (how late: tools/bench)

    def boom() -> None:
        raise RuntimeError("aborted")

    with pytest.raises(RuntimeError, match="aborted"):
        poll_until(lambda: False, None, boom, "x")


def test_wait_event_keeps_its_message():
    with pytest.raises(ChannelTimeoutError, match=r"^the copy not done within 0\.02 s$"):
        wait_event(lambda: False, 0.02, None, "the copy")


def test_side_kinds_are_plain_strings_on_the_wire():
    import pickle

    assert [k.value for k in SideKind] == ["hello", "hello-ack", "ack", "desc"]
    assert SideKind("ack") is SideKind.ACK and SideKind.ACK == "ack"
    assert type(SideKind.ACK.value) is str
    assert pickle.dumps((SideKind.ACK.value, 1)) == pickle.dumps(("ack", 1))
