"""The three workloads on one real GPU, their actors sharing it: tensors between actors
bind to CUDA IPC (and, in the fake-hosts test mode, to real NCCL with two ranks on the one
device); tokens, losses and rewards equal the single-process reference run on the same
GPU, exactly. The drop-in runs the Ray programs (live ``.remote()`` GPU actors)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import llm_decode  # noqa: E402
import pipe_train  # noqa: E402
import ray_llm_decode  # noqa: E402
import ray_rl_loop  # noqa: E402
import ray_train_1f1b  # noqa: E402
import rl_loop  # noqa: E402
import rl_policy  # noqa: E402
import tinygpt  # noqa: E402
import train_1f1b  # noqa: E402

pytestmark = pytest.mark.gpu
GPUS = 0.3  # three actors fit one GPU


@pytest.fixture(scope="module", autouse=True)
def shipped(ray_cluster):
    import ray

    for m in (tinygpt, pipe_train, rl_policy):
        ray.cloudpickle.register_pickle_by_value(m)
    yield
    for m in (tinygpt, pipe_train, rl_policy):
        ray.cloudpickle.unregister_pickle_by_value(m)


def _start(dag, name):
    import cgc

    return cgc.compile(dag, name=name).start(get_timeout=120)


def _bound(g, transport):
    assert {b.transport for b in g.comm_bindings.values()} == {transport}


def test_decode_on_one_gpu_is_exact(transport):
    cfg = tinygpt.SIZES["tiny"]
    ps = tinygpt.prompts(cfg, 2, 2, 6)
    want = tinygpt.reference(cfg, ps, 8)
    with _start(llm_decode.build_dag(num_gpus=GPUS, transport="nccl"), "decode") as g:
        _bound(g, transport)
        got = tinygpt.generate(g.execute, lambda r: r.get(), ps, 8)
    assert all((a == b).all() for a, b in zip(got, want, strict=True))


def test_gpt2_small_decode_is_exact():
    """The benchmark's size: fp16, 12 layers, two stages on the GPU (CUDA IPC)."""
    cfg = tinygpt.SIZES["gpt2-small"]
    ps = tinygpt.prompts(cfg, 2, 4, 16)
    want = tinygpt.reference(cfg, ps, 12)
    with _start(llm_decode.build_dag("gpt2-small", 2, 2, 4, num_gpus=GPUS), "decode") as g:
        got = tinygpt.generate(g.execute, lambda r: r.get(), ps, 12)
    assert all((a == b).all() for a, b in zip(got, want, strict=True))


def test_training_on_one_gpu_is_exact(transport):
    cfg = pipe_train.SIZES["tiny"]
    want = pipe_train.reference(cfg, 2, 3)
    with _start(train_1f1b.build_dag(num_gpus=GPUS, transport="nccl"), "train") as g:
        _bound(g, transport)
        rows = [[r.get() for r in g.execute(*pipe_train.batch(cfg, k))] for k in range(3)]
    assert rows == want


def test_rl_on_one_gpu_is_exact(transport):
    cfg = rl_policy.SIZES["tiny"]
    want = rl_policy.reference(cfg, 4)
    with _start(rl_loop.build_dag(num_gpus=GPUS, transport="nccl"), "rl") as g:
        _bound(g, transport)
        rows = [[r.get() for r in g.execute(it)] for it in range(4)]
    assert rows == want


def _kill(actors) -> None:
    import ray

    for a in actors:
        ray.kill(a)


def test_ray_programs_through_the_drop_in_on_one_gpu():
    import ray

    import cgc.ray_compat

    cgc.ray_compat.install()
    try:
        cfg = tinygpt.SIZES["tiny"]
        ps = tinygpt.prompts(cfg, 2, 2, 6)
        actors = ray_llm_decode.make_stages(num_gpus=GPUS)
        c = ray_llm_decode.build_dag(actors).experimental_compile()
        got = tinygpt.generate(c.execute, ray.get, ps, 8)
        c.teardown()
        _kill(actors)  # the GPU holds three 0.3 actors at a time
        want = tinygpt.reference(cfg, ps, 8)
        assert all((a == b).all() for a, b in zip(got, want, strict=True))

        tcfg = pipe_train.SIZES["tiny"]
        stages = ray_train_1f1b.make_stages(num_gpus=GPUS)
        c = ray_train_1f1b.build_dag(stages, tcfg["microbatches"]).experimental_compile()
        rows = [ray.get(c.execute(*pipe_train.batch(tcfg, k))) for k in range(3)]
        c.teardown()
        _kill(stages)
        assert rows == pipe_train.reference(tcfg, 2, 3)

        rcfg = rl_policy.SIZES["tiny"]
        rollouts, learner = ray_rl_loop.make_actors(num_gpus=GPUS)
        c = ray_rl_loop.build_dag(rollouts, learner).experimental_compile()
        rows = [ray.get(c.execute(it)) for it in range(4)]
        c.teardown()
        _kill([*rollouts, learner])
        assert rows == rl_policy.reference(rcfg, 4)
    finally:
        cgc.ray_compat.uninstall()
