"""Where a single-process workload step spends its time (torch profiler, top ops), to read
the floor rows of bench_workloads.py: ``python tools/bench/profile_floor.py decode``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch  # noqa: E402


def decode(size: str = "gpt2-small", batch: int = 8) -> None:
    import tinygpt

    cfg = tinygpt.SIZES[size]
    st = tinygpt.GPTStage(cfg, 0, cfg["n_layers"], 1, batch)
    print("device", st.device, "dtype", st.dtype, "threads", torch.get_num_threads())
    p = tinygpt.prompts(cfg, 1, batch, 32)[0]
    tok = st.forward(p, 0, 0)
    for pos in range(32, 40):
        tok = st.forward(tok[:, None], 0, pos)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 40
    for pos in range(40, 40 + n):
        tok = st.forward(tok[:, None], 0, pos)
    print(f"decode step {1e3 * (time.perf_counter() - t0) / n:.2f} ms (batch {batch})")
    layer = st.layers[0]
    x = torch.randn(batch, 1, cfg["d_model"], device=st.device, dtype=st.dtype)
    k, v = st.caches[0][0]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        layer.forward(x, k, v, 60, cfg["n_heads"])
    torch.cuda.synchronize()
    print(f"one layer {1e3 * (time.perf_counter() - t0) / 200:.3f} ms")
    t0 = time.perf_counter()
    for _ in range(2000):
        torch.add(x, x)
    torch.cuda.synchronize()
    print(f"one torch.add launch {1e6 * (time.perf_counter() - t0) / 2000:.1f} us")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for pos in range(80, 90):
            tok = st.forward(tok[:, None], 0, pos)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


def train(size: str = "gpu") -> None:
    import pipe_train

    cfg = pipe_train.SIZES[size]
    stages = [pipe_train.TrainStage(cfg, s, 2) for s in range(2)]
    for k in range(2):
        pipe_train.local_step(stages, cfg, k)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(2, 7):
        pipe_train.local_step(stages, cfg, k)
    torch.cuda.synchronize()
    print(f"train step {1e3 * (time.perf_counter() - t0) / 5:.1f} ms")
    t0 = time.perf_counter()
    pipe_train.batch(cfg, 0)
    print(f"batch() {1e3 * (time.perf_counter() - t0):.1f} ms (CPU randn + teacher)")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        pipe_train.local_step(stages, cfg, 9)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10))


if __name__ == "__main__":
    for what in sys.argv[1:] or ["decode", "train"]:
        globals()[what]()
