"""The floor under cgc: a chain of plain processes passing a counter through shared memory.

No Ray and no cgc runtime: one shared-memory file of u32 words (one per cache line), Linux
futexes through ctypes (the syscall handle and numbers of cgc's ``futex.py``, nothing
else), and the same wait policy shape as cgc's channels (spin with a yield for a
bounded time, then sleep on the futex). Word ``k - 1`` is what process ``k`` waits on and
word ``k`` what it sets; the driver sets word 0 and waits on word N, so a chain of N
processes is N + 1 hops, like a cgc or Ray CG chain of N actors driven from the driver. A
chain of one process is the two-process ping-pong (the floor for an echo).

    chain = RawChain(8, spin_us=100)       # starts 8 worker processes
    samples = chain.run(iters=500, seconds=4.0)
    chain.close()

The worker side runs as ``python raw_chain.py FILE N K SPIN_US`` and imports nothing heavy,
so starting 128 of them is quick.
"""

from __future__ import annotations

import ctypes
import importlib.util
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

__all__ = ["RawChain"]


def _load_futex() -> ModuleType:
    """cgc's futex syscall wrapper module (``runtime/channels/futex.py``), loaded from its file.

    Why only this file, and by path: the chain stays a floor with no cgc runtime in it (it
    borrows only the syscall number, the futex op codes and the ctypes ``syscall`` handle;
    the waits below are its own raw calls), and importing it as
    ``cgc.runtime.channels.futex`` would first import the ``cgc.runtime`` package (~0.3 s
    per worker process, against ~10 ms for this file).
    """
    path = Path(__file__).resolve().parents[2] / "runtime" / "channels" / "futex.py"
    spec = importlib.util.spec_from_file_location("_cgc_bench_futex", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_futex = _load_futex()
_SYS_FUTEX, _FUTEX_WAIT, _FUTEX_WAKE = _futex._SYS_FUTEX, _futex._FUTEX_WAIT, _futex._FUTEX_WAKE
_WAKE_ALL = _futex._INT_MAX
_syscall = _futex._syscall

_LINE_WORDS = 16  # u32 words per 64-byte cache line: each word on its own line
_STOP = 0xFFFFFFFF
_TS = _futex._Timespec(0, 100_000_000)  # sleeps re-check every 100 ms (a lost process never hangs us)


class _Words:
    """The shared words of one chain, mapped from ``path``."""

    def __init__(self, path: str, count: int) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self.mm = mmap.mmap(fd, count * 64)
        finally:
            os.close(fd)
        self.arr = (ctypes.c_uint32 * (count * _LINE_WORDS)).from_buffer(self.mm)
        self.base = ctypes.addressof(self.arr)

    def get(self, i: int) -> int:
        return self.arr[i * _LINE_WORDS]

    def set(self, i: int, value: int) -> None:
        self.arr[i * _LINE_WORDS] = value
        _syscall(_SYS_FUTEX, self.base + 64 * i, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)

    def wait(self, i: int, target: int, spin_s: float) -> int:
        """Wait until word ``i`` equals ``target`` or ``_STOP``; return the value."""
        v = self.arr[i * _LINE_WORDS]
        if v == target or v == _STOP:
            return v
        end = time.perf_counter() + spin_s
        while time.perf_counter() < end:
            os.sched_yield()  # why: on a full machine the writer may need this core
            v = self.arr[i * _LINE_WORDS]
            if v == target or v == _STOP:
                return v
        addr, ts = self.base + 64 * i, ctypes.addressof(_TS)
        while True:
            _syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, v, ts, None, 0)  # while it is still v
            v = self.arr[i * _LINE_WORDS]
            if v == target or v == _STOP:
                return v

    def close(self) -> None:
        del self.arr
        self.mm.close()


def _worker(path: str, n: int, k: int, spin_us: float) -> None:
    words = _Words(path, 2 * n + 2)
    words.set(n + 1 + k, 1)  # ready
    spin_s, seq = spin_us * 1e-6, 1
    while True:
        v = words.wait(k - 1, seq, spin_s)
        words.set(k, v)
        if v == _STOP:
            break
        seq += 1
    words.close()


class RawChain:
    """N worker processes in a chain, driven from this process (see module docstring)."""

    def __init__(self, n: int, spin_us: float = 100.0, start_timeout: float = 120.0) -> None:
        self.n, self.spin_s = n, spin_us * 1e-6
        self.path = f"/dev/shm/cgc-bench-raw-{os.getpid()}-{n}"
        count = 2 * n + 2  # n + 1 chain words, then one ready word per worker
        with open(self.path, "wb") as f:
            f.write(b"\0" * (count * 64))
        self.words = _Words(self.path, count)
        self.procs = [subprocess.Popen([sys.executable, __file__, self.path, str(n), str(k),
                                        str(spin_us)]) for k in range(1, n + 1)]
        deadline = time.monotonic() + start_timeout
        while not all(self.words.get(n + 1 + k) for k in range(1, n + 1)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.close()
                raise RuntimeError(f"raw chain of {n}: the workers did not start")
            time.sleep(0.01)
        self.seq = 0

    def run(self, iters: int, seconds: float, warmup: int = 20) -> list[float]:
        """Per-execution round trips in seconds: up to ``iters``, stopping after ``seconds``."""
        out: list[float] = []
        end = None
        for i in range(warmup + iters):
            if i == warmup:
                end = time.perf_counter() + seconds
            self.seq += 1
            t0 = time.perf_counter()
            self.words.set(0, self.seq)
            self.words.wait(self.n, self.seq, self.spin_s)
            if end is not None:
                t1 = time.perf_counter()
                out.append(t1 - t0)
                if t1 > end:
                    break
        return out

    def close(self) -> None:
        """Stop the workers (the stop value travels the chain) and remove the file."""
        self.words.set(0, _STOP)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.words.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
