"""A seeded mutation fuzz of plan files: only typed cgc errors may come out.

Each example plan is cut short, bit-flipped, and mutated field by field (with the checksum
recomputed, so the damage reaches the parser and the checks), then read, dumped
(``format_plan_text``, what ``cgc inspect`` prints), structure-checked and verified. Any
exception that is not a ``CgcError`` (an ``IndexError``, a ``KeyError``, a protobuf
``ValueError``) fails the test with the seed and the mutation to replay it.

A second pass feeds a smaller sample of the same kinds of damage to the commands as a user
runs them (``cgc inspect``, ``inspect --json``, ``check``, ``viz`` in its ascii, schedule and
file forms, through ``cgc.cli.main``) and to ``cgc.load``: each must answer with a typed
error and its exit code, never "internal error" or a traceback.

Bounded: a fixed number of cases per plan, about ten seconds in all.
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from collections.abc import Callable

import pytest
import shapes
from google.protobuf.descriptor import FieldDescriptor as F

import cgc
from cgc.passes import lower
from cgc.plan_schema import CgcError, read_plan_bytes, write_plan_bytes
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_plan_text
from cgc.plan_schema.verify import check_structure, verify_plan
from cgc.plan_schema.version import FORMAT_MAJOR, FORMAT_MINOR, MAGIC

SEED = 20240611
SEMANTIC, FLIPS, CUTS = 60, 12, 8
EXAMPLES = ["echo", "chain", "fanout", "multi_return", "allreduce"]  # no torch, no ray import
SHAPES = ["1f1b_2x4", "whole_input", "two_communicators", "two_writer_nccl"]


def _base_plans() -> dict[str, pb.Plan]:
    out = {f"shape:{n}": lower(shapes.ALL[n]()) for n in SHAPES}
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "examples"
    for n in EXAMPLES:
        out[f"example:{n}"] = cgc.compile_file(root / f"{n}.py").proto
    return out


@pytest.fixture(scope="module")
def plans() -> dict[str, pb.Plan]:
    return _base_plans()


# ---------------------------------------------------------------- mutations

_INTS = {
    F.TYPE_UINT32: [0, 1, 2, 3, 7, 99, 2**31, 2**32 - 1],
    F.TYPE_UINT64: [0, 1, 2, 255, 2**32, 2**40, 2**64 - 1],
    F.TYPE_INT64: [0, 1, -1, 2**62, -(2**63)],
    F.TYPE_SINT64: [0, 1, -1, 2**62, -(2**63)],
    F.TYPE_INT32: [0, 1, -1, 2**31 - 1],
}
_FLOATS = [0.0, -1.0, 1e300, math.inf, -math.inf, math.nan]
_STRINGS = ["", "@driver", "a", "zz", "w0", "s1", "x y", "é"]


def _fields(msg, path: str = "") -> list[tuple[object, F, str]]:
    """Every (message, field, path) below ``msg`` that can be mutated."""
    out = []
    for fd in msg.DESCRIPTOR.fields:
        p = f"{path}.{fd.name}"
        if fd.is_repeated:
            items = getattr(msg, fd.name)
            out.append((msg, fd, p))
            if fd.type == F.TYPE_MESSAGE:
                for i, item in enumerate(items):
                    out.extend(_fields(item, f"{p}[{i}]"))
        elif fd.type == F.TYPE_MESSAGE:
            if msg.HasField(fd.name):
                out.append((msg, fd, p))
                out.extend(_fields(getattr(msg, fd.name), p))
        else:
            out.append((msg, fd, p))
    return out


def _scalar(fd: F, rnd: random.Random):
    if fd.type == F.TYPE_ENUM:
        top = max(v.number for v in fd.enum_type.values)
        return rnd.choice([0, 1, top, top + 1, top + 2, 99])
    if fd.type in _INTS:
        return rnd.choice(_INTS[fd.type] + [rnd.randrange(0, 64)])
    if fd.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return rnd.choice(_FLOATS + [rnd.uniform(-5, 100)])
    if fd.type == F.TYPE_BOOL:
        return rnd.choice([True, False])
    if fd.type == F.TYPE_STRING:
        return rnd.choice(_STRINGS)
    if fd.type == F.TYPE_BYTES:
        return rnd.choice([b"", b"\x00", rnd.randbytes(8)])
    raise AssertionError(fd.type)


def _mutate(plan: pb.Plan, rnd: random.Random) -> str:
    """Change one field of ``plan`` in place; return what was done (for the failure)."""
    msg, fd, path = rnd.choice(_fields(plan))
    if fd.is_repeated:
        items = getattr(msg, fd.name)
        if items and rnd.random() < 0.4:
            del items[rnd.randrange(len(items))]
            return f"delete one of {path}"
        if fd.type == F.TYPE_MESSAGE:
            if items and rnd.random() < 0.5:
                items.add().CopyFrom(rnd.choice(items))
                return f"duplicate an item of {path}"
            items.add()
            return f"append an empty item to {path}"
        if items and rnd.random() < 0.5:
            i = rnd.randrange(len(items))
            items[i] = _scalar(fd, rnd)
            return f"set {path}[{i}] = {items[i]!r}"
        items.append(_scalar(fd, rnd))
        return f"append {items[-1]!r} to {path}"
    if fd.type == F.TYPE_MESSAGE:
        msg.ClearField(fd.name)
        return f"clear {path}"
    value = _scalar(fd, rnd)
    setattr(msg, fd.name, value)
    return f"set {path} = {value!r}"


def _envelope(payload: bytes) -> bytes:
    """A plan file around ``payload`` with a correct checksum (bytes not from a Plan)."""
    header = pb.PlanHeader(
        format_version=pb.FormatVersion(major=FORMAT_MAJOR, minor=FORMAT_MINOR),
        payload_sha256=hashlib.sha256(payload).digest(),
        payload_len=len(payload),
        name="fuzz",
    ).SerializeToString()
    return MAGIC + struct.pack("<I", len(header)) + header + payload


# ---------------------------------------------------------------- the commands


def _use(data: bytes) -> None:
    """What inspect, check and start do with a plan file; typed errors are fine."""
    try:
        plan = read_plan_bytes(data, "fuzz.cgplan", trust=True)
    except CgcError:
        return
    for step in (format_plan_text, check_structure, verify_plan):
        try:
            step(plan)
        except CgcError:
            pass


def _run(label: str, make: Callable[[], bytes], what: str) -> None:
    try:
        _use(make())
    except Exception as exc:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{label}: {what}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("index", range(len(SHAPES) + len(EXAMPLES)))
def test_mutated_plans_give_only_typed_errors(plans, index):
    label = sorted(plans)[index]
    base = plans[label]
    rnd = random.Random(f"{SEED}:{label}")
    good = write_plan_bytes(base)
    _use(good)
    for _ in range(CUTS):
        cut = rnd.randrange(len(good))
        _run(label, lambda cut=cut: good[:cut], f"truncated at {cut}")
    payload = base.SerializeToString(deterministic=True)
    for _ in range(FLIPS):
        i, bit = rnd.randrange(len(payload)), 1 << rnd.randrange(8)
        flipped = bytearray(payload)
        flipped[i] ^= bit
        _run(label, lambda b=bytes(flipped): _envelope(b), f"bit {bit} of payload byte {i}")
        _run(label, lambda i=i, bit=bit: _flip(good, i, bit), f"unsigned flip at {i}")
    for k in range(SEMANTIC):
        plan = pb.Plan()
        plan.CopyFrom(base)
        whats = [_mutate(plan, rnd) for _ in range(1 + k % 3)]
        _run(label, lambda plan=plan: write_plan_bytes(plan), "; ".join(whats))


def _flip(data: bytes, i: int, bit: int) -> bytes:
    out = bytearray(data)
    out[len(out) - 1 - i % len(out)] ^= bit
    return bytes(out)


# ---------------------------------------------------------------- the same through the CLI

CLI_SEMANTIC, CLI_FLIPS, CLI_CUTS = 40, 6, 6
_COMMANDS = (["inspect"], ["inspect", "--json"], ["check"], ["viz", "--ascii"],
             ["viz", "--schedule", "--ascii"], ["viz", "-o", "{out}"])


def _cli_and_load(data: bytes, folder, capsys) -> list[str]:
    """Run ``cgc inspect / check / viz`` and ``cgc.load`` on ``data`` as a user would; return
    what went wrong (a crash, "internal error", a traceback, an exit code no command uses)."""
    from cgc.cli.main import main

    path = folder / "fuzz.cgplan"
    path.write_bytes(data)
    bad = []
    for cmd in _COMMANDS:
        argv = [c.format(out=folder / "fuzz.dot") for c in cmd]
        try:
            rc = main([argv[0], str(path), *argv[1:]])
        except BaseException as exc:  # noqa: BLE001 - main() must turn everything into a code
            bad.append(f"cgc {' '.join(cmd)}: raised {type(exc).__name__}: {exc}")
            continue
        err = capsys.readouterr().err
        if "internal error" in err or "Traceback" in err or rc not in (0, 2, 4, 5):
            bad.append(f"cgc {' '.join(cmd)}: exit {rc}: {err.strip()[-300:]}")
    for trust in (False, True):
        try:
            cgc.load(path, trust=trust)
        except CgcError:
            pass
        except Exception as exc:  # noqa: BLE001 - the point of the test
            bad.append(f"cgc.load(trust={trust}): {type(exc).__name__}: {exc}")
    return bad


@pytest.mark.parametrize("index", range(len(SHAPES) + len(EXAMPLES)))
def test_mutated_plans_give_only_typed_errors_from_every_command(plans, index, tmp_path,
                                                                 capsys):
    label = sorted(plans)[index]
    base = plans[label]
    rnd = random.Random(f"{SEED}:cli:{label}")
    good = write_plan_bytes(base)
    cases: list[tuple[str, bytes]] = [("unchanged", good)]
    cases += [(f"truncated at {c}", good[:c])
              for c in (rnd.randrange(len(good)) for _ in range(CLI_CUTS))]
    payload = base.SerializeToString(deterministic=True)
    for _ in range(CLI_FLIPS):
        i, bit = rnd.randrange(len(payload)), 1 << rnd.randrange(8)
        flipped = bytearray(payload)
        flipped[i] ^= bit
        cases.append((f"bit {bit} of payload byte {i}", _envelope(bytes(flipped))))
    for k in range(CLI_SEMANTIC):
        plan = pb.Plan()
        plan.CopyFrom(base)
        whats = [_mutate(plan, rnd) for _ in range(1 + k % 3)]
        cases.append(("; ".join(whats), write_plan_bytes(plan)))
    problems = [f"{label}: {what}: {p}" for what, data in cases
                for p in _cli_and_load(data, tmp_path, capsys)]
    assert not problems, "\n".join(problems[:10])
