"""Reading and writing the .cgplan envelope.

Layout: ``MAGIC`` (8 bytes) | header length (u32, little-endian) | PlanHeader | Plan.
The header holds the SHA-256 and length of the exact Plan bytes that follow, so a reader
tells "not a plan", "truncated", "corrupted" and "too new" apart before parsing the payload.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

from google.protobuf.message import DecodeError

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import PlanFormatError, UntrustedPlanError
from cgc.plan_schema.version import FORMAT_MAJOR, FORMAT_MINOR, MAGIC, PRODUCER

__all__ = ["write_plan_bytes", "read_plan_bytes", "write_plan", "read_plan", "read_header"]

_LEN = struct.Struct("<I")
_MAX_HEADER = 1 << 16


def write_plan_bytes(plan: pb.Plan) -> bytes:
    """Serialize a plan into envelope bytes, deterministically.

    The plan's format_version and producer are filled in. Example:
    ``data = write_plan_bytes(plan); read_plan_bytes(data) == plan``.
    """
    plan.format_version.major = FORMAT_MAJOR
    plan.format_version.minor = FORMAT_MINOR
    plan.producer = PRODUCER
    payload = plan.SerializeToString(deterministic=True)
    header = pb.PlanHeader(
        format_version=pb.FormatVersion(major=FORMAT_MAJOR, minor=FORMAT_MINOR),
        producer=PRODUCER,
        payload_sha256=hashlib.sha256(payload).digest(),
        payload_len=len(payload),
        needs_trust=plan.needs_trust,
        name=plan.name,
    ).SerializeToString(deterministic=True)
    return MAGIC + _LEN.pack(len(header)) + header + payload


def read_header(data: bytes, source: str = "<bytes>") -> tuple[pb.PlanHeader, int]:
    """Parse and check the envelope header; return it and the payload offset.

    Raises:
        PlanFormatError: not a plan, truncated, or from a newer major format.
    """
    if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
        if data[: len(MAGIC)] and MAGIC.startswith(data[: len(MAGIC)]):
            raise PlanFormatError(f"{source}: truncated plan file ({len(data)} bytes)")
        raise PlanFormatError(
            f"{source}: not a cgc plan file (it does not start with the .cgplan magic bytes)"
        )
    pos = len(MAGIC)
    if len(data) < pos + _LEN.size:
        raise PlanFormatError(f"{source}: truncated plan file ({len(data)} bytes)")
    (hlen,) = _LEN.unpack_from(data, pos)
    pos += _LEN.size
    if hlen > _MAX_HEADER:
        raise PlanFormatError(f"{source}: corrupted plan file (header length {hlen})")
    if len(data) < pos + hlen:
        raise PlanFormatError(f"{source}: truncated plan file (header cut off)")
    header = pb.PlanHeader()
    try:
        header.ParseFromString(data[pos : pos + hlen])
    except DecodeError as exc:
        raise PlanFormatError(f"{source}: corrupted plan file (bad header: {exc})") from None
    major = header.format_version.major
    if major > FORMAT_MAJOR:
        raise PlanFormatError(
            f"{source}: plan format {major}.{header.format_version.minor} was written by "
            f"{header.producer or 'a newer cgc'}; this cgc reads format {FORMAT_MAJOR}.x "
            f"(up to {FORMAT_MAJOR}.{FORMAT_MINOR}) — upgrade cgc or recompile the plan"
        )
    if major < 1:
        raise PlanFormatError(f"{source}: corrupted plan file (format version {major})")
    return header, pos + hlen


def read_plan_bytes(data: bytes, source: str = "<bytes>", *, trust: bool = True) -> pb.Plan:
    """Parse envelope bytes into a Plan, checking magic, version, length and checksum.

    Example: ``plan = read_plan_bytes(open("x.cgplan", "rb").read(), "x.cgplan")``.

    Raises:
        PlanFormatError: not a plan, truncated, corrupted, or from a newer major format.
        UntrustedPlanError: the plan holds pickled values and ``trust`` is False.
    """
    header, off = read_header(data, source)
    payload = data[off:]
    if len(payload) < header.payload_len:
        raise PlanFormatError(
            f"{source}: truncated plan file (payload has {len(payload)} of "
            f"{header.payload_len} bytes)"
        )
    if len(payload) > header.payload_len:
        raise PlanFormatError(
            f"{source}: corrupted plan file ({len(payload) - header.payload_len} bytes of "
            "trailing data)"
        )
    if hashlib.sha256(payload).digest() != header.payload_sha256:
        raise PlanFormatError(f"{source}: corrupted plan file (checksum mismatch)")
    if header.needs_trust and not trust:
        raise UntrustedPlanError(
            f"{source}: plan '{header.name}' holds pickled values, and loading it runs "
            "their code; load it only if you trust the file (trust=True, or --trust)"
        )
    plan = pb.Plan()
    try:
        plan.ParseFromString(payload)
    except DecodeError as exc:
        raise PlanFormatError(f"{source}: corrupted plan file (bad payload: {exc})") from None
    return plan


def write_plan(plan: pb.Plan, path: str | os.PathLike[str]) -> bytes:
    """Write a plan file atomically (temp file + rename); return the bytes written."""
    data = write_plan_bytes(plan)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return data


def read_plan(path: str | os.PathLike[str], *, trust: bool = True) -> pb.Plan:
    """Read and check a plan file.

    Example: ``plan = read_plan("plan.cgplan")``.

    Raises:
        PlanFormatError: missing, unreadable, not a plan, truncated, corrupted, too new.
        UntrustedPlanError: pickled values and ``trust`` is False.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PlanFormatError(f"{path}: cannot read plan file ({exc.strerror})") from None
    return read_plan_bytes(data, str(path), trust=trust)
