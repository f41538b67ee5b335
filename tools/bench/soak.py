"""Soak: many executions through one started graph; latency drift and memory growth.

Runs an echo graph (default 1,000,000 executions) and a 3-actor chain (default 100,000)
with numpy payloads, one started graph each, and reports per window of executions the p50
and p99 latency plus the resident memory (anonymous RSS, so shared-memory rings that are
mapped once do not count as growth) of the driver and of every actor. Growth is measured
from the end of the first window (warm-up) to the end of the run. Not a test: a tool whose
figures go into BENCHMARKS.md.

    python tools/bench/soak.py                       # full run (a few minutes)
    python tools/bench/soak.py --echo 20000 --chain 5000 --windows 4   # quick look
    python tools/bench/soak.py --json soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import ray

import cgc
from cgc import InputNode


@ray.remote(num_cpus=0)
class Echo:
    def echo(self, x):
        return x

    def pid(self):
        return os.getpid()


@ray.remote(num_cpus=0)
class Stage:
    def step(self, x):
        return x

    def pid(self):
        return os.getpid()


def rss_anon_kib(pid: int) -> int:
    """Anonymous resident memory of ``pid`` in KiB (``/proc/<pid>/status`` RssAnon)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def _pct(sorted_us: list[float], q: float) -> float:
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))]


def soak(name: str, dag, pids_of, n: int, windows: int, make_input) -> dict:
    """Run ``n`` executions of ``dag`` in ``windows`` windows; return the figures."""
    plan = cgc.compile(dag, name=name)
    rows = []
    with plan.start(get_timeout=60) as g:
        pids = {"driver": os.getpid(), **pids_of(g)}
        per = max(1, n // windows)
        for w in range(windows):
            lat = []
            for i in range(per):
                x = make_input(w * per + i)
                t = time.perf_counter()
                g.execute(x).get()
                lat.append((time.perf_counter() - t) * 1e6)
            lat.sort()
            rows.append({"window": w, "executions": per, "p50_us": round(_pct(lat, 0.5), 1),
                         "p99_us": round(_pct(lat, 0.99), 1),
                         "rss_anon_kib": {k: rss_anon_kib(p) for k, p in pids.items()}})
            print(f"{name} window {w}: p50 {rows[-1]['p50_us']} us, p99 {rows[-1]['p99_us']} "
                  f"us, rss {rows[-1]['rss_anon_kib']}", flush=True)
    first, last = rows[0], rows[-1]
    growth = {k: round((last["rss_anon_kib"][k] - first["rss_anon_kib"][k]) / 1024, 2)
              for k in first["rss_anon_kib"]}
    return {"graph": name, "executions": per * windows, "windows": rows,
            "p50_drift": round(last["p50_us"] / first["p50_us"], 2),
            "p99_drift": round(last["p99_us"] / first["p99_us"], 2),
            "rss_growth_mib_after_warmup": growth}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--echo", type=int, default=1_000_000)
    ap.add_argument("--chain", type=int, default=100_000)
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--payload", type=int, default=1024, help="numpy payload bytes")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False)
    payload = np.arange(args.payload // 8, dtype=np.float64)

    def make(i: int) -> np.ndarray:
        return payload + i

    def actor_pids(g) -> dict[str, int]:
        return {n: ray.get(h.pid.remote()) for n, h in g.actors.items()}

    out = []
    a = Echo.bind()
    with InputNode() as inp:
        echo = a.echo.bind(inp)
    out.append(soak("echo", echo, actor_pids, args.echo, args.windows, make))
    s1, s2, s3 = Stage.bind(), Stage.bind(), Stage.bind()
    with InputNode() as inp:
        chain = s3.step.bind(s2.step.bind(s1.step.bind(inp)))
    out.append(soak("chain3", chain, actor_pids, args.chain, args.windows, make))
    print()
    print("| graph | executions | p50 first → last window | p99 first → last | "
          "RSS growth after warm-up (MiB) |")
    print("|---|---|---|---|---|")
    for r in out:
        w0, wn = r["windows"][0], r["windows"][-1]
        growth = ", ".join(f"{k} {v:+.1f}" for k, v in r["rss_growth_mib_after_warmup"].items())
        print(f"| {r['graph']} | {r['executions']:,} | {w0['p50_us']} → {wn['p50_us']} µs | "
              f"{w0['p99_us']} → {wn['p99_us']} µs | {growth} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    main()
