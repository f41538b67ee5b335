"""Shared memory is unguessable and owner-checked: planted names are never attached to."""

from __future__ import annotations

import os
import shutil

import pytest

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.channels import (
    SegmentExistsError,
    ShmRingReader,
    ShmRingWriter,
    ShmSecurityError,
    list_segments,
    segment_dir,
)
from cgc.runtime.channels import shm as shm_mod
from cgc.runtime.comm import CpuCommunicator
from cgc.runtime.endpoints import (
    channel_name,
    communicator_prefix,
    new_graph_prefix,
    open_reader,
    open_writer,
)

ROOT = os.geteuid() == 0


def _path(name):
    return os.path.join(segment_dir(), name)


def _genuine_ring_bytes(prefix):
    """The bytes of a real, fully initialised ring (what a forger would copy)."""
    w = ShmRingWriter.create(prefix + "genuine", slots=2, slot_bytes=256)
    w.write("from the forger")
    with open(_path(prefix + "genuine"), "rb") as f:
        data = f.read()
    w.close()
    return data


def _plant(name, data, mode):
    fd = os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
    os.write(fd, data)
    os.fchmod(fd, mode)
    os.close(fd)


def _channel():
    return pb.Channel(id=3, kind=pb.CHAN_HOST, writer="a", readers=["@driver"], slots=2,
                      slot_bytes=4096)


def test_graph_prefixes_are_random():
    a, b = new_graph_prefix(), new_graph_prefix()
    assert a != b and a.startswith("cgc-") and len(a) == len(b) == 28
    assert communicator_prefix(a, 2).startswith(a) and channel_name(a, 3).startswith(a)


def test_planted_world_readable_copy_of_a_ring_is_refused(prefix):
    data = _genuine_ring_bytes(prefix)
    _plant(prefix + "c", data, 0o644)  # a valid ring, but not 0600: not made by cgc
    with pytest.raises(SegmentExistsError) as ei:
        ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=256)
    assert isinstance(ei.value, FileExistsError)
    with pytest.raises(ShmSecurityError, match="mode 644"):
        ShmRingReader.attach(prefix + "c", 0, timeout=30)  # refused at once, not waited on
    os.unlink(_path(prefix + "c"))


def test_planted_symlink_is_refused(prefix, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(_genuine_ring_bytes(prefix))
    os.symlink(target, _path(prefix + "c"))
    with pytest.raises(SegmentExistsError):
        ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=256)
    with pytest.raises(ShmSecurityError, match="symlink"):
        ShmRingReader.attach(prefix + "c", 0, timeout=30)
    with pytest.raises(ShmSecurityError):  # the same check guards every attach
        ShmRingWriter.poison_by_name(prefix + "c")
    os.unlink(_path(prefix + "c"))


def test_planted_fifo_and_foreign_content_are_refused(prefix):
    os.mkfifo(_path(prefix + "f"), 0o600)
    with pytest.raises(ShmSecurityError, match="regular file"):
        ShmRingReader.attach(prefix + "f", 0, timeout=30)  # never blocks opening a FIFO
    os.unlink(_path(prefix + "f"))
    _plant(prefix + "g", os.urandom(4096), 0o600)
    with pytest.raises(ShmSecurityError, match="not a cgc segment"):
        ShmRingReader.attach(prefix + "g", 0, timeout=30)
    os.unlink(_path(prefix + "g"))


@pytest.mark.skipif(not ROOT, reason="chown to another user needs root")
def test_planted_file_of_another_user_is_refused(prefix):
    _plant(prefix + "c", _genuine_ring_bytes(prefix), 0o600)
    os.chown(_path(prefix + "c"), 65534, 65534)
    with pytest.raises(ShmSecurityError, match="uid 65534"):
        ShmRingReader.attach(prefix + "c", 0, timeout=30)
    os.unlink(_path(prefix + "c"))


def test_graph_endpoints_do_not_attach_to_a_planted_name():
    prefix = new_graph_prefix()
    ch = _channel()
    name = channel_name(prefix, ch.id)
    _plant(name, b"\0" * 8192, 0o644)
    try:
        with pytest.raises(SegmentExistsError):
            open_writer(ch, prefix)
        with pytest.raises(ShmSecurityError):
            open_reader(ch, prefix, "@driver", timeout=30)
    finally:
        os.unlink(_path(name))
    assert list_segments(prefix) == []


def test_cpu_communicator_does_not_load_a_planted_ring(prefix, tmp_path):
    # The old attack: pre-create the ring rank 0 would write to rank 1, holding a pickle.
    target = tmp_path / "ring"
    target.write_bytes(_genuine_ring_bytes(prefix))
    os.symlink(target, _path(prefix + "p0-1"))
    c1 = CpuCommunicator(prefix, 1, 2, attach_timeout=30)
    try:
        with pytest.raises(ShmSecurityError):
            c1.recv(0, timeout=5)
    finally:
        c1.destroy(linger=0)
        os.unlink(_path(prefix + "p0-1"))


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_mod, "SHM_ROOT", str(tmp_path))
    return tmp_path / f"cgc-{os.geteuid()}"


def test_segment_directory_is_created_private(fake_root):
    s = shm_mod.Segment.create("cgc-x", 64)
    assert fake_root.stat().st_mode & 0o777 == 0o700
    s.close()


def test_segment_directory_that_is_a_symlink_is_refused(fake_root, tmp_path):
    real = tmp_path / "other"
    real.mkdir(mode=0o700)
    os.symlink(real, fake_root)
    with pytest.raises(ShmSecurityError, match="symlink"):
        shm_mod.Segment.create("cgc-x", 64)
    assert list(real.iterdir()) == []


def test_segment_directory_with_loose_mode_is_refused(fake_root):
    fake_root.mkdir(mode=0o755)
    os.chmod(fake_root, 0o755)
    with pytest.raises(ShmSecurityError, match="mode 755"):
        shm_mod.Segment.create("cgc-x", 64)
    with pytest.raises(ShmSecurityError):
        list_segments("cgc-")
    shutil.rmtree(fake_root)
