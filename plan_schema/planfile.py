"""Reading and writing the .cgplan envelope.

Layout: ``MAGIC`` (8 bytes) | header length (u32, little-endian) | PlanHeader | Plan.
The header holds the SHA-256 and length of the exact Plan bytes that follow, so a reader
tells "not a plan", "truncated", "corrupted" and "too new" apart before parsing the payload,
and optionally an Ed25519 signature over them (``cgc.plan_schema.signing``).

Reading never runs anything from the file: values stay protobuf until the runtime decodes
them, after the trust decision (``cgc.plan_schema.trust``) allowed the plan.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import PlanFileMissingError, PlanFormatError
from cgc.plan_schema.version import FORMAT_MAJOR, FORMAT_MINOR, MAGIC, PRODUCER

__all__ = [
    "PlanFile",
    "write_plan_bytes",
    "read_plan_bytes",
    "write_plan",
    "read_plan",
    "read_header",
    "open_plan_bytes",
    "open_plan",
]

_LEN = struct.Struct("<I")
_MAX_HEADER = 1 << 16


def write_plan_bytes(plan: pb.Plan, *, key: Any = None) -> bytes:
    """Serialize a plan into envelope bytes, deterministically; sign them with ``key``.

    The plan's format_version and producer are filled in. ``key`` is an Ed25519 private
    key (``signing.load_or_create_key()``); None writes an unsigned plan. Ed25519 is
    deterministic, so the same plan and key give the same bytes. The header's
    ``needs_trust`` is set from the content, for information.

    Example: ``data = write_plan_bytes(plan); read_plan_bytes(data) == plan``.
    """
    from cgc.plan_schema.trust import plan_needs

    plan.format_version.major = FORMAT_MAJOR
    plan.format_version.minor = FORMAT_MINOR
    plan.producer = PRODUCER
    payload = plan.SerializeToString(deterministic=True)
    digest = hashlib.sha256(payload).digest()
    header = pb.PlanHeader(
        format_version=pb.FormatVersion(major=FORMAT_MAJOR, minor=FORMAT_MINOR),
        producer=PRODUCER,
        payload_sha256=digest,
        payload_len=len(payload),
        needs_trust=plan_needs(plan).needs_trust,
        name=plan.name,
    )
    if key is not None:
        from cgc.plan_schema import signing

        header.signer_key = signing.public_key_bytes(key)
        header.signature = signing.sign(
            key, signing.signed_message(FORMAT_MAJOR, FORMAT_MINOR, len(payload), digest)
        )
    raw = header.SerializeToString(deterministic=True)
    return MAGIC + _LEN.pack(len(raw)) + raw + payload


def read_header(data: bytes, source: str = "<bytes>") -> tuple[pb.PlanHeader, int]:
    """Parse and check the envelope header; return it and the payload offset.

    Raises:
        PlanFormatError: not a plan, truncated, or from a newer major format.
    """
    if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
        if data[: len(MAGIC)] and MAGIC.startswith(data[: len(MAGIC)]):
            raise PlanFormatError(f"{source}: truncated plan file ({len(data)} bytes)")
        hint = ""
        if source.endswith(".py"):
            hint = f"; to compile a model file: cgc compile {source} -o {Path(source).stem}.cgplan"
        raise PlanFormatError(
            f"{source}: not a cgc plan file (it does not start with the .cgplan magic bytes)"
            + hint
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


@dataclass(frozen=True)
class PlanFile:
    """A checked plan file: header, parsed plan, and what its signature proves.

    ``signature_valid`` is True only when the header carries a signature that verifies
    against its ``signer_key`` over this file's exact payload bytes; whether that key is
    trusted is the trust decision's business (``cgc.plan_schema.trust.decide``).
    """

    header: pb.PlanHeader
    plan: pb.Plan
    size: int
    source: str
    signature_valid: bool


def open_plan_bytes(data: bytes, source: str = "<bytes>") -> PlanFile:
    """Check envelope bytes (magic, version, length, checksum, signature) and parse them.

    Nothing is decided about trust and nothing from the file runs.

    Example: ``pf = open_plan_bytes(data, "x.cgplan"); pf.plan.name``.

    Raises:
        PlanFormatError: not a plan, truncated, corrupted, or from a newer major format.
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
    digest = hashlib.sha256(payload).digest()
    if digest != header.payload_sha256:
        raise PlanFormatError(f"{source}: corrupted plan file (checksum mismatch)")
    valid = False
    if header.signature:
        from cgc.plan_schema import signing

        # The digest is the one computed here from the bytes read, never the header's.
        message = signing.signed_message(header.format_version.major,
                                         header.format_version.minor, len(payload), digest)
        valid = signing.verify(header.signer_key, header.signature, message)
    plan = pb.Plan()
    try:
        plan.ParseFromString(payload)
    except DecodeError as exc:
        raise PlanFormatError(f"{source}: corrupted plan file (bad payload: {exc})") from None
    return PlanFile(header, plan, len(data), source, valid)


def _read_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the plan file at ``path``.

    Raises:
        PlanFileMissingError: nothing is at ``path`` (a usage error).
        PlanFormatError: it cannot be read (a folder, no permission, ...).
    """
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise PlanFileMissingError(f"{path}: no such plan file") from None
    except OSError as exc:
        raise PlanFormatError(f"{path}: cannot read plan file ({exc.strerror})") from None


def open_plan(path: str | os.PathLike[str]) -> PlanFile:
    """``open_plan_bytes`` of a file.

    Raises:
        PlanFormatError: missing or unreadable, or as ``open_plan_bytes``.
    """
    data = _read_file(path)
    return open_plan_bytes(data, str(path))


def read_plan_bytes(data: bytes, source: str = "<bytes>", *, trust: bool = True) -> pb.Plan:
    """Parse envelope bytes into a Plan, checking magic, version, length and checksum.

    ``trust=True`` (the default) is for readers that never run the plan (inspect, check,
    viz): no trust decision is made. ``trust=False`` refuses a plan that needs trust
    (``cgc.plan_schema.trust``) unless it is signed by a key the user trusts.

    Example: ``plan = read_plan_bytes(open("x.cgplan", "rb").read(), "x.cgplan")``.

    Raises:
        PlanFormatError: not a plan, truncated, corrupted, or from a newer major format.
        UntrustedPlanError: ``trust`` is False and the trust decision refuses the plan
            (the message lists what would run).
    """
    pf = open_plan_bytes(data, source)
    if not trust:
        from cgc.plan_schema.trust import decide, untrusted_error

        decision = decide(pf, trust=False)
        if not decision.allowed:
            raise untrusted_error(decision, pf.plan.name or pf.header.name, source)
    return pf.plan


def write_plan(plan: pb.Plan, path: str | os.PathLike[str], *, key: Any = None) -> bytes:
    """Write a plan file atomically (temp file + rename), signed with ``key`` when given;
    return the bytes written.

    Example: ``write_plan(plan, "x.cgplan", key=signing.load_or_create_key())``.

    Raises:
        OSError: the file cannot be written.
    """
    data = write_plan_bytes(plan, key=key)
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
        UntrustedPlanError: as ``read_plan_bytes`` with ``trust`` False.
    """
    data = _read_file(path)
    return read_plan_bytes(data, str(path), trust=trust)
