"""Start-up time of the local Ray that ``cgc run`` embeds, per candidate ``ray.init`` option.

Each sample is a fresh Python process (nothing warm but the page cache) that times
``ray.init(address="local", ...)`` as ``cgc.runtime.cluster.ensure_ray`` calls it, then
the first actor's first reply (``--actors`` actors created at once, each answering one
call), then ``ray.shutdown()``. Variants run round-robin (one sample of each per repeat)
so that drift in the machine's load spreads over all of them; the table shows the median
and the spread (min-max) per variant, and the difference of the medians from the first.

    python tools/bench/bench_ray_start.py                       # every variant, 5 repeats
    python tools/bench/bench_ray_start.py --repeats 3 --variants cgc_today,metrics_off
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

# The child: time ray.init, then N actors' first replies, then shutdown; print one JSON line.
_CHILD = r"""
import json, os, sys, time
t_imp = time.perf_counter()
import ray
t_imp = time.perf_counter() - t_imp
kw = json.loads(sys.argv[1]); n = int(sys.argv[2])
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

@ray.remote
class A:
    def ping(self):
        return os.getpid()

t0 = time.perf_counter()
ray.init(**kw)
t1 = time.perf_counter()
actors = [A.remote() for _ in range(n)]
ray.get([a.ping.remote() for a in actors])
t2 = time.perf_counter()
ray.shutdown()
t3 = time.perf_counter()
print(json.dumps({"import": t_imp, "init": t1 - t0, "actors": t2 - t1, "shutdown": t3 - t2}))
"""


@dataclass
class Variant:
    """One way of starting the local Ray: extra ``ray.init`` kwargs."""

    name: str
    what: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def base_kwargs(actors: int) -> dict[str, Any]:
    """``ray.init`` kwargs as ``ensure_ray`` passes them for a plan of ``actors`` default
    actors (1 CPU each) with no custom resources.

    Example:
        >>> base_kwargs(1)["address"]
        'local'
    """
    return {"address": "local", "include_dashboard": False, "log_to_driver": True,
            "configure_logging": False, "num_cpus": max(os.cpu_count() or 1, actors)}


VARIANTS = [
    Variant("cgc_today", "as ensure_ray starts it (dashboard off, logs to the driver)"),
    # Not a variant: RAY_USAGE_STATS_ENABLED=0 is what ray.init already sets for a new
    # local cluster from a release wheel (usage_lib.set_usage_stats_enabled_via_env_var).
    Variant("metrics_off", "_system_config enable_metrics_collection=False",
            kwargs={"_system_config": {"enable_metrics_collection": False}}),
    Variant("no_prestart", "_system_config enable_worker_prestart=False, "
            "prestart_worker_first_driver=False",
            kwargs={"_system_config": {"enable_worker_prestart": False,
                                       "prestart_worker_first_driver": False}}),
    Variant("metrics_off_no_prestart", "both of the above",
            kwargs={"_system_config": {"enable_metrics_collection": False,
                                       "enable_worker_prestart": False,
                                       "prestart_worker_first_driver": False}}),
    Variant("startup_concurrency_2", "_system_config worker_maximum_startup_concurrency=2 "
            "(default: the declared CPUs; matters with --actors above the cores)",
            kwargs={"_system_config": {"worker_maximum_startup_concurrency": 2}}),
    Variant("small_store", "object_store_memory=128 MiB",
            kwargs={"object_store_memory": 128 << 20}),
    Variant("no_log_to_driver", "log_to_driver=False (not adoptable: users expect prints)",
            kwargs={"log_to_driver": False}),
    Variant("dashboard_on", "include_dashboard=True (what --dashboard would cost)",
            kwargs={"include_dashboard": True}),
]


def sample(v: Variant, actors: int) -> dict[str, float] | str:
    """One fresh-process measurement of ``v``: seconds per phase, or why it failed."""
    kw = {**base_kwargs(actors), **v.kwargs}
    p = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(kw), str(actors)],
                       capture_output=True, text=True, timeout=180)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return f"rc {p.returncode}: {(p.stderr.strip().splitlines() or ['?'])[-1][:200]}"


def main() -> int:
    """Measure the variants and print a markdown table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--actors", type=int, default=1, help="actors created after init")
    parser.add_argument("--variants", default="", help="comma-separated names (default all)")
    args = parser.parse_args()
    chosen = [v for v in VARIANTS if not args.variants or v.name in args.variants.split(",")]
    got: dict[str, list[dict[str, float]]] = {v.name: [] for v in chosen}
    for rep in range(args.repeats):
        for v in chosen:
            s = sample(v, args.actors)
            if isinstance(s, str):
                print(f"  {v.name} repeat {rep}: failed: {s}", file=sys.stderr, flush=True)
                continue
            got[v.name].append(s)
            print(f"  {v.name:18s} repeat {rep}: init {s['init']:.2f} s  actors "
                  f"{s['actors']:.2f} s  shutdown {s['shutdown']:.2f} s  (load "
                  f"{os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    med = statistics.median

    def cell(xs: list[float]) -> str:
        return f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"

    print(f"| variant | ray.init s | first {args.actors} actor(s) ready s | init + actors s "
          "| vs cgc_today | shutdown s |")
    print("|---|---|---|---|---|---|")
    base = None
    for v in chosen:
        ss = got[v.name]
        if not ss:
            print(f"| {v.name}: {v.what} | failed | | | | |")
            continue
        tot = [s["init"] + s["actors"] for s in ss]
        base = med(tot) if base is None else base
        print(f"| {v.name}: {v.what} | {cell([s['init'] for s in ss])} | "
              f"{cell([s['actors'] for s in ss])} | {cell(tot)} | {med(tot) - base:+.2f} | "
              f"{cell([s['shutdown'] for s in ss])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
