"""A driver that starts a graph (a 3-actor chain, a large value in flight so data blocks
exist too), reports its segment prefix and actor PIDs, and kills itself with SIGKILL.

Run by tests/faults/test_driver_faults.py: ``python driver_killed.py PLAN RAY_ADDRESS``.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
import ray

import cgc.runtime as rt
from cgc.runtime.channels import janitor, list_segments


def main() -> None:
    plan_path, address = sys.argv[1], sys.argv[2]
    g = rt.load(plan_path, trust=True).start(address=address, get_timeout=30)
    big = np.ones(1 << 21)  # 16 MiB: travels in data blocks, not ring slots
    assert float(g.execute(big).get().sum()) == float(1 << 21) * 7
    held = g.execute(big)  # a result the dead driver never fetches
    pending = g.execute(60.0)  # and one still running
    del held, pending
    pids = [ray.get(h.pid.remote(), timeout=30) for h in g.actors.values()]
    print("RESULT" + json.dumps({"prefix": g.prefix, "pids": pids,
                                 "segments": len(list_segments(g.prefix)),
                                 "janitor": janitor.janitor_pid()}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
