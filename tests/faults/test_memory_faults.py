"""Fault suite, memory: results buffered for refs not fetched yet are bounded in bytes, not
only in count, and refusing one more loses nothing."""

from __future__ import annotations

import fault_graphs as F
import numpy as np
import pytest

from cgc.runtime import ResultBufferFullError


def test_buffered_results_are_bounded_in_bytes(ray_cluster, leaves_nothing):
    mib = 1 << 20
    with F.echo("f_bytes").start(max_buffered_bytes=mib, max_buffered_results=100,
                                 get_timeout=30) as g:
        arrays = [np.full(mib // 4, i, dtype=np.float64) for i in range(3)]  # 2 MiB each
        refs = [g.execute(a) for a in arrays]
        # Execution 2 needs executions 0 and 1 buffered first: 4 MiB, over the 1 MiB bound
        # after the first one (the count bound, 100, is far away).
        with pytest.raises(ResultBufferFullError, match="max_buffered_bytes=1048576"):
            refs[2].get()
        # Nothing was lost or shifted: every result is still there, in order.
        for r, a in zip(refs, arrays, strict=True):
            assert np.array_equal(r.get(), a)
        assert g.buffered == 0
    leaves_nothing(g)
