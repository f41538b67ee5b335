"""Packaging: every package is installed, `cgc --help` stays light, the runtime stays
independent of the compiler, and the code is ruff-clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"cgc": "cgc", "cgc.plan_schema": "plan_schema", "cgc.runtime": "runtime"}


def _declared() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == MAPPING
    return set(config["packages"])


def test_every_package_is_listed():
    found = set()
    for prefix, folder in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((prefix, *rel)))
    # cgc/'s walk also sees nothing of plan_schema/runtime: they live outside cgc/.
    assert found == _declared()


def _imported_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_cli_help_imports_neither_ray_nor_torch():
    mods = _imported_after(
        "from cgc.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert "ray" not in mods and "torch" not in mods and "networkx" not in mods


def test_console_script_help():
    exe = shutil.which("cgc")
    if exe is None:
        pytest.skip("cgc console script not installed")
    out = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for name in ("compile", "inspect", "check", "run"):
        assert name in out.stdout


def _cgc_modules_outside(mods: set[str], allowed: tuple[str, ...]) -> set[str]:
    """Modules of cgc (or networkx) among ``mods`` that are not ``allowed`` packages."""
    return {
        m for m in mods
        if m.split(".")[0] == "networkx"
        or (m.startswith("cgc.") and not any(m == a or m.startswith(a + ".") for a in allowed))
    }


def test_runtime_does_not_import_the_compiler():
    # The runtime may use the schema and the verifier (which itself needs only the schema).
    mods = _imported_after("import cgc.runtime")
    allowed = ("cgc.runtime", "cgc.plan_schema", "cgc.verify")
    assert not _cgc_modules_outside(mods, allowed)


def test_verifier_depends_only_on_the_schema():
    mods = _imported_after("import cgc.verify")
    assert not _cgc_modules_outside(mods, ("cgc.verify", "cgc.plan_schema"))
    assert "ray" not in mods and "torch" not in mods


def test_ruff_clean(require_tool):
    require_tool("ruff")
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-3000:]
