"""The CPU rows of two commits side by side: this checkout against ``BASE_REF``.

    python tools/bench/compare.py 07a3e87                      # compile and echo rows
    python tools/bench/compare.py c0526eb --rows compile --rounds 5
    python tools/bench/compare.py HEAD~1 --rows echo,echo_ray

The base side is a git worktree of ``BASE_REF`` in a temporary folder with a venv of its
own (``venv --system-site-packages``, cgc installed editable with ``--no-deps``: Ray,
torch and the rest are those of the python that runs this script, its venv's included);
the current side is this checkout with the python
that runs this script. Both sides run the same measuring code (this checkout's
``tools/bench`` scripts and model files), so only cgc differs. Rounds interleave the
sides (A B, then B A, ...) so that the noise of a shared machine hits both; absolute
times drift, so read the ratio ``current ÷ base`` (below 1 is faster); the ratios of the
best samples and of the quiet samples' medians are printed too (``table`` says why).

Rows:

* ``compile``: wall time of a whole ``python -m cgc.cli.main compile FILE`` process, for
  ``examples/ray_chain.py`` and for a 1000-call model file in Ray's API
  (``bench_compile.ray_model_source``); 3 processes per side per round.
* ``echo``: the CPU echo of an int (``execute(1).get()``, p50 over 2000 after 50 of
  warm-up), one ``bench_runtime.py --cases "echo, int" --systems cgc`` process per side
  per round.
* ``echo_ray``: the same echo beside Ray Compiled Graph in one process
  (``--systems ray_cgraph,cgc``): each side's cgc ÷ Ray CG.
* ``hop`` / ``hop_reader``: the CPU share of a 16 KiB CUDA IPC hop, ``hop_breakdown.py
  --device cpu`` (the communicator over ``ShmIpcDevice``; p50 of 1000): the whole hop, and
  the reader's receive path alone (header read -> ``recv`` returned); with both rows, one
  run per side per round serves the two.
* ``ipc_send`` / ``ipc_recv``: the CUDA IPC communicator's value path in one process
  (``ipc_path.py``: two ranks over ``ShmIpcDevice``, 20,000 hops of 1 KiB, no Ray, no
  wake-ups): rank 0's ``send`` and rank 1's ``recv``, medians; one run serves both rows.

The temporary worktree and venv are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import site
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench_compile import ray_model_source

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tools" / "bench"
ROWS = ("compile", "echo", "echo_ray", "hop", "hop_reader", "ipc_send", "ipc_recv")
COMPILES_PER_ROUND = 3
ECHO_CASE = "echo, int"


@dataclass
class Side:
    """One side of the comparison: a checkout and the python that has it installed."""

    name: str  # "base" or "current"
    label: str  # short commit hash (``-dirty`` when the checkout has changes)
    python: str
    root: Path
    env: dict[str, str]


@dataclass
class Row:
    """One line of the table: samples per side, and how to print them."""

    title: str
    unit: str  # "s", "µs" or "×" (a ratio per side)
    samples: dict[str, list[float]] = field(default_factory=lambda: {"base": [], "current": []})


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(
            f"compare: {' '.join(cmd)} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    return proc.stdout


def _side_env(config_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CGC_CONFIG_DIR"] = str(config_dir)  # its own signing key, never the user's
    env["RAY_ADDRESS"] = "local"  # a cluster of its own, never another session's
    env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    return env


def _check_installed(side: Side, cwd: Path) -> None:
    """Fail unless ``side.python`` imports cgc (and its runtime) from ``side.root``."""
    out = _run(
        [side.python, "-P", "-c",
         "import cgc, cgc.runtime; print(cgc.__file__); print(cgc.runtime.__file__)"],
        cwd=cwd, env=side.env, timeout=120,
    )
    for path in out.split():
        if not Path(path).resolve().is_relative_to(side.root.resolve()):
            raise SystemExit(
                f"compare: the {side.name} side's python {side.python} imports {path}, "
                f"not the checkout {side.root}"
            )


def _parent_site_packages() -> list[str]:
    """The site-packages of this python's venv (none outside a venv), in its search order."""
    if sys.prefix == sys.base_prefix:
        return []
    return [p for p in site.getsitepackages() if Path(p).is_relative_to(sys.prefix)]


def _see_parent_packages(venv: Path) -> None:
    """Let ``venv`` import the packages of the venv running this script, when there is one.

    Why: ``venv --system-site-packages`` made from a venv's python shows the *base*
    interpreter's packages, not the venv's, so Ray, torch or protobuf could be missing or
    other versions. A ``.pth`` file adds the venv's site-packages as plain paths (after the
    base venv's own, before the system's); its ``.pth`` files are not run, so its editable
    cgc stays out.
    """
    dirs = _parent_site_packages()
    if dirs:
        purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
        Path(purelib, "_cgc_compare_parent.pth").write_text("".join(f"{d}\n" for d in dirs))


@contextmanager
def base_side(ref: str, tmp: Path) -> Iterator[Side]:
    """A worktree of ``ref`` and a venv with it installed; both removed on exit.

    Raises:
        SystemExit: ``ref`` names no commit, or the install fails.
    """
    try:
        sha = _git("rev-parse", "--verify", "--short", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"compare: {ref!r} names no commit of {ROOT}") from None
    wt, venv = tmp / "base", tmp / "base-venv"
    _git("worktree", "add", "--detach", str(wt), sha)
    try:
        env = _side_env(tmp / "base-config")
        print(f"compare: installing {sha} into {venv}", file=sys.stderr, flush=True)
        # Why --without-pip and --no-build-isolation: the machine's pip and setuptools
        # (seen through --system-site-packages) install offline, in a second.
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                        str(venv)], check=True)
        _see_parent_packages(venv)
        py = str(venv / "bin" / "python")
        pip = [py, "-m", "pip", "install", "-q", "--no-deps", "-e", str(wt)]
        if subprocess.run([*pip, "--no-build-isolation"], cwd=tmp).returncode != 0:
            _run(pip, cwd=tmp, env=env, timeout=600)  # isolated build: fetches setuptools
        yield Side("base", sha, py, wt, env)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT)


def current_side(tmp: Path) -> Side:
    """This checkout, run by the python running this script."""
    label = _git("rev-parse", "--short", "HEAD")
    if _git("status", "--porcelain", "--untracked-files=no"):
        label += "-dirty"
    return Side("current", label, sys.executable, ROOT, _side_env(tmp / "current-config"))


# ------------------------------------------------------------------------------ rows
def compile_seconds(side: Side, model: Path, tmp: Path) -> float:
    """Wall time of one whole ``cgc compile`` process of ``model``."""
    out = tmp / f"{side.name}.cgplan"
    cmd = [side.python, "-P", "-m", "cgc.cli.main", "compile", str(model), "-o", str(out)]
    t0 = time.perf_counter()
    _run(cmd, cwd=tmp, env=side.env, timeout=300)
    return time.perf_counter() - t0


def echo_results(side: Side, systems: str, tmp: Path) -> dict[str, float]:
    """p50 (µs) of the int echo per system, from one ``bench_runtime.py`` process."""
    out = tmp / f"{side.name}-echo.json"
    _run(
        [side.python, str(BENCH / "bench_runtime.py"), "--cases", ECHO_CASE,
         "--systems", systems, "--rounds", "1", "--json", str(out)],
        cwd=tmp, env=side.env, timeout=600,
    )
    per = json.loads(out.read_text())["results"][ECHO_CASE]
    return {s: float(r["p50_us"][0]) for s, r in per.items()}


def _shared_run(kind: str, side: Side, fresh: bool, run: Callable[[], dict[str, float]]
                ) -> dict[str, float]:
    """``run()``'s figures, one run serving two rows: ``fresh=False`` returns the side's
    last ``kind`` run when there is one not yet reused (the second row of a round reads
    the run of the first)."""
    key = (kind, side.name)
    if not fresh and key in _LAST:
        return _LAST.pop(key)
    res = run()
    if fresh:
        _LAST[key] = res
    return res


_LAST: dict[tuple[str, str], dict[str, float]] = {}


def hop_results(side: Side, tmp: Path, fresh: bool) -> dict[str, float]:
    """Medians (µs) of ``hop_breakdown.py --device cpu`` at 16 KiB, from one process
    (``fresh``: see ``_shared_run``; the ``hop_reader`` row reads the ``hop`` row's run)."""
    def run() -> dict[str, float]:
        out = tmp / f"{side.name}-hop.json"
        _run([side.python, str(BENCH / "hop_breakdown.py"), "--device", "cpu", "--sizes",
              "16384", "--iters", "1000", "--json", str(out)],
             cwd=tmp, env=side.env, timeout=600)
        return json.loads(out.read_text())["rounds"][0]["16384"]
    return _shared_run("hop", side, fresh, run)


def ipc_path_results(side: Side, tmp: Path, fresh: bool) -> dict[str, float]:
    """Medians (µs) of ``ipc_path.py``'s send and recv, from one process (``fresh``: see
    ``_shared_run``; the ``ipc_recv`` row reads the ``ipc_send`` row's run)."""
    def run() -> dict[str, float]:
        out = tmp / f"{side.name}-ipc.json"
        _run([side.python, str(BENCH / "ipc_path.py"), "--json", str(out)],
             cwd=tmp, env=side.env, timeout=600)
        return json.loads(out.read_text())
    return _shared_run("ipc", side, fresh, run)


def measures(rows: list[str], tmp: Path) -> list[tuple[Row, Callable[[Side], float]]]:
    """(row, one measurement of a side) for each line of the table, in order."""
    out: list[tuple[Row, Callable[[Side], float]]] = []
    if "compile" in rows:
        big = tmp / "ray_1000_calls.py"
        big.write_text(ray_model_source(calls=1000, actors=8))
        for model, title in ((ROOT / "examples" / "ray_chain.py", "examples/ray_chain.py"),
                             (big, "1000-call Ray-API model file")):
            out.append((Row(f"compile {title} (whole process)", "s"),
                        lambda s, m=model: compile_seconds(s, m, tmp)))
    if "echo" in rows:
        out.append((Row(f"echo ({ECHO_CASE}), p50 of 2000", "µs"),
                    lambda s: echo_results(s, "cgc", tmp)["cgc"]))
    if "echo_ray" in rows:
        def vs_ray(s: Side) -> float:
            r = echo_results(s, "ray_cgraph,cgc", tmp)
            return r["cgc"] / r["ray_cgraph"]
        out.append((Row("echo beside Ray CG in one process: cgc ÷ Ray CG p50", "×"), vs_ray))
    for key, col in (("hop", "hop"), ("hop_reader", "reader")):
        if key in rows:
            out.append((Row(f"CUDA IPC hop on CPU (ShmIpcDevice), 16 KiB: {col}, p50", "µs"),
                        lambda s, c=col: hop_results(s, tmp, fresh=c == "hop")[c]))
    for key, col in (("ipc_send", "send"), ("ipc_recv", "recv")):
        if key in rows:
            out.append((Row(f"CUDA IPC value path in one process (ShmIpcDevice), 1 KiB: {col}, "
                            "p50", "µs"),
                        lambda s, c=col: ipc_path_results(s, tmp, fresh=c == "send")[c]))
    return out


def _cell(xs: list[float], unit: str) -> str:
    fmt = {"s": "{:.2f} s", "µs": "{:.1f} µs", "×": "{:.2f}×"}[unit]
    med = fmt.format(statistics.median(xs))
    span = f" ({fmt.format(min(xs))}–{fmt.format(max(xs))})" if len(xs) > 1 else ""
    return med + span


QUIET = 1.5  # a sample within this factor of its side's fastest is a quiet one


def table(rows: list[Row], base: Side, cur: Side) -> str:
    """The markdown table: per-side median (min–max), the ratio of the medians, that of
    the best (lowest) samples and that of the medians of the quiet samples.

    Why three: on a shared 2-core machine another session's work takes a core now and
    then, and a latency sample then lands in a slow mode (the echo's 10 µs becomes
    35-45 µs) for a whole process; a median over a few rounds is then a coin toss, while
    the quiet samples of each side (within ``QUIET`` of that side's fastest) compare the
    code.
    """
    lines = [
        f"| row | base `{base.label}` | current `{cur.label}` | current ÷ base (medians) "
        "| ÷ of the best | ÷ of the quiet medians (samples) |",
        "|---|---|---|---|---|---|",
    ]
    med = statistics.median
    for row in rows:
        b, c = row.samples["base"], row.samples["current"]
        qb = [x for x in b if x <= QUIET * min(b)]
        qc = [x for x in c if x <= QUIET * min(c)]
        quiet = (f"{med(qc) / med(qb):.2f} ({len(qb)}/{len(qc)})" if qb and qc
                 else f"— ({len(qb)}/{len(qc)})")
        lines.append(f"| {row.title} | {_cell(b, row.unit)} | {_cell(c, row.unit)} "
                     f"| {med(c) / med(b):.2f} | {min(c) / min(b):.2f} | {quiet} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base_ref", metavar="BASE_REF", help="the commit to compare against")
    ap.add_argument("--rows", default="compile,echo",
                    help=f"comma-separated, of {', '.join(ROWS)} (default compile,echo)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds (default 3: 3x2000 echoes per side)")
    args = ap.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown or not rows:
        ap.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    tmp = Path(tempfile.mkdtemp(prefix="cgc-compare-"))
    try:
        with base_side(args.base_ref, tmp) as base:
            cur = current_side(tmp)
            sides = [base, cur]
            for side in sides:
                _check_installed(side, tmp)
            plan = measures(rows, tmp)
            for row, measure in plan:  # warm-up: .pyc files, signing keys, page cache
                if row.unit == "s":
                    for side in sides:
                        measure(side)
            for rnd in range(args.rounds):
                for row, measure in plan:
                    reps = COMPILES_PER_ROUND if row.unit == "s" else 1
                    for rep in range(reps):
                        flip = (rnd * reps + rep) % 2  # A B, then B A, ...
                        for side in sides[::-1] if flip else sides:
                            value = measure(side)
                            row.samples[side.name].append(value)
                            print(f"  round {rnd} {row.title[:40]:40s} {side.name:7s} "
                                  f"{value:10.3f}", file=sys.stderr, flush=True)
            print(f"{platform.node()}, {os.cpu_count()} cores, {args.rounds} rounds, "
                  f"{time.strftime('%Y-%m-%d %H:%M')}\n")
            print(table([r for r, _ in plan], base, cur))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
