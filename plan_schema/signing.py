"""Ed25519 keys and plan signatures: the user's signing key and the keys they trust.

Files, in the user's cgc config directory (``config_dir()``: ``$CGC_CONFIG_DIR``, else
``$XDG_CONFIG_HOME/cgc``, else ``~/.config/cgc``; created with mode 0700):

- ``signing_key.pem``: the user's private key (PKCS#8 PEM, unencrypted, mode 0600), made
  on first use by ``cgc compile`` / ``Plan.save()``. Refused when another user owns it or
  its mode lets anyone else read or write it.
- ``trusted_keys``: the public keys whose plans run without ``--trust``, one per line::

      cgc-ed25519 <base64 of the 32-byte public key> [comment ...]

  Blank lines and lines starting with ``#`` are ignored; lines end at ``\\n`` only, and a
  line holding another line break (U+2028, NEL, form feed, CR) is refused
  (``cgc.plan_schema.userfiles``). ``cgc keys show`` prints the
  user's own line; ``cgc keys add FILE`` appends a line from someone else. Refused when
  another user owns it or others may write it.

A signature is Ed25519 over ``signed_message()``: a fixed context string, the format
version, the payload length and the SHA-256 of the exact payload bytes. The reader hashes
the bytes it read, never a re-serialized message, and never takes the digest from the file.

The ``cryptography`` package is imported only here, and only when a key is used.

Example::

    key = load_or_create_key()
    sig = sign(key, signed_message(1, 0, len(payload), hashlib.sha256(payload).digest()))
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cgc.plan_schema.userfiles import (
    CONFIG_ENV,
    KeyFileError,
    append_line,
    check_dir,
    config_dir,
    ensure_dir,
    list_lines,
    read_checked,
    read_text,
)

__all__ = [
    "CONFIG_ENV",
    "KEY_FILE",
    "TRUSTED_KEYS_FILE",
    "KEY_TYPE",
    "KeyFileError",
    "Keyring",
    "config_dir",
    "load_or_create_key",
    "public_key_bytes",
    "own_public_key",
    "fingerprint",
    "public_key_line",
    "parse_public_key_line",
    "load_keyring",
    "add_trusted_key",
    "signed_message",
    "sign",
    "verify",
]

KEY_FILE = "signing_key.pem"
TRUSTED_KEYS_FILE = "trusted_keys"
KEY_TYPE = "cgc-ed25519"
_CONTEXT = b"cgc plan signature v1\x00"  # so a plan signature means nothing elsewhere
_PUBLIC_LEN = 32


def _require_cryptography() -> None:
    """Fail with a clear error where the optional-looking dependency is missing."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise KeyFileError(
            "signing and verifying plan files needs the 'cryptography' package (a "
            "dependency of cgc): pip install 'cryptography>=42' (or save unsigned with "
            "--no-sign / sign=False)") from None


def _private_from_pem(data: bytes, path: Path) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: not an Ed25519 key ({type(key).__name__})")
    return key


def load_or_create_key(directory: Path | None = None) -> Any:
    """The user's Ed25519 private key, made (mode 0600) on first use.

    Two processes creating it at once end up with the same key: the file appears at once
    (hard link of a finished temp file) and the loser reads the winner's.

    Example: ``key = load_or_create_key(); sign(key, msg)``.

    Raises:
        KeyFileError: the file is malformed, not Ed25519, or open to other users.
    """
    _require_cryptography()
    d = directory or config_dir()
    ensure_dir(d)
    path = d / KEY_FILE
    forbidden = stat.S_IRWXG | stat.S_IRWXO
    data = read_checked(path, forbidden, f"chmod 600 {path}")
    if data is not None:
        return _private_from_pem(data, path)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    tmp = d / f".{KEY_FILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process made one first: use theirs
            data = read_checked(path, forbidden, f"chmod 600 {path}")
            assert data is not None
            return _private_from_pem(data, path)
    finally:
        tmp.unlink(missing_ok=True)
    return key


def public_key_bytes(key: Any) -> bytes:
    """The raw 32-byte public key of an Ed25519 private key."""
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.Raw,
                                         serialization.PublicFormat.Raw)


def own_public_key(directory: Path | None = None) -> bytes | None:
    """The user's public key, or None when they have no key yet (nothing is created).

    Raises:
        KeyFileError: as ``load_or_create_key``.
    """
    path = (directory or config_dir()) / KEY_FILE
    data = read_checked(path, stat.S_IRWXG | stat.S_IRWXO, f"chmod 600 {path}")
    return None if data is None else public_key_bytes(_private_from_pem(data, path))


def fingerprint(public: bytes) -> str:
    """A short, stable name of a public key: ``SHA256:`` and base64 of its digest.

    Example: ``fingerprint(b"\\0" * 32).startswith("SHA256:")``.
    """
    digest = base64.b64encode(hashlib.sha256(public).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def public_key_line(public: bytes, comment: str = "") -> str:
    """The one-line text form of a public key, as ``trusted_keys`` holds it.

    Example: ``public_key_line(pub, "alice@lab")`` -> ``"cgc-ed25519 AAAA... alice@lab"``.
    """
    line = f"{KEY_TYPE} {base64.b64encode(public).decode()}"
    return f"{line} {comment}".rstrip()


def parse_public_key_line(line: str, where: str = "key") -> tuple[bytes, str]:
    """``(public key, comment)`` from a ``public_key_line``.

    Raises:
        KeyFileError: not ``cgc-ed25519 BASE64 [comment]`` or not 32 bytes (``where`` says
            which file and line).
    """
    parts = line.strip().split(None, 2)
    if len(parts) < 2 or parts[0] != KEY_TYPE:
        raise KeyFileError(f"{where}: expected '{KEY_TYPE} BASE64 [comment]', got "
                           f"{line.strip()[:60]!r}")
    try:
        public = base64.b64decode(parts[1], validate=True)
    except binascii.Error:
        raise KeyFileError(f"{where}: the key is not valid base64") from None
    if len(public) != _PUBLIC_LEN:
        raise KeyFileError(f"{where}: an Ed25519 public key has 32 bytes, not {len(public)}")
    return public, parts[2].strip() if len(parts) > 2 else ""


@dataclass(frozen=True)
class Keyring:
    """The keys whose signatures this user accepts: their own and their trusted ones.

    Example: ``load_keyring().who(header.signer_key)`` -> ``"your key"`` or None.
    """

    own: bytes | None = None
    trusted: Mapping[bytes, str] = field(default_factory=dict)  # key -> comment
    source: str = ""  # the directory they came from, for messages

    def who(self, public: bytes) -> str | None:
        """How this user knows the key, or None when they do not trust it."""
        if not public:
            return None
        if self.own is not None and public == self.own:
            return "your key"
        if public in self.trusted:
            comment = self.trusted[public]
            return f"trusted key{f' {comment!r}' if comment else ''}"
        return None


def _parse_trusted(text: str, path: Path) -> dict[bytes, str]:
    keys: dict[bytes, str] = {}
    for n, line in list_lines(text, str(path)):
        public, comment = parse_public_key_line(line, f"{path}:{n}")
        keys.setdefault(public, comment)
    return keys


def load_keyring(directory: Path | None = None) -> Keyring:
    """Read the user's own public key and ``trusted_keys`` (nothing is created).

    Raises:
        KeyFileError: a file is malformed or open to other users.
    """
    d = directory or config_dir()
    check_dir(d)
    path = d / TRUSTED_KEYS_FILE
    text = read_text(path, f"chmod 600 {path}")
    return Keyring(own=own_public_key(d), trusted=_parse_trusted(text, path), source=str(d))


def add_trusted_key(line: str, directory: Path | None = None) -> tuple[bytes, bool]:
    """Append a public key line to ``trusted_keys``; return ``(key, added)``.

    ``added`` is False when the key was there already (the file is then unchanged). The
    line goes on a line of its own (a newline first when the file lacks a final one), and
    the file is read back: the key counts as added only once the file says so.

    Example: ``add_trusted_key(Path("alice.pub").read_text())``.

    Raises:
        KeyFileError: the line is not a public key, a file is unsafe or malformed, or the
            key is not trusted after writing (the message says what the file holds).
    """
    public, comment = parse_public_key_line(line, "public key")
    if any(c in comment for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
        raise KeyFileError("public key: the comment holds a line break")
    d = directory or config_dir()
    ensure_dir(d)
    if public in load_keyring(d).trusted:
        return public, False
    path = d / TRUSTED_KEYS_FILE
    append_line(path, public_key_line(public, comment), f"chmod 600 {path}")
    if public not in load_keyring(d).trusted:
        raise KeyFileError(f"{path}: the key was appended but the file does not read back "
                           "as trusting it; check the file's last lines")
    return public, True


def signed_message(major: int, minor: int, payload_len: int, payload_sha256: bytes) -> bytes:
    """The bytes a plan signature covers (the digest is of the exact payload bytes).

    Example: ``signed_message(1, 0, 10, hashlib.sha256(b"0123456789").digest())``.
    """
    return _CONTEXT + struct.pack("<IIQ", major, minor, payload_len) + payload_sha256


def sign(key: Any, message: bytes) -> bytes:
    """Ed25519 signature of ``message`` (deterministic: same key and message, same bytes)."""
    return key.sign(message)


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is ``public``'s valid signature of ``message``.

    Raises:
        KeyFileError: the ``cryptography`` package is not installed.
    """
    _require_cryptography()
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if len(public) != _PUBLIC_LEN:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
