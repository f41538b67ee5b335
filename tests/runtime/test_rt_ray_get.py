"""A Ray user's calls on cgc's own refs: ``ray.get`` takes them as it takes Ray's compiled
graph refs; ``ray.wait`` refuses them as it refuses Ray's, saying what to call instead."""

from __future__ import annotations

import pytest
import ray
import rt_graphs as G

from cgc.runtime import GetTimeoutError, RefConsumedError


@pytest.fixture(scope="module")
def pair(ray_cluster):
    with G.error_and_slow_plan().start(get_timeout=30) as g:
        yield g


def test_ray_get_takes_a_ref_and_a_list_of_refs(pair):
    ref_a, ref_b = pair.execute(1, 0)
    assert ray.get(ref_a) == 1
    assert ray.get([ref_b]) == [0]
    assert ray.get(pair.execute(5, 0), timeout=30) == [5, 0]


def test_ray_get_raises_the_methods_error_and_times_out(pair):
    bad, fine = pair.execute(-1, 0)
    with pytest.raises(G.AppError, match="negative input -1"):
        ray.get(bad)
    with pytest.raises(G.AppError):  # as in Ray: the execution's error, on every output
        ray.get(fine)
    ok, slow = pair.execute(0, 2.0)
    with pytest.raises(GetTimeoutError):
        ray.get(slow, timeout=0.1)
    assert ray.get([ok, slow], timeout=30) == [0, 2.0]
    with pytest.raises(RefConsumedError):
        ray.get(ok)


def test_ray_wait_says_what_to_call(pair):
    refs = pair.execute(2, 0)
    with pytest.raises(TypeError, match=r"ray.get\(ref, timeout=...\) or ref.get"):
        ray.wait(refs)
    with pytest.raises(TypeError, match=r"ray.get\(ref, timeout=...\) or ref.get"):
        ray.wait(refs[0])
    assert ray.get(refs) == [2, 0]
    assert str(refs[0]).startswith("<cgc.Ref execution")
