"""CUDA-graph replay on a real GPU: a captured call equals its eager self bit for bit; a new
shape is captured as a variant of its own; a call that cannot be captured runs eagerly and
says why; the graphed decode pipeline's tokens equal eager decode exactly, with every step
replayed after warm-up; capture turned off at start runs everything eagerly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import llm_decode  # noqa: E402
import tinygpt  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_captured_call_equals_eager_and_keeps_variants_apart():
    import torch

    from cgc.runtime.gpu.cuda_graphs import CapturedCall

    w = torch.randn(64, 64, device="cuda")

    def f(x, scale):
        return torch.relu(x.to("cuda", non_blocking=True) @ w) * scale

    call = CapturedCall(f, "f")
    for i in range(6):
        x = torch.randn(8, 64)  # a CPU input: captured through a pinned buffer
        assert torch.equal(call(x, 2.0), f(x, 2.0)), i
    assert call.stats.as_dict() == {"captures": 1, "replays": 4, "eager": 2, "fallbacks": {}}
    for _ in range(4):  # another shape and another constant: variants of their own
        y = torch.randn(3, 64, device="cuda")
        assert torch.equal(call(y, 3.0), f(y, 3.0))
    assert call.stats.captures == 2 and len(call._graphs) == 2


def test_a_call_that_syncs_the_host_runs_eagerly_and_says_why():
    import torch

    from cgc.runtime.gpu.cuda_graphs import CapturedCall

    def g(x):
        return x * float(x.sum())  # .item(): a host synchronisation

    call = CapturedCall(g, "g")
    x = torch.ones(4, device="cuda")
    for _ in range(5):
        assert torch.equal(call(x), x * 4.0)
    st = call.stats.as_dict()
    assert st["captures"] == 0 and st["eager"] == 5 and st["replays"] == 0
    assert any("cannot be captured" in why for why in st["fallbacks"].values())


@pytest.mark.parametrize("size,batch", [("tiny", 2), ("gpt2-small", 4)])
def test_graphed_decode_equals_eager_decode(ray_cluster, size, batch):
    import ray

    import cgc

    ray.cloudpickle.register_pickle_by_value(tinygpt)
    cfg = tinygpt.SIZES[size]
    ps = tinygpt.prompts(cfg, 2, batch, 8)
    want = tinygpt.reference(cfg, ps, 12)
    try:
        dag = llm_decode.build_dag(size, 2, 2, batch, num_gpus=0.5, cuda_graph=True)
        with cgc.compile(dag, name="graphed").start(get_timeout=120) as g:
            got = tinygpt.generate(g.execute, lambda r: r.get(), ps, 12)
            stats = g.cuda_graph_stats()
        assert all((a == b).all() for a, b in zip(got, want, strict=True))
        assert len(stats) == 2  # both stages' steps
        for name, st in stats.items():
            assert st["fallbacks"] == {} and st["captures"] >= 2, (name, st)  # 2 microbatches
            assert st["replays"] > st["eager"], (name, st)
        with cgc.compile(dag, name="eager").start(get_timeout=120, cuda_graphs=False) as g:
            again = tinygpt.generate(g.execute, lambda r: r.get(), ps, 12)
            assert g.cuda_graph_stats() == {}
        assert all((a == b).all() for a, b in zip(again, want, strict=True))
    finally:
        ray.cloudpickle.unregister_pickle_by_value(tinygpt)
