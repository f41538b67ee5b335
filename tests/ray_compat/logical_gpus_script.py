"""Run the Ray GPU programs (``ray_gpu_programs``) through ``cgc.ray_compat`` on a local
Ray with logical GPUs (this machine has none): live ``num_gpus`` actors are GPU actors to
the compiler, and their communicators bind to the CPU communicator.

Usage: ``python logical_gpus_script.py [PROGRAM ...]`` (default: all). Prints one JSON
line, ``{program: report}``; a program that raised gets ``{"error": "Type: message"}``.
Its own Ray, not the test session's: the session's cluster declares no GPUs.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ray  # noqa: E402
import ray_gpu_programs as progs  # noqa: E402

import cgc.ray_compat  # noqa: E402


def main(names: list[str]) -> int:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray.init(address="local", num_cpus=8, num_gpus=2, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    # Ray's workers cannot import the test folder: its classes travel by value.
    ray.cloudpickle.register_pickle_by_value(progs)
    cgc.ray_compat.install()
    out: dict[str, object] = {}
    try:
        for name in names or list(progs.PROGRAMS):
            try:
                out[name] = progs.PROGRAMS[name]().as_dict()
            except Exception as exc:  # noqa: BLE001 - reported per program
                out[name] = {"error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-3000:]}
    finally:
        cgc.ray_compat.uninstall()
        ray.shutdown()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
