"""The ref wrappers alone (no cluster): what they hold and how they print, in Ray's form."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from cgc.ray_compat.refs import CgcDAGFuture, CgcDAGRef  # noqa: E402


def _dag(multi: bool) -> SimpleNamespace:
    return SimpleNamespace(_multi=multi, get_id=lambda: "g7", _get_timeout=None)


@pytest.mark.parametrize("cls,ray_name", [(CgcDAGRef, "CompiledDAGRef"),
                                          (CgcDAGFuture, "CompiledDAGFuture")])
def test_indices_and_str(cls, ray_name):
    cgc_ref = SimpleNamespace(exec_index=3, output_index=1, _done=False)
    one = cls(_dag(False), cgc_ref)
    assert (one._execution_index, one._channel_index) == (3, None)
    assert str(one) == f"{ray_name}(cgc g7, execution_index=3, channel_index=None)"
    multi = cls(_dag(True), cgc_ref)
    assert multi._channel_index == 1
    assert str(multi) == f"{ray_name}(cgc g7, execution_index=3, channel_index=1)"
