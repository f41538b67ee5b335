"""Two Ctrl-C in quick succession at random moments of ``cgc run`` (issue 44, item 2).

Usage::

    python tools/bench/bench_interrupts.py [--tries 50] [--min-delay 0.3] [--max-delay 8]

Each try compiles nothing new: it runs ``cgc run`` of the chain example (500,000
executions; ``python -m cgc.cli.entry``, the console script's entry point), sends SIGINT after a random delay (from ``--min-delay`` to ``--max-delay``
seconds: Ray's start-up, the graph's, the run), a second one 0-5 ms later, and records the
exit code, the seconds from the first SIGINT to the exit (killed after 10 s), whether
stderr holds a traceback, and the Ray processes and shared-memory segments left. Target:
every try exits 130 within 10 s, no traceback, nothing left. Python's own start-up
(before cgc's code runs: the interpreter imports ``site``, some 0.05 s) is not cgc's to
guard; the default ``--min-delay`` starts after it, while cgc's command line is imported.
"""

from __future__ import annotations

import argparse
import collections
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cli"))

from test_run_interrupt import double_ctrl_c  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=50)
    ap.add_argument("--min-delay", type=float, default=0.3)
    ap.add_argument("--max-delay", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=44)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as d:
        plan = Path(d) / "chain.cgplan"
        subprocess.run([sys.executable, "-m", "cgc.cli.main", "compile",
                        str(ROOT / "examples" / "chain.py"), "-o", str(plan)],
                       check=True, capture_output=True, timeout=120)
        outcomes: collections.Counter[str] = collections.Counter()
        worst = 0.0
        for i in range(a.tries):
            delay = rng.uniform(a.min_delay, a.max_delay)
            gap = rng.uniform(0, 0.005)
            rc, took, err, left, segments = double_ctrl_c(plan, delay, gap)
            tb = "Traceback" in err or "KeyboardInterrupt" in err
            ok = rc == 130 and took < 10 and not tb and not left and not segments
            worst = max(worst, took)
            outcomes["ok" if ok else f"rc {rc}{' traceback' if tb else ''}"
                      f"{' procs left' if left else ''}{' shm left' if segments else ''}"] += 1
            print(f"try {i + 1:2}: at {delay:5.2f} s, gap {gap * 1000:4.1f} ms: rc {rc}, "
                  f"{took:5.2f} s{' TRACEBACK' if tb else ''}"
                  f"{f' {len(left)} processes left' if left else ''}"
                  f"{f' {len(segments)} segments left' if segments else ''}", flush=True)
            if not ok:
                print("   " + err[-600:].replace("\n", "\n   "), flush=True)
        print(f"{a.tries} tries: " + ", ".join(f"{n} x {k}" for k, n in outcomes.items())
              + f"; slowest exit {worst:.2f} s after the first SIGINT")


if __name__ == "__main__":
    main()
