"""What a Ray user types around ``@cgc.trace`` and ``cgc.compile(step)``: Ray's calls on the
step's refs, and the errors of a call the step cannot take (real Ray, live actors)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import ray
import torch
import trace_models as tm

import cgc
from cgc.errors import CompileError, StepArgumentsError
from cgc.frontend.step_tracer import PlainRayRefusesWarning

HERE = Path(__file__)


def _line(marker: str) -> int:
    """The line of this file that ends with ``# <- marker``."""
    for i, text in enumerate(HERE.read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# <- {marker}"):
            return i
    raise AssertionError(f"no marker {marker}")


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


def test_compile_without_example_inputs_says_what_to_pass(stages):
    a, _ = stages

    def step(x, y, *, scale):
        return a.fwd.remote(x, scale=scale)

    with pytest.raises(StepArgumentsError) as info:
        cgc.compile(step)  # <- no examples
    text = str(info.value)
    assert text.startswith(f"{HERE.name}:{_line('no examples')}: cgc.compile(step): ")
    assert "pass example_inputs=(x, y) and example_kwargs={'scale': ...}" in text
    assert isinstance(info.value, CompileError)


def test_a_traced_step_called_otherwise_names_the_caller_and_takes_defaults(stages):
    a, b = stages

    @cgc.trace
    def step(x, scale=2.0):
        return b.fwd.remote(a.fwd.remote(x), scale=scale)

    @cgc.trace
    def scaled(x, scale=2.0):
        return b.fwd.remote(a.fwd.remote(x), scale=scale)

    try:
        with pytest.raises(StepArgumentsError) as info:
            step()  # <- first call without x
        assert str(info.value).startswith(f"{HERE.name}:{_line('first call without x')}: ")
        assert ray.get(step(1.0), timeout=30) == 12.0           # traced without scale
        assert ray.get(step(1.0, scale=2.0), timeout=30) == 12.0  # the default: accepted
        with pytest.raises(StepArgumentsError) as info:
            step(1.0, scale=3.0)  # <- another scale
        text = str(info.value)
        assert text.startswith(f"{HERE.name}:{_line('another scale')}: ")
        assert "pass scale= at the first call" in text
        with pytest.raises(StepArgumentsError) as info:
            step(1.0, 2.0, 3.0)  # <- too many
        assert str(info.value).startswith(f"{HERE.name}:{_line('too many')}: ")
        assert ray.get(scaled(1.0, scale=3.0), timeout=30) == 18.0  # scale is an input
        assert ray.get(scaled(1.0), timeout=30) == 12.0   # left out: its default is passed
    finally:
        step.teardown()
        scaled.teardown()


def test_an_rdt_call_plain_ray_refuses_runs_with_a_warning(stages):
    a, b = stages
    plain = tm.Plain.remote()
    try:
        def no_group(x):
            return b.fwd.remote(a.fwd_gloo.remote(x))  # <- no group

        with pytest.warns(PlainRayRefusesWarning) as got:
            plan = cgc.compile(no_group, example_inputs=(torch.ones(2),))
        text = str(got[0].message)
        assert text.startswith(f"{HERE.name}:{_line('no group')}: ")
        assert "in no gloo collective group" in text and "create_collective_group" in text
        with plan.start() as graph:   # cgc runs it all the same
            assert graph.execute(torch.ones(2)).get(timeout=30).tolist() == [6.0, 6.0]

        def not_enabled(x):
            return b.fwd.remote(plain.fwd.options(tensor_transport="gloo").remote(x))

        with pytest.warns(PlainRayRefusesWarning, match=r"no @ray.remote\(enable_tensor_tra"):
            cgc.compile(not_enabled, example_inputs=(torch.ones(2),))
        with warnings.catch_warnings():  # a call without a hint: not a word
            warnings.simplefilter("error")
            cgc.compile(lambda x: b.fwd.remote(plain.fwd.remote(x)), example_inputs=(1.0,))
    finally:
        ray.kill(plain)
