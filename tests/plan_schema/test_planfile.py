"""The .cgplan envelope: round trips, and clear errors for every kind of bad file."""

from __future__ import annotations

import hashlib
import os
import resource
import struct
import subprocess
import sys
import tracemalloc

import pytest

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import (
    EXIT_INVALID_PLAN,
    EXIT_USAGE,
    PlanFormatError,
    UntrustedPlanError,
)
from cgc.plan_schema.planfile import read_plan, read_plan_bytes, write_plan, write_plan_bytes
from cgc.plan_schema.trusted_modules import add_trusted_module, remove_trusted_module
from cgc.plan_schema.version import FORMAT_MAJOR, MAGIC


def _plan(name: str = "p") -> pb.Plan:
    plan = pb.Plan(name=name)
    actor = plan.graph.actors.add(name="w0")
    actor.cls.module, actor.cls.qualname = "mod", "Worker"
    plan.graph.nodes.add(id=0, kind=pb.INPUT, name="input")
    plan.config.capacity = 3
    return plan


def test_round_trip_and_determinism(tmp_path):
    data = write_plan_bytes(_plan())
    assert data.startswith(MAGIC)
    assert write_plan_bytes(_plan()) == data
    back = read_plan_bytes(data)
    assert back.graph.actors[0].cls.qualname == "Worker"
    assert back.format_version.major == FORMAT_MAJOR
    path = tmp_path / "x.cgplan"
    assert write_plan(_plan(), path) == data
    assert read_plan(path) == back
    assert not list(tmp_path.glob(".*tmp*")), "atomic write left its temp file"


def test_not_a_plan():
    with pytest.raises(PlanFormatError, match="not a cgc plan file") as info:
        read_plan_bytes(b"print('hello')\n", "model.py")
    assert info.value.exit_code == EXIT_INVALID_PLAN
    with pytest.raises(PlanFormatError, match="not a cgc plan file"):
        read_plan_bytes(b"", "empty.cgplan")


@pytest.mark.parametrize("cut", [3, len(MAGIC), len(MAGIC) + 2, len(MAGIC) + 6, -1, -20])
def test_truncated(cut):
    data = write_plan_bytes(_plan())
    with pytest.raises(PlanFormatError, match="truncated"):
        read_plan_bytes(data[:cut], "x.cgplan")


def test_corrupted_payload_fails_checksum():
    data = bytearray(write_plan_bytes(_plan()))
    data[-3] ^= 0xFF
    with pytest.raises(PlanFormatError, match="checksum mismatch"):
        read_plan_bytes(bytes(data), "x.cgplan")


def test_trailing_bytes():
    with pytest.raises(PlanFormatError, match="trailing data"):
        read_plan_bytes(write_plan_bytes(_plan()) + b"junk", "x.cgplan")


def _with_header(data: bytes, mutate) -> bytes:
    (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    header = pb.PlanHeader.FromString(data[start : start + hlen])
    mutate(header)
    raw = header.SerializeToString(deterministic=True)
    return MAGIC + struct.pack("<I", len(raw)) + raw + data[start + hlen :]


def test_newer_major_is_refused_with_both_versions():
    data = _with_header(write_plan_bytes(_plan()), lambda h: setattr(h.format_version, "major", 9))
    with pytest.raises(PlanFormatError, match=r"format 9\.\d+ .* reads format 1\.x"):
        read_plan_bytes(data, "new.cgplan")


def test_newer_minor_is_accepted():
    data = _with_header(write_plan_bytes(_plan()), lambda h: setattr(h.format_version, "minor", 7))
    assert read_plan_bytes(data).name == "p"


def test_garbage_header():
    data = MAGIC + struct.pack("<I", 5) + b"\xff\xff\xff\xff\xff" + b"rest"
    with pytest.raises(PlanFormatError, match="corrupted"):
        read_plan_bytes(data, "bad.cgplan")


def _pickled_plan() -> pb.Plan:
    plan = _plan()
    plan.example_args.add(pickled=b"\x80\x05K\x01.")  # pickle of 1
    return plan


def test_the_header_bit_decides_nothing():
    plan = _pickled_plan()
    data = _with_header(write_plan_bytes(plan), lambda h: setattr(h, "needs_trust", False))
    with pytest.raises(UntrustedPlanError, match="pickled value at example input 0"):
        read_plan_bytes(data, "p.cgplan", trust=False)
    assert read_plan_bytes(data, trust=True).example_args[0].pickled  # inspecting readers
    plain = _with_header(write_plan_bytes(_plan()), lambda h: setattr(h, "needs_trust", True))
    add_trusted_module("mod")  # the plan's one class is from a module the user trusts
    try:
        assert read_plan_bytes(plain, "p.cgplan", trust=False).name == "p"
    finally:
        remove_trusted_module("mod")


def test_the_writer_sets_the_bit_from_content():
    assert _header(write_plan_bytes(_pickled_plan())).needs_trust
    assert not _header(write_plan_bytes(_plan())).needs_trust


def _header(data: bytes) -> pb.PlanHeader:
    (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
    return pb.PlanHeader.FromString(data[len(MAGIC) + 4 : len(MAGIC) + 4 + hlen])


def test_signed_plans_are_deterministic_and_verify():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from cgc.plan_schema import signing
    from cgc.plan_schema.planfile import open_plan_bytes

    key = Ed25519PrivateKey.generate()
    data = write_plan_bytes(_plan(), key=key)
    assert write_plan_bytes(_plan(), key=key) == data
    header = _header(data)
    assert header.signer_key == signing.public_key_bytes(key) and len(header.signature) == 64
    pf = open_plan_bytes(data, "s.cgplan")
    assert pf.signature_valid and pf.plan.name == "p"
    # The signature is over the digest of the exact payload bytes and the format version.
    payload = data[len(data) - header.payload_len :]
    message = signing.signed_message(header.format_version.major,
                                     header.format_version.minor, len(payload),
                                     hashlib.sha256(payload).digest())
    assert signing.verify(header.signer_key, header.signature, message)
    bumped = _with_header(data, lambda h: setattr(h.format_version, "minor", 9))
    assert not open_plan_bytes(bumped).signature_valid
    assert not open_plan_bytes(write_plan_bytes(_plan())).signature_valid  # unsigned


def test_missing_file(tmp_path):
    with pytest.raises(PlanFormatError, match="no such plan file") as info:
        read_plan(tmp_path / "nope.cgplan")
    assert info.value.exit_code == EXIT_USAGE  # the path is wrong, not the plan
    with pytest.raises(PlanFormatError, match="cannot read plan file"):
        read_plan(tmp_path)  # a folder


def test_checksum_is_over_exact_payload_bytes():
    data = write_plan_bytes(_plan())
    (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    header = pb.PlanHeader.FromString(data[start : start + hlen])
    assert header.payload_sha256 == hashlib.sha256(data[start + hlen :]).digest()


# ---------------------------------------------------------------- bounded reading (issue 44)


def _cgc_check(path: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``cgc check PATH`` in a process limited to 2 GB of address space."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([sys.executable, "-m", "cgc.cli.main", "check", path],
                          capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


def test_dev_zero_and_a_fifo_are_refused_as_not_regular_files(tmp_path):
    fifo = tmp_path / "plan.cgplan"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):  # before: MemoryError / waiting for a writer
        done = _cgc_check(path)
        assert done.returncode == EXIT_INVALID_PLAN, done.stderr
        assert done.stderr == f"error: {path}: cannot read plan file (it is a device, FIFO or " \
                              "socket, not a regular file)\n"
    with pytest.raises(PlanFormatError, match="not a regular file"):
        read_plan("/dev/zero")


def test_a_gigabyte_of_zeros_is_refused_from_its_first_bytes(tmp_path):
    path = tmp_path / "zeros.cgplan"
    with open(path, "wb") as f:
        f.truncate(1 << 30)  # sparse: no disk used
    tracemalloc.start()
    try:
        with pytest.raises(PlanFormatError, match="does not start with the .cgplan magic"):
            read_plan(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the head only, not the gigabyte


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from cgc.plan_schema import defaults

    path = tmp_path / "p.cgplan"
    data = write_plan(_plan(), path)
    monkeypatch.setattr(defaults, "LIMITS", defaults.Limits(file_bytes=len(data) - 1))
    with pytest.raises(PlanFormatError, match=rf"{len(data):,} bytes, more than a plan file "
                       rf"may be \({len(data) - 1:,} bytes: Limits.file_bytes\)"):
        read_plan(path)
    monkeypatch.setattr(defaults, "LIMITS", defaults.Limits(file_bytes=len(data)))
    assert read_plan(path).name == "p"


def test_length_against_the_header_is_checked_from_the_file_size(tmp_path):
    path = tmp_path / "p.cgplan"
    data = write_plan(_plan(), path)
    path.write_bytes(data + b"\0" * 5)
    with pytest.raises(PlanFormatError, match="5 bytes of trailing data"):
        read_plan(path)
    path.write_bytes(data[:-3])
    with pytest.raises(PlanFormatError, match=r"truncated plan file \(payload has"):
        read_plan(path)


def test_a_large_plan_the_header_refuses_is_refused_before_its_graph_is_read(
        tmp_path, monkeypatch):
    import cgc
    from cgc.plan_schema import trust

    plan = _plan("coded")
    plan.graph.modules.add(name="mod", source="class Worker:\n    pass\n", source_file="m.py")
    path = tmp_path / "coded.cgplan"
    write_plan(plan, path)  # unsigned; its header says it needs trust
    monkeypatch.setattr(trust, "DETAIL_BYTES", 0)  # every plan counts as large
    monkeypatch.setattr(trust, "plan_needs", None)  # the graph's content is never looked at
    with pytest.raises(UntrustedPlanError, match=r"(?s)plan 'coded' is not trusted here: "
                       r"unsigned\.\nits header says it holds code .* \(refused from the "
                       r"envelope, before reading its \d+-byte graph"):
        cgc.load(path)


def test_the_writer_lists_the_class_modules_in_the_header():
    plan = _plan()
    plan.graph.actors.add(name="w1").cls.module = "other.sub"
    header = _header(write_plan_bytes(plan))
    assert header.lists_class_modules
    assert list(header.class_modules) == ["mod", "other.sub"]  # sorted, unique


def test_a_header_whose_class_modules_lie_is_a_corrupted_plan(tmp_path):
    """The list decides refusals before the graph is read, so it must be the graph's."""
    data = _with_header(write_plan_bytes(_plan()),
                        lambda h: h.class_modules.__setitem__(0, "numpy"))
    with pytest.raises(PlanFormatError, match=r"corrupted plan file \(its header lists the "
                       r"class modules \[numpy\], its graph names \[mod\]\)"):
        read_plan_bytes(data, "p.cgplan")
    path = tmp_path / "lies.cgplan"
    path.write_bytes(data)
    done = subprocess.run([sys.executable, "-m", "cgc.cli.entry", "check", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_INVALID_PLAN, done.stderr
    assert "its header lists the class modules [numpy]" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_plan_from_before_the_header_list_is_still_read():
    """Format 1.7 and older: no list; trust is decided from the graph, as before."""
    def old(h: pb.PlanHeader) -> None:
        del h.class_modules[:]
        h.lists_class_modules = False
        h.format_version.minor = 7

    data = _with_header(write_plan_bytes(_plan()), old)
    assert read_plan_bytes(data, "p.cgplan").name == "p"
    with pytest.raises(UntrustedPlanError, match=r"class mod\.Worker, from a module you do "
                       r"not trust \(mod\)"):
        read_plan_bytes(data, "p.cgplan", trust=False)


def test_a_large_plan_of_untrusted_classes_is_refused_from_its_header(tmp_path):
    """An unsigned plan needing no trust whose header lists a module nobody trusts: refused
    from the envelope. Its graph here is 17 MiB of garbage (with a valid checksum), so
    reading it would say "corrupted": the refusal never reads it."""
    import cgc
    from cgc.plan_schema import trust

    payload = b"\xff" * (trust.DETAIL_BYTES + (1 << 20))
    header = pb.PlanHeader(format_version=pb.FormatVersion(major=FORMAT_MAJOR, minor=8),
                           producer="cgc", payload_sha256=hashlib.sha256(payload).digest(),
                           payload_len=len(payload), name="big", class_modules=["evil_mod"],
                           lists_class_modules=True)
    raw = header.SerializeToString(deterministic=True)
    path = tmp_path / "big.cgplan"
    path.write_bytes(MAGIC + struct.pack("<I", len(raw)) + raw + payload)
    want = (r"(?s)plan 'big' is not trusted here: unsigned\.\nits header names classes from "
            r"modules you do not trust \(evil_mod; `cgc trust add-module evil_mod` trusts them"
            r".* \(refused from the envelope, before reading its 17,825,792-byte graph")
    with pytest.raises(UntrustedPlanError, match=want):
        cgc.load(path)
    done = subprocess.run([sys.executable, "-m", "cgc.cli.entry", "run", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_INVALID_PLAN, done.stderr
    assert "its header names classes from modules you do not trust (evil_mod" in done.stderr
    assert "Traceback" not in done.stderr
    add_trusted_module("evil_mod")  # trusted: the header decides nothing, the graph is read
    try:
        with pytest.raises(PlanFormatError, match=r"corrupted plan file \(bad payload"):
            cgc.load(path)
    finally:
        remove_trusted_module("evil_mod")
