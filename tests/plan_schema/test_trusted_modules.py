"""The user's trusted modules: format, coverage, refusals of unsafe or odd files, and the
CLI that edits them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cgc.plan_schema.trusted_modules import (
    TRUSTED_MODULES_FILE,
    ModuleTrust,
    add_trusted_module,
    load_trusted_modules,
    remove_trusted_module,
)
from cgc.plan_schema.userfiles import KeyFileError


def test_nothing_is_trusted_by_default(tmp_path):
    trust = load_trusted_modules(tmp_path / "absent")
    assert trust.names == () and trust.covering("os") is None
    assert not (tmp_path / "absent").exists()  # reading makes nothing


def test_an_entry_covers_its_module_and_everything_below_only():
    trust = ModuleTrust(("mylab.models", "mypkg"))
    assert trust.covering("mypkg") == "mypkg"
    assert trust.covering("mypkg.sub.deep") == "mypkg"
    assert trust.covering("mylab.models.gpt") == "mylab.models"
    for other in ("mypkg2", "mylab", "mylab.modelsx", "my", ""):
        assert trust.covering(other) is None, other


def test_add_list_remove(tmp_path):
    d = tmp_path / "cfg"
    assert add_trusted_module("mypkg", d) is True
    assert add_trusted_module("mypkg", d) is False
    assert add_trusted_module("a.b_c", d) is True
    path = d / TRUSTED_MODULES_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_trusted_modules(d).names == ("a.b_c", "mypkg")
    assert path.read_text().startswith("# modules whose classes unsigned plans may use")
    assert remove_trusted_module("mypkg", d) is True
    assert remove_trusted_module("mypkg", d) is False
    assert load_trusted_modules(d).names == ("a.b_c",)


@pytest.mark.parametrize("bad", ["", ".x", "x.", "a..b", "a b", "1abc", "a-b", "ünï", "a/b"])
def test_names_must_be_dotted_module_names(tmp_path, bad):
    with pytest.raises(KeyFileError, match="is not a dotted module name"):
        add_trusted_module(bad, tmp_path / "cfg")


def test_odd_or_unsafe_files_are_refused(tmp_path):
    d = tmp_path / "cfg"
    add_trusted_module("mypkg", d)
    path = d / TRUSTED_MODULES_FILE
    path.write_text("# ok\u2028evil\nmypkg\n")
    with pytest.raises(KeyFileError, match=r"trusted_modules:1: the line holds the character "
                                           r"U\+2028"):
        load_trusted_modules(d)
    path.write_text("not a module!\n")
    with pytest.raises(KeyFileError, match=r"trusted_modules:1: 'not a module!' is not"):
        load_trusted_modules(d)
    path.write_text("mypkg\n")
    path.chmod(0o622)
    with pytest.raises(KeyFileError, match="open to other users"):
        load_trusted_modules(d)
    path.chmod(0o600)
    d.chmod(0o777)
    with pytest.raises(KeyFileError, match="open to other users"):
        load_trusted_modules(d)
    d.chmod(0o700)
    if os.geteuid() == 0:  # root can give the file away: another user's file is refused
        os.chown(path, 12345, 12345)
        with pytest.raises(KeyFileError, match="belongs to another user"):
            load_trusted_modules(d)


def test_the_trust_command(tmp_path):
    env = {**os.environ, "CGC_CONFIG_DIR": str(tmp_path / "cfg")}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cgc.cli.main", "trust", *args],
                              capture_output=True, text=True, env=env, timeout=60)

    assert cli("add-module", "mypkg", "other.mod").stdout.splitlines() == [
        "trusted: mypkg", "trusted: other.mod"]
    listed = cli("list").stdout
    assert "trusted modules (2, in " in listed and "  mypkg\n  other.mod\n" in listed
    assert cli("remove-module", "mypkg").stdout == "removed: mypkg\n"
    bad = cli("add-module", "not a name")
    assert bad.returncode == 2 and "is not a dotted module name" in bad.stderr
    assert "Traceback" not in bad.stderr
