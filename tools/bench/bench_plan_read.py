"""How much time and memory reading a plan file costs when the file is hostile (issue 44).

Usage::

    python tools/bench/bench_plan_read.py [--nodes 999990] [--dir /tmp] [--only NAME]

Each case runs one ``cgc`` command in a fresh process and prints its wall time, that
process's peak RSS (``VmHWM``), its exit code and the first line it printed:

- ``zeros``: ``cgc check`` of 1 GiB of zeros (target: refused in <= 1 s, <= 100 MB);
- ``dev-zero``, ``fifo``: ``cgc check /dev/zero`` and of a FIFO (same target);
- ``big-code``: ``cgc run`` of an unsigned plan of ``--nodes`` nodes (~110 MiB) that
  embeds a module (its header says it needs trust): refused (target <= 2 s, <= 300 MB);
- ``big-classes``: ``cgc run`` of the same plan without code, whose classes come from a
  module nobody trusts (the header says it needs no trust; since format 1.8 it lists the
  class modules, so the refusal is decided from the header: target <= 2 s, <= 300 MB);
- ``big-check``: ``cgc check`` of that plan. The plan has no lowered programs, so the
  structure check refuses it: this measures reading, the trust walk and the refusal;
- ``legal-check``: ``cgc check`` of a legal plan with lowered programs (``actors_channels``
  of ``tests/plan_schema/verify/dos_plans.py``: ``--legal-actors`` actors, a chain over
  ``--legal-channels`` host channels), which passes the whole check, deadlock simulation
  included (target <= 2 s/MB).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.planfile import write_plan_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "plan_schema" / "verify"))

_CMD = (
    "import sys\n"
    "from cgc.cli.main import main\n"
    "rc = main(sys.argv[2:])\n"
    "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0]\n"
    "open(sys.argv[1], 'w').write(hwm.split()[1])\n"
    "sys.exit(rc)\n"
)


def big_plan(nodes: int, code: bool) -> bytes:
    """An unsigned chain of ``nodes`` calls on one actor of the untrusted module
    ``evil_mod``; ``code``: it also embeds that module's source."""
    plan = pb.Plan(name="big")
    g = plan.graph
    g.num_positional = 1
    a = g.actors.add(name="w0")
    a.cls.module, a.cls.qualname = "evil_mod", "Worker"
    if code:
        g.modules.add(name="evil_mod", source="class Worker:\n    def f(self, x): return x\n",
                      source_file="evil_mod.py")
    g.nodes.add(id=0, kind=pb.INPUT, name="input")
    loc = pb.SourceLoc(file="model_" + "x" * 60 + ".py")
    for i in range(1, nodes):
        loc.line = i
        g.nodes.add(id=i, kind=pb.CALL, actor="w0", method="f", name=f"n{i}", bind_index=i,
                    args=[pb.Arg(ref=pb.NodeRef(node=i - 1))], loc=loc)
    g.nodes.add(id=nodes, kind=pb.OUTPUT, name="output",
                args=[pb.Arg(ref=pb.NodeRef(node=nodes - 1))])
    plan.config.capacity = 1
    return write_plan_bytes(plan)


def run(args: list[str], timeout: float) -> tuple[float, int, int | None, str]:
    """(seconds, peak RSS bytes, exit code or None when killed, first line of output)."""
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile() as peak:
        actions = [(os.POSIX_SPAWN_DUP2, out.fileno(), 1), (os.POSIX_SPAWN_DUP2, out.fileno(), 2)]
        t0 = time.perf_counter()
        pid = os.posix_spawn(sys.executable, [sys.executable, "-c", _CMD, peak.name, *args],
                             os.environ, file_actions=actions)
        code: int | None = None
        while time.perf_counter() - t0 < timeout:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        seconds = time.perf_counter() - t0
        out.seek(0)
        first = out.read(400).decode(errors="replace").splitlines()[:1]
        rss = int(Path(peak.name).read_text() or 0) * 1024
        return seconds, rss, code, first[0] if first else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=999_990)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--only", default=None)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--legal-actors", type=int, default=4096)
    ap.add_argument("--legal-channels", type=int, default=100_000)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-plan-read-", dir=a.dir))
    try:
        cases: dict[str, list[str]] = {}
        zeros = work / "zeros.cgplan"
        with open(zeros, "wb") as f:
            f.truncate(1 << 30)  # 1 GiB of zeros (sparse)
        cases["zeros"] = ["check", str(zeros)]
        cases["dev-zero"] = ["check", "/dev/zero"]
        fifo = work / "fifo.cgplan"
        os.mkfifo(fifo)
        cases["fifo"] = ["check", str(fifo)]
        wanted = [n for n in ("big-code", "big-classes", "big-check") if a.only in (None, n)]
        if any(n != "big-code" for n in wanted):
            (work / "classes.cgplan").write_bytes(big_plan(a.nodes, code=False))
        if "big-code" in wanted:
            (work / "code.cgplan").write_bytes(big_plan(a.nodes, code=True))
        cases["big-code"] = ["run", str(work / "code.cgplan"), "--iters", "1"]
        cases["big-classes"] = ["run", str(work / "classes.cgplan"), "--iters", "1"]
        cases["big-check"] = ["check", str(work / "classes.cgplan")]
        if a.only in (None, "legal-check"):
            from dos_plans import actors_channels

            legal = actors_channels(actors=a.legal_actors, channels=a.legal_channels)
            (work / "legal.cgplan").write_bytes(write_plan_bytes(legal))
        cases["legal-check"] = ["check", str(work / "legal.cgplan")]
        for name, args in cases.items():
            if a.only not in (None, name):
                continue
            path = Path(args[1])
            size = path.stat().st_size if path.is_file() else 0
            s, rss, code, first = run(args, a.timeout)
            per_mb = f" {s / (size / 1e6):.3f} s/MB" if size > 1e6 and "check" in name else ""
            print(f"{name:12} {size / 2**20:9.1f} MiB {s:7.2f} s {rss / 1e6:7.0f} MB "
                  f"rc {code}{per_mb}: {first[:150]}", flush=True)
    finally:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
