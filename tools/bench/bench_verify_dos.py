"""How long ``cgc check`` takes on plans built to make the verifier work (issue 20).

Usage::

    python tools/bench/bench_verify_dos.py [--scale 1.0] [--only NAME] [--timeout 600]

For each generator in ``tests/plan_schema/verify/dos_plans.py`` (at the audit's sizes times ``--scale``)
it writes the plan to a temporary file, runs ``cgc check`` on it in a fresh process, and
prints one line: the file's size, the wall time of the check, that process's peak RSS,
seconds per MB, and what ``cgc check`` answered. Target (issue 20): at most 2 s per MB.
A check still running after ``--timeout`` seconds is killed and reported as such.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "plan_schema" / "verify"))

from dos_plans import GENERATORS  # noqa: E402

from cgc.plan_schema import write_plan  # noqa: E402

# The check, then the process's own peak RSS (VmHWM of its address space, which exec made
# new: getrusage's ru_maxrss would also count the parent this process was started from).
_CHECK = (
    "import sys\n"
    "from cgc.cli.main import main\n"
    "rc = main(['check', sys.argv[1]])\n"
    "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0]\n"
    "open(sys.argv[2], 'w').write(hwm.split()[1])\n"
    "sys.exit(rc)\n"
)


def _sizes(kw: dict[str, int], scale: float) -> dict[str, int]:
    # capacity is a setting, not a size: it stays at the audit's value
    return {k: v if k == "capacity" else max(2, int(v * scale)) for k, v in kw.items()}


def run_check(path: Path, timeout: float) -> tuple[float, int, int | None, str]:
    """(seconds, peak RSS in bytes, exit code or None when killed, first line of output).

    Peak RSS is what the checking process reports for itself at the end (``VmHWM``).
    """
    with tempfile.TemporaryFile() as out:  # a file, not a pipe: the output can be long
        actions = [(os.POSIX_SPAWN_DUP2, out.fileno(), 1), (os.POSIX_SPAWN_DUP2, out.fileno(), 2)]
        t0 = time.perf_counter()
        peak_file = Path(str(path) + ".peak")
        pid = os.posix_spawn(sys.executable, [sys.executable, "-c", _CHECK, str(path),
                                              str(peak_file)],
                             os.environ, file_actions=actions)
        deadline = t0 + timeout
        killed = False
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.perf_counter() > deadline:
                os.kill(pid, 9)
                done, status, usage = os.wait4(pid, 0)
                killed = True
                break
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode(errors="replace")
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    code = None if killed else os.waitstatus_to_exitcode(status)
    peak = int(peak_file.read_text()) * 1024 if peak_file.exists() else 0
    return elapsed, peak, code, (lines[0] if lines else "")[:160]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0,
                    help="fraction of the audit's sizes (capacity stays)")
    ap.add_argument("--only", choices=sorted(GENERATORS), action="append",
                    help="run only this generator (repeatable)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per check")
    args = ap.parse_args(argv)
    print(f"{'plan':<18} {'sizes':<30} {'MB':>7} {'check s':>9} {'s/MB':>7} "
          f"{'peak RSS':>11}  result")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or list(GENERATORS):
            make, kw = GENERATORS[name]
            sizes = _sizes(kw, args.scale)
            path = Path(tmp) / f"{name}.cgplan"
            write_plan(make(**sizes), path)  # (freed before the check starts)
            mb = path.stat().st_size / 1e6
            secs, rss, code, line = run_check(path, args.timeout)
            what = f"exit {code}: {line}" if code is not None else f"killed after {secs:.0f} s"
            label = ",".join(f"{k}={v}" for k, v in sizes.items())
            print(f"{name:<18} {label:<30} {mb:7.2f} {secs:9.2f} {secs / mb:7.2f} "
                  f"{rss / 2**20:8.0f} MB  {what}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
