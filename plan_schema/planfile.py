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
import stat
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
    "open_plan_head",
]

_LEN = struct.Struct("<I")
_MAX_HEADER = 1 << 16


def write_plan_bytes(plan: pb.Plan, *, key: Any = None) -> bytes:
    """Serialize a plan into envelope bytes, deterministically; sign them with ``key``.

    The plan's format_version and producer are filled in. ``key`` is an Ed25519 private
    key (``signing.load_or_create_key()``); None writes an unsigned plan. Ed25519 is
    deterministic, so the same plan and key give the same bytes. The header's
    ``needs_trust`` is set from the content, for information; its ``class_modules`` lists
    the modules of the classes the graph names (an untrusted plan is refused from it).

    Example: ``data = write_plan_bytes(plan); read_plan_bytes(data) == plan``.
    """
    from cgc.plan_schema.trust import class_modules, plan_needs

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
        class_modules=class_modules(plan),
        lists_class_modules=True,
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


def open_plan_bytes(data: bytes, source: str = "<bytes>", *, parse: bool = True) -> PlanFile:
    """Check envelope bytes (magic, version, length, checksum, signature) and parse them
    (``parse=False``: the envelope only; ``PlanFile.plan`` is then an empty Plan, for a
    decision the header alone can make: ``cgc.plan_schema.trust.header_refusal``).

    Nothing is decided about trust and nothing from the file runs.

    A parsed plan's graph must name the class modules its header lists (format 1.8 on).

    Example: ``pf = open_plan_bytes(data, "x.cgplan"); pf.plan.name``.

    Raises:
        PlanFormatError: not a plan, truncated, corrupted (also: its header lists other
            class modules than its graph names), or from a newer major format.
    """
    header, off = read_header(data, source)
    payload = data[off:]
    _check_length(len(payload), header.payload_len, source)
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
    if not parse:
        return PlanFile(header, plan, len(data), source, valid)
    try:
        plan.ParseFromString(payload)
    except DecodeError as exc:
        raise PlanFormatError(f"{source}: corrupted plan file (bad payload: {exc})") from None
    _check_class_modules(header, plan, source)
    return PlanFile(header, plan, len(data), source, valid)


def _check_class_modules(header: pb.PlanHeader, plan: pb.Plan, source: str) -> None:
    """Refuse a plan whose header lists other class modules than its graph names."""
    if not header.lists_class_modules:
        return  # written before format 1.8: nothing to compare
    from cgc.plan_schema.display import escape
    from cgc.plan_schema.trust import class_modules

    named = class_modules(plan)
    if tuple(header.class_modules) != named:
        listed = ", ".join(header.class_modules) or "none"
        raise PlanFormatError(escape(
            f"{source}: corrupted plan file (its header lists the class modules [{listed}], "
            f"its graph names [{', '.join(named) or 'none'}])"))


def _check_length(have: int, want: int, source: str) -> None:
    """Refuse a payload of ``have`` bytes where the header says ``want``."""
    if have < want:
        raise PlanFormatError(
            f"{source}: truncated plan file (payload has {have} of {want} bytes)")
    if have > want:
        raise PlanFormatError(
            f"{source}: corrupted plan file ({have - want} bytes of trailing data)")


def _read_file(path: str | os.PathLike[str], *, payload: bool = True) -> bytes:
    """The bytes of the plan file at ``path``, read within bounds: only a regular file (not
    ``/dev/zero``, a FIFO or a folder) of at most ``Limits.file_bytes``, its envelope header
    checked (``read_header``) and its length matched against the header's payload length
    before the payload is read.

    Raises:
        PlanFileMissingError: nothing is at ``path`` (a usage error).
        PlanFormatError: it cannot be read (no permission, ...), is not a regular file, is
            too large, or its envelope is not a plan's (as ``read_header``).
    """
    from cgc.plan_schema.defaults import LIMITS

    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise PlanFileMissingError(f"{path}: no such plan file") from None
    except OSError as exc:
        raise PlanFormatError(f"{path}: cannot read plan file ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "a device, FIFO or socket"
        raise PlanFormatError(f"{path}: cannot read plan file (it is {what}, not a regular file)")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > LIMITS.file_bytes:
            raise PlanFormatError(
                f"{path}: {st.st_size:,} bytes, more than a plan file may be "
                f"({LIMITS.file_bytes:,} bytes: Limits.file_bytes)")
        try:
            head = _read_up_to(f, len(MAGIC) + _LEN.size)
            if len(head) == len(MAGIC) + _LEN.size and head[: len(MAGIC)] == MAGIC:
                (hlen,) = _LEN.unpack_from(head, len(MAGIC))
                head += _read_up_to(f, min(hlen, _MAX_HEADER + 1))
            header, off = read_header(head, str(path))
            _check_length(st.st_size - off, header.payload_len, str(path))
            return head + _read_up_to(f, header.payload_len) if payload else head
        except OSError as exc:
            raise PlanFormatError(f"{path}: cannot read plan file ({exc.strerror})") from None


def _read_up_to(f: Any, n: int) -> bytes:
    """At most ``n`` bytes of ``f`` (fewer at its end)."""
    chunks: list[bytes] = []
    while n > 0:
        chunk = f.read(n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def open_plan(path: str | os.PathLike[str], *, parse: bool = True) -> PlanFile:
    """``open_plan_bytes`` of a file, read within bounds (a regular file of at most
    ``Limits.file_bytes``, its header checked before the payload is read).

    Example: ``open_plan("x.cgplan").plan.name``.

    Raises:
        PlanFormatError: missing, unreadable, not a regular file, too large, or as
            ``open_plan_bytes``.
    """
    data = _read_file(path)
    return open_plan_bytes(data, str(path), parse=parse)


def open_plan_head(path: str | os.PathLike[str]) -> PlanFile:
    """The envelope header of the plan file at ``path``, its payload not read: for a
    refusal the header alone decides on an unsigned plan (``trust.header_refusal``). The
    checksum is not checked and a signature counts as not verified (``open_plan`` does both).

    Example: ``open_plan_head("x.cgplan").header.class_modules``.

    Raises:
        PlanFormatError: missing, unreadable, not a regular file, too large, or its envelope
            is not a plan's (as ``read_header``; the payload length is checked).
    """
    head = _read_file(path, payload=False)
    header, _ = read_header(head, str(path))
    return PlanFile(header, pb.Plan(), os.stat(path).st_size, str(path), False)


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
