"""tools/bench/ray_leftovers.py: Ray Compiled Graph's named semaphores (/dev/shm/sem.*) of a
process's own Ray clusters are gone once it exits; nobody else's are touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "bench"))
import ray_leftovers  # noqa: E402

SCRIPT = """
import json, sys
sys.path.insert(0, {tools!r})
import ray_leftovers
tmp = ray_leftovers.install()
import ray
from ray.dag import InputNode

@ray.remote
class A:
    def f(self, x):
        return x + 1

ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
with InputNode() as inp:
    dag = A.remote().f.bind(inp)
graph = dag.experimental_compile()
assert ray.get(graph.execute(1)) == 2
graph.teardown()
made = ray_leftovers.semaphores_of(ray_leftovers.ray_pids(tmp))
print(json.dumps({{"tmp": str(tmp), "made": [str(p) for p in made]}}))
"""


def test_a_ray_cg_run_leaves_no_semaphore_and_no_folder(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_TMPDIR", ray_leftovers.OWNER, "RAY_ADDRESS")}
    script = tmp_path / "cg.py"
    script.write_text(SCRIPT.format(tools=str(ROOT / "tools" / "bench")))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["made"], "Ray CG made no named semaphore: nothing was checked"
    assert [p for p in seen["made"] if Path(p).exists()] == []
    assert not Path(seen["tmp"]).exists()


def test_semaphores_of_live_or_foreign_processes_are_kept(tmp_path):
    logs = tmp_path / "ray" / "session_x" / "logs"
    logs.mkdir(parents=True)
    # A live process of "our" cluster (this one): its semaphore stays.
    (logs / "raylet.out").write_text(f"[2026-12-07 23:41:28,127 I {os.getpid()} 1] (raylet) x\n")
    mine = Path("/dev/shm") / f"sem.hdr{os.getpid()}-4242"
    mine.write_bytes(b"\0" * 32)
    try:
        assert ray_leftovers.ray_pids(tmp_path) == {os.getpid()}
        assert ray_leftovers.remove_leftovers(tmp_path, wait_s=0) == []
        assert mine.exists()
    finally:
        mine.unlink()
