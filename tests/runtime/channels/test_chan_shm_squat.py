"""Another local user who takes the segment folder's name first cannot stop us: our
processes agree on a private folder of their own, and the squatter's is never used.

The squatter is a real process running as another uid (65534, set by subprocess as
root: no account is created); the folder root is a sticky, world-writable folder in
/dev/shm made for the test, like /dev/shm itself. Needs root (to act as another uid)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from cgc.runtime.channels import list_segments, sweep_dead_segments
from cgc.runtime.channels import shm as shm_mod

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
OTHER = 65534


@pytest.fixture
def root(monkeypatch):
    """A folder like /dev/shm (tmpfs, mode 1777) standing in for it during the test."""
    d = tempfile.mkdtemp(prefix="cgc-test-squat-", dir="/dev/shm")
    os.chmod(d, 0o1777)
    monkeypatch.setattr(shm_mod, "SHM_ROOT", d)
    yield d
    shutil.rmtree(d)


def _squat(path: str, kind: str = "dir") -> None:
    """Create ``path`` as another user: a forked child that drops to uid 65534 first (a
    fresh interpreter could not run: this venv lives in root's home)."""
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        code = 1
        try:
            os.setgid(OTHER)
            os.setuid(OTHER)
            if kind == "dir":
                os.mkdir(path, 0o777)
                os.chmod(path, 0o777)  # open to all: whoever used it, the squatter reads it
            elif kind == "file":
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            else:
                os.symlink(kind, path)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"could not squat {path}"
    assert os.lstat(path).st_uid == OTHER


def _primary(root: str) -> str:
    return os.path.join(root, f"cgc-{os.geteuid()}")


@pytest.mark.parametrize("kind", ["dir", "file", "symlink"])
def test_a_squatted_name_is_skipped_for_a_private_folder(root, kind):
    target = os.path.join(root, "ours-too")  # a squatter's link could point anywhere
    os.mkdir(target, 0o700)
    _squat(_primary(root), target if kind == "symlink" else kind)
    s = shm_mod.Segment.create("cgc-sq-a", 64)
    try:
        folder = shm_mod.segment_dir()
        assert folder == _primary(root) + ".1"
        st = os.lstat(folder)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
        assert stat.S_IMODE(st.st_mode) == 0o700
        assert os.listdir(folder) == ["cgc-sq-a"]
        assert list_segments("cgc-sq-") == ["cgc-sq-a"]
        shm_mod.Segment.attach("cgc-sq-a").close()
        if kind == "dir":
            assert os.listdir(_primary(root)) == []  # nothing of ours in the squat
        assert os.listdir(target) == []
    finally:
        s.close()
    assert list_segments("cgc-sq-") == []


def test_squatted_fallback_names_are_skipped_too(root):
    for name in ("", ".1", ".2", ".4"):
        _squat(_primary(root) + name)
    s = shm_mod.Segment.create("cgc-sq-b", 64)
    assert shm_mod.segment_dir() == _primary(root) + ".3"
    s.close()


_CHILD = """
    import json, os, signal, sys, time
    from cgc.runtime.channels import janitor, list_segments, shm
    root, name, what = sys.argv[1], sys.argv[2], sys.argv[3]
    shm.SHM_ROOT = root
    if what == "create":
        time.sleep(max(0.0, float(sys.argv[4]) - time.time()))  # all at once
        seg = shm.Segment.create(name, 64)
    elif what == "attach":
        seg = shm.Segment.attach(name)
        seg.mv[0] = 7  # the parent sees it: one mapping
    elif what == "watched":  # a driver: its janitor removes its graph's segments at its death
        seg = shm.Segment.create(name + "-c1", 64)
        janitor.watch(name, [])
        print(json.dumps([shm.segment_dir(), list_segments(name)]), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    print(json.dumps([shm.segment_dir(), list_segments(name)]), flush=True)
"""


def _child(root: str, name: str, what: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(_CHILD), root, name, what,
                             *extra], stdout=subprocess.PIPE, text=True)


def _out(p: subprocess.Popen) -> list:
    import json

    out, _ = p.communicate(timeout=60)
    return json.loads(out.splitlines()[0])


def test_processes_starting_at_once_under_a_squat_agree_on_one_folder(root):
    _squat(_primary(root))
    at = str(time.time() + 4.0)  # start together (each is a fresh interpreter)
    kids = [_child(root, f"cgc-sq-c{i}", "create", at) for i in range(6)]
    folders = {_out(p)[0] for p in kids}
    assert folders == {_primary(root) + ".1"}
    assert sorted(os.listdir(_primary(root) + ".1")) == []  # each removed its own at exit
    assert os.listdir(_primary(root)) == []


def test_another_process_finds_the_fallback_even_after_the_squat_is_gone(root):
    _squat(_primary(root))
    s = shm_mod.Segment.create("cgc-sq-d", 64)
    try:
        shutil.rmtree(_primary(root))  # the squatter leaves: the name is free again
        folder, names = _out(_child(root, "cgc-sq-d", "attach"))
        assert folder == _primary(root) + ".1" and names == ["cgc-sq-d"]
        assert s.mv[0] == 7
        assert not os.path.exists(_primary(root))  # nobody of ours made a second folder
    finally:
        s.close()


def test_sweep_and_janitor_clean_the_fallback(root):
    _squat(_primary(root))
    s = shm_mod.Segment.create("cgc-sq-e", 64)
    pid, start, ns = s.creator
    shm_mod._SEG_HDR.pack_into(s.mm, 0, shm_mod._SEG_MAGIC, 1, pid, 0, start + 1000, ns)
    assert "cgc-sq-e" in sweep_dead_segments()  # "its creator is gone"
    s.close()
    p = _child(root, "cgc-sqf", "watched")
    folder, names = _out(p)
    assert p.returncode == -signal.SIGKILL
    assert folder == _primary(root) + ".1" and names == ["cgc-sqf-c1"]
    deadline = time.monotonic() + 30
    while list_segments("cgc-sqf") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list_segments("cgc-sqf") == [], "the janitor did not clean the fallback folder"
