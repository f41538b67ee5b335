"""Ed25519 keys and plan signatures: the user's signing key and the keys they trust.

Files, in the user's cgc config directory (``config_dir()``: ``$CGC_CONFIG_DIR``, else
``$XDG_CONFIG_HOME/cgc``, else ``~/.config/cgc``; created with mode 0700):

- ``signing_key.pem``: the user's private key (PKCS#8 PEM, unencrypted, mode 0600), made
  on first use by ``cgc compile`` / ``Plan.save()``. Refused when another user owns it or
  its mode lets anyone else read or write it.
- ``trusted_keys``: the public keys whose plans run without ``--trust``, one per line::

      cgc-ed25519 <base64 of the 32-byte public key> [comment ...]

  Blank lines and lines starting with ``#`` are ignored. ``cgc keys show`` prints the
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

from cgc.plan_schema.errors import EXIT_USAGE, CgcError

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

CONFIG_ENV = "CGC_CONFIG_DIR"
KEY_FILE = "signing_key.pem"
TRUSTED_KEYS_FILE = "trusted_keys"
KEY_TYPE = "cgc-ed25519"
_CONTEXT = b"cgc plan signature v1\x00"  # so a plan signature means nothing elsewhere
_PUBLIC_LEN = 32


class KeyFileError(CgcError):
    """A key file or the config directory is unreadable, malformed or unsafely shared."""

    exit_code = EXIT_USAGE


def config_dir() -> Path:
    """The user's cgc config directory (not created here).

    Example: ``CGC_CONFIG_DIR=/tmp/k cgc keys show`` uses /tmp/k.
    """
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "cgc"


def _check_owned(st: os.stat_result, path: Path, forbidden: int, fix: str) -> None:
    # Why: a key file someone else can write lets them swap in their own key, and then
    # their plans run here as "yours".
    if st.st_uid != os.geteuid():
        raise KeyFileError(f"{path} belongs to another user (uid {st.st_uid}); cgc will not "
                           "use it — remove it, or point CGC_CONFIG_DIR at your own folder")
    if st.st_mode & forbidden:
        raise KeyFileError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}, open to other "
                           f"users; fix it with: {fix}")


def _ensure_dir(d: Path) -> None:
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_owned(d.stat(), d, stat.S_IWGRP | stat.S_IWOTH, f"chmod 700 {d}")


def _read_checked(path: Path, forbidden: int, fix: str) -> bytes | None:
    """The file's bytes after checking owner and mode on the open file; None if absent."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        _check_owned(os.fstat(f.fileno()), path, forbidden, fix)
        return f.read()


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
    _ensure_dir(d)
    path = d / KEY_FILE
    forbidden = stat.S_IRWXG | stat.S_IRWXO
    data = _read_checked(path, forbidden, f"chmod 600 {path}")
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
            data = _read_checked(path, forbidden, f"chmod 600 {path}")
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
    data = _read_checked(path, stat.S_IRWXG | stat.S_IRWXO, f"chmod 600 {path}")
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
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        public, comment = parse_public_key_line(line, f"{path}:{n}")
        keys.setdefault(public, comment)
    return keys


def load_keyring(directory: Path | None = None) -> Keyring:
    """Read the user's own public key and ``trusted_keys`` (nothing is created).

    Raises:
        KeyFileError: a file is malformed or open to other users.
    """
    d = directory or config_dir()
    if d.is_dir():  # whoever may write the folder may swap the files in it
        _check_owned(d.stat(), d, stat.S_IWGRP | stat.S_IWOTH, f"chmod 700 {d}")
    path = d / TRUSTED_KEYS_FILE
    raw = _read_checked(path, stat.S_IWGRP | stat.S_IWOTH, f"chmod 600 {path}")
    try:
        text = "" if raw is None else raw.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: not UTF-8 text") from None
    return Keyring(own=own_public_key(d), trusted=_parse_trusted(text, path), source=str(d))


def add_trusted_key(line: str, directory: Path | None = None) -> tuple[bytes, bool]:
    """Append a public key line to ``trusted_keys``; return ``(key, added)``.

    ``added`` is False when the key was there already (the file is then unchanged).

    Example: ``add_trusted_key(Path("alice.pub").read_text())``.

    Raises:
        KeyFileError: the line is not a public key, or a file is unsafe.
    """
    public, comment = parse_public_key_line(line, "public key")
    d = directory or config_dir()
    _ensure_dir(d)
    if public in load_keyring(d).trusted:
        return public, False
    path = d / TRUSTED_KEYS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        _check_owned(os.fstat(f.fileno()), path, stat.S_IWGRP | stat.S_IWOTH,
                     f"chmod 600 {path}")
        f.write(public_key_line(public, comment) + "\n")
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
