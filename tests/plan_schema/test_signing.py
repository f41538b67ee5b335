"""The user's signing key and trusted keys: where they live, their modes, their format,
and refusals when another user could swap them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cgc.plan_schema import signing
from cgc.plan_schema.signing import KeyFileError


def test_config_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("CGC_CONFIG_DIR", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert signing.config_dir() == tmp_path / "home" / ".config" / "cgc"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert signing.config_dir() == tmp_path / "xdg" / "cgc"
    monkeypatch.setenv("CGC_CONFIG_DIR", str(tmp_path / "explicit"))
    assert signing.config_dir() == tmp_path / "explicit"


def test_key_made_once_private_and_reused(tmp_path):
    d = tmp_path / "cfg"
    key = signing.load_or_create_key(d)
    assert (d / signing.KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert d.stat().st_mode & 0o777 == 0o700
    again = signing.load_or_create_key(d)
    assert signing.public_key_bytes(again) == signing.public_key_bytes(key)
    assert signing.own_public_key(d) == signing.public_key_bytes(key)
    assert signing.own_public_key(tmp_path / "none") is None
    assert not (tmp_path / "none").exists()  # reading makes nothing


def test_processes_racing_to_make_the_key_agree(tmp_path):
    d = tmp_path / "cfg"
    code = ("import sys; from pathlib import Path; from cgc.plan_schema import signing as s; "
            "print(s.public_key_bytes(s.load_or_create_key(Path(sys.argv[1]))).hex())")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(d)], stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outs = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(outs) == 1 and signing.own_public_key(d).hex() in outs
    assert [p.name for p in d.iterdir()] == [signing.KEY_FILE]  # no temp file left


def test_key_files_open_to_others_are_refused(tmp_path):
    d = tmp_path / "cfg"
    signing.load_or_create_key(d)
    (d / signing.KEY_FILE).chmod(0o640)
    with pytest.raises(KeyFileError, match=r"mode 640, open to other users.*chmod 600"):
        signing.load_or_create_key(d)
    (d / signing.KEY_FILE).chmod(0o600)
    trusted = d / signing.TRUSTED_KEYS_FILE
    trusted.write_text("")
    trusted.chmod(0o664)
    with pytest.raises(KeyFileError, match="trusted_keys has mode 664"):
        signing.load_keyring(d)
    trusted.chmod(0o644)  # readable by others is fine: public keys
    signing.load_keyring(d)
    d.chmod(0o777)
    with pytest.raises(KeyFileError, match="chmod 700"):
        signing.load_keyring(d)
    d.chmod(0o700)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_key_files_of_another_user_are_refused(tmp_path):
    d = tmp_path / "cfg"
    signing.load_or_create_key(d)
    os.chown(d / signing.KEY_FILE, 4242, 4242)
    with pytest.raises(KeyFileError, match=r"belongs to another user \(uid 4242\)"):
        signing.load_or_create_key(d)


def test_trusted_keys_format(tmp_path):
    d = tmp_path / "cfg"
    a = signing.public_key_bytes(signing.load_or_create_key(tmp_path / "a"))
    b = signing.public_key_bytes(signing.load_or_create_key(tmp_path / "b"))
    pub, added = signing.add_trusted_key(signing.public_key_line(a, "alice@lab") + "\n", d)
    assert added and pub == a
    assert signing.add_trusted_key(signing.public_key_line(a, "other comment"), d) == (a, False)
    with open(d / signing.TRUSTED_KEYS_FILE, "a") as f:
        f.write("\n# bob, added by hand\n" + signing.public_key_line(b) + "\n")
    ring = signing.load_keyring(d)
    assert ring.trusted == {a: "alice@lab", b: ""}
    assert ring.who(a) == "trusted key 'alice@lab'" and ring.who(b) == "trusted key"
    assert ring.who(b"\0" * 32) is None and ring.own is None
    (d / signing.TRUSTED_KEYS_FILE).write_text("cgc-ed25519 AAAA\n")
    with pytest.raises(KeyFileError, match=r"trusted_keys:1: an Ed25519 public key has 32"):
        signing.load_keyring(d)
    with pytest.raises(KeyFileError, match="expected 'cgc-ed25519 BASE64"):
        signing.parse_public_key_line("ssh-ed25519 AAAA")
    with pytest.raises(KeyFileError, match="not valid base64"):
        signing.parse_public_key_line("cgc-ed25519 !!!")


def test_sign_and_verify(tmp_path):
    key = signing.load_or_create_key(tmp_path)
    pub = signing.public_key_bytes(key)
    msg = signing.signed_message(1, 0, 3, b"\1" * 32)
    sig = signing.sign(key, msg)
    assert sig == signing.sign(key, msg)  # Ed25519 is deterministic
    assert signing.verify(pub, sig, msg)
    assert not signing.verify(pub, sig, signing.signed_message(1, 0, 4, b"\1" * 32))
    assert not signing.verify(pub[:-1] + bytes([pub[-1] ^ 1]), sig, msg)
    assert not signing.verify(pub[:5], sig, msg)
    assert signing.fingerprint(pub).startswith("SHA256:")


@pytest.mark.parametrize("brk", ["\u2028", "\x85", "\x0c", "\r", "\u2029", "\x0b"])
def test_a_key_cannot_hide_inside_a_comment_line(tmp_path, brk):
    """Lines end at \\n only: a comment holding another line break is refused, never read
    as a comment by cgc and shown as a key line by an editor (or the other way round)."""
    d = tmp_path / "cfg"
    d.mkdir(mode=0o700)
    public = signing.public_key_bytes(signing.load_or_create_key(tmp_path / "other"))
    path = d / signing.TRUSTED_KEYS_FILE
    path.write_text(f"# my colleagues{brk}{signing.public_key_line(public, 'x')}\n",
                    encoding="utf-8")
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match=rf"trusted_keys:1: the line holds the character "
                                           rf"U\+{ord(brk):04X}"):
        signing.load_keyring(d)


def test_adding_a_key_to_a_file_without_a_final_newline(tmp_path):
    """The key goes on a line of its own (it was appended to the last comment, so it was
    not trusted while `cgc keys add` said it was)."""
    d = tmp_path / "cfg"
    d.mkdir(mode=0o700)
    path = d / signing.TRUSTED_KEYS_FILE
    path.write_text("# keys of my lab", encoding="utf-8")  # no final newline
    path.chmod(0o600)
    public = signing.public_key_bytes(signing.load_or_create_key(tmp_path / "other"))
    assert signing.add_trusted_key(signing.public_key_line(public, "bob"), d) == (public, True)
    assert signing.load_keyring(d).who(public) == "trusted key 'bob'"
    assert path.read_text().splitlines()[0] == "# keys of my lab"
    assert signing.add_trusted_key(signing.public_key_line(public), d) == (public, False)


def test_keys_add_refuses_a_comment_with_a_line_break(tmp_path):
    public = signing.public_key_bytes(signing.load_or_create_key(tmp_path / "other"))
    line = signing.public_key_line(public, "bob\u2028cgc-ed25519 AAAA")
    with pytest.raises(KeyFileError, match="line break"):
        signing.add_trusted_key(line, tmp_path / "cfg")
