"""The .cgplan envelope: round trips, and clear errors for every kind of bad file."""

from __future__ import annotations

import hashlib
import struct

import pytest

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import EXIT_INVALID_PLAN, PlanFormatError, UntrustedPlanError
from cgc.plan_schema.planfile import read_plan, read_plan_bytes, write_plan, write_plan_bytes
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
    with pytest.raises(PlanFormatError, match=r"format 9\.0 .* reads format 1\.x"):
        read_plan_bytes(data, "new.cgplan")


def test_newer_minor_is_accepted():
    data = _with_header(write_plan_bytes(_plan()), lambda h: setattr(h.format_version, "minor", 7))
    assert read_plan_bytes(data).name == "p"


def test_garbage_header():
    data = MAGIC + struct.pack("<I", 5) + b"\xff\xff\xff\xff\xff" + b"rest"
    with pytest.raises(PlanFormatError, match="corrupted"):
        read_plan_bytes(data, "bad.cgplan")


def test_pickled_plan_needs_trust():
    plan = _plan()
    plan.needs_trust = True
    data = write_plan_bytes(plan)
    with pytest.raises(UntrustedPlanError, match="trust"):
        read_plan_bytes(data, "p.cgplan", trust=False)
    assert read_plan_bytes(data, trust=True).needs_trust


def test_missing_file(tmp_path):
    with pytest.raises(PlanFormatError, match="cannot read plan file"):
        read_plan(tmp_path / "nope.cgplan")


def test_checksum_is_over_exact_payload_bytes():
    data = write_plan_bytes(_plan())
    (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    header = pb.PlanHeader.FromString(data[start : start + hlen])
    assert header.payload_sha256 == hashlib.sha256(data[start + hlen :]).digest()
