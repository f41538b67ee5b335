"""Ray Compiled Graph's named semaphores: removed once the Ray that made them is gone.

Ray CG's channels (Ray's mutable objects) make POSIX named semaphores,
``/dev/shm/sem.hdr<PID>-<N>`` and ``/dev/shm/sem.obj<PID>-<N>``, ``<PID>`` the raylet's (or
another Ray process's), and never unlink them: hundreds pile up per test run. The tests
(tests/conftest.py) and the benches that run Ray CG call :func:`install` first: the Ray
clusters that this process and its children start then keep their session folders in a
temporary folder of their own (``RAY_TMPDIR``), whose logs name every process of those
clusters; at exit the semaphores of those processes, once they are gone, are unlinked, and
the folder removed. Other people's semaphores (other sessions, other users, live ones) are
never touched: only names carrying the pid of a process of our own clusters, and only
after that process has exited.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

SHM = Path("/dev/shm")
OWNER = "CGC_RAY_TMPDIR_OWNER"  # the pid of the process that made the folder
# "[2026-12-07 23:41:28,127 I 8711 8711] (raylet) main.cc:283: ...": raylet.out's first line
_RAYLET_LINE = re.compile(r"^\[[^\]]*? [A-Z] (\d+) \d+\]")
_LOG_PID = re.compile(r"_(\d+)\.(?:log|out|err)$")  # python-core-worker-<id>_<pid>.log


def ray_pids(ray_tmp: Path) -> set[int]:
    """The pids of every Ray process that the session folders under ``ray_tmp`` name.

    Example:
        >>> ray_pids(Path("/nonexistent"))
        set()

    Raises:
        Nothing: unreadable logs are skipped.
    """
    pids: set[int] = set()
    for logs in ray_tmp.glob("ray/session_*/logs"):
        for log in logs.iterdir():
            m = _LOG_PID.search(log.name)
            if m:
                pids.add(int(m.group(1)))
        try:
            with open(logs / "raylet.out") as f:
                m = _RAYLET_LINE.match(f.readline())
        except OSError:
            continue
        if m:
            pids.add(int(m.group(1)))
    return pids


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def semaphores_of(pids: set[int]) -> list[Path]:
    """Ray CG's named semaphores in /dev/shm made by one of ``pids``.

    Example:
        >>> semaphores_of(set())
        []

    Raises:
        Nothing: a missing /dev/shm gives ``[]``.
    """
    if not pids or not SHM.is_dir():
        return []
    pattern = re.compile(r"sem\.(?:hdr|obj)(\d+)-\d+$")
    out = []
    for path in SHM.iterdir():
        m = pattern.match(path.name)
        if m and int(m.group(1)) in pids:
            out.append(path)
    return sorted(out)


def remove_leftovers(ray_tmp: Path, wait_s: float = 10.0) -> list[Path]:
    """Unlink the semaphores of the Ray processes under ``ray_tmp`` that have exited.

    Waits up to ``wait_s`` for them to exit (Ray's processes go shortly after
    ``ray.shutdown()``); the semaphores of one still alive are kept. Returns those removed.

    Example:
        >>> remove_leftovers(Path("/nonexistent"), wait_s=0)
        []

    Raises:
        Nothing: a semaphore that vanished meanwhile is skipped.
    """
    pids = ray_pids(ray_tmp)
    deadline = time.monotonic() + wait_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    removed = []
    for path in semaphores_of({p for p in pids if not _alive(p)}):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def install() -> Path | None:
    """Give this process's (and its children's) Ray clusters a temporary folder; clean at exit.

    A no-op (``None``) where an enclosing process already did (its folder is inherited
    through ``RAY_TMPDIR``) or where ``RAY_TMPDIR`` was set by the user. At exit, after
    Ray's own shutdown, :func:`remove_leftovers` runs and the folder is removed.

    Example: ``ray_leftovers.install()`` before the first ``ray.init()``.

    Raises:
        OSError: the temporary folder cannot be made.
    """
    if os.environ.get("RAY_TMPDIR"):
        return None
    # Short: Ray's unix sockets live below it, and their paths are limited to 107 bytes.
    base = "/tmp" if Path("/tmp").is_dir() else None
    ray_tmp = Path(tempfile.mkdtemp(prefix="cgc-ray-", dir=base))
    os.environ["RAY_TMPDIR"] = str(ray_tmp)
    os.environ[OWNER] = str(os.getpid())
    atexit.register(_clean, ray_tmp)
    return ray_tmp


def _clean(ray_tmp: Path) -> None:
    """At exit of the process that installed ``ray_tmp``: its leftovers, then the folder."""
    if os.environ.get(OWNER) != str(os.getpid()):
        return  # a forked child inherited the handler: the owner cleans
    remove_leftovers(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)
