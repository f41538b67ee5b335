"""What a Ray user types around ``@cgc.trace`` and ``cgc.compile(step)``: Ray's calls on the
step's refs, and the errors of a call the step cannot take (real Ray, live actors)."""

from __future__ import annotations

import pytest
import ray
import trace_models as tm

import cgc


@pytest.fixture(scope="module")
def stages(ray_cluster):
    a, b = tm.Stage.remote(2.0), tm.Stage.remote(3.0)
    ray.get([a.fwd.remote(0), b.fwd.remote(0)])
    yield a, b
    for h in (a, b):
        ray.kill(h)


def test_ray_wait_on_a_step_ref_says_what_to_call(stages):
    a, b = stages

    @cgc.trace
    def step(x):
        return [a.fwd.remote(x), b.fwd.remote(x)]

    try:
        refs = step(1.0)
        with pytest.raises(TypeError, match=r"StepRef'> \(a cgc ref: .*ray.get\(ref, timeout"):
            ray.wait(refs)
        assert ray.get(refs, timeout=30) == [2.0, 3.0]
    finally:
        step.teardown()
