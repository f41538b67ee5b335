"""The ref wrappers alone (no cluster): what they hold and how they print, in Ray's form."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cgc.ray_compat.refs import CgcDAGFuture, CgcDAGRef


def _dag(multi: bool) -> SimpleNamespace:
    return SimpleNamespace(_multi=multi, get_id=lambda: "g7", _get_timeout=None)


@pytest.mark.parametrize("cls,ray_name", [(CgcDAGRef, "CompiledDAGRef"),
                                          (CgcDAGFuture, "CompiledDAGFuture")])
def test_indices_and_str(cls, ray_name):
    cgc_ref = SimpleNamespace(exec_index=3, output_index=1, _done=False)
    one = cls(_dag(False), cgc_ref)
    assert (one._execution_index, one._channel_index) == (3, None)
    assert str(one) == f"{ray_name}(g7, execution_index=3, channel_index=None)"
    multi = cls(_dag(True), cgc_ref)
    assert multi._channel_index == 1
    assert str(multi) == f"{ray_name}(g7, execution_index=3, channel_index=1)"


def test_ray_timeouts_in_cgc_terms():
    from cgc.ray_compat.compiled import _timeout
    from cgc.ray_compat.refs import FOREVER_S, _cgc_timeout

    # ray.get(ref, timeout=...): None is the graph's default, negative is forever.
    assert _cgc_timeout(None, 7.0) == 7.0
    assert _cgc_timeout(-1, 7.0) == _cgc_timeout(-5, None) == FOREVER_S
    assert _cgc_timeout(0, 7.0) == 0 and _cgc_timeout(2.5, None) == 2.5
    # experimental_compile's timeouts: None is DAGContext's, 0 immediate, -1 forever.
    assert _timeout(None, 10.0) == 10.0
    assert _timeout(-1, 10.0) == FOREVER_S
    assert 0 < _timeout(0, 10.0) < 1e-3
