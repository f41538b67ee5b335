"""Packaging: the distribution's name is not a stranger's, every package is installed,
`cgc --help` stays light, the runtime stays
independent of the compiler (it imports the plan contract, ``cgc.plan_schema``, only), and
the code is ruff-clean."""

from __future__ import annotations

import ast
import re
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


# Distribution names on PyPI that are not this project: "cgc" is Card Games Converters, so
# `pip install "cgc[hf]"` outside a clone installs a stranger's package.
TAKEN_ON_PYPI = {"cgc"}


def test_the_distribution_name_is_not_a_strangers_and_the_extras_name_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = project["name"]
    assert name not in TAKEN_ON_PYPI
    for extra, requirements in project["optional-dependencies"].items():
        for req in requirements:  # an extra that asks for another extra names this project
            head = re.match(r"[A-Za-z0-9._-]+", req)
            assert head and head.group() not in TAKEN_ON_PYPI, (extra, req)
    # the command stays cgc; its entry takes Ctrl-C before any heavy import (issue 44)
    assert project["scripts"] == {"cgc": "cgc.cli.entry:main"}


def test_no_install_line_names_the_strangers_distribution():
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.py"),
             *(ROOT / "runtime").rglob("*.py"), *(ROOT / "cgc").rglob("*.py")]
    said = [f"{path.relative_to(ROOT)}: {m.group()}" for path in texts
            for m in re.finditer(r"\bcgc\[\w+\]", path.read_text())]
    assert said == []


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


# The runtime depends on the plan contract only: the schema package, which holds the
# verifier that start() runs (cgc.plan_schema.verify).
RUNTIME_MAY_IMPORT = ("cgc.runtime", "cgc.plan_schema")


def test_runtime_does_not_import_the_compiler():
    mods = _imported_after("import cgc.runtime")
    assert not _cgc_modules_outside(mods, RUNTIME_MAY_IMPORT)


def _imports_in(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``: statements at any depth (the runtime
    imports lazily inside functions) and ``importlib.import_module("...")`` of a literal."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # ``from cgc import verify`` names the module in the alias, not in ``module``
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


def test_runtime_source_imports_nothing_of_the_compiler():
    # Import-time probing cannot see the imports inside functions (start() imports the
    # verifier lazily), so every import written anywhere in runtime/ is read here.
    compiler = ("cgc.verify", "cgc.frontend", "cgc.passes", "cgc.ir", "cgc.cli", "cgc.api",
                "cgc.viz", "cgc.ray_compat")
    bad = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        for line, mod in _imports_in(path):
            ours = mod.startswith("cgc.")
            if mod.split(".")[0] == "networkx" or (
                ours and (mod.startswith(compiler) or not mod.startswith(RUNTIME_MAY_IMPORT))
            ):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    assert not bad, "the runtime imports the compiler:\n" + "\n".join(bad)


def test_only_the_driver_imports_the_driver():
    # The layout is the process boundary: runtime/driver/ runs in the user's process, and
    # what runs in an actor (actor/, comm/, gpu/, channels/, the shared top-level modules)
    # never imports it. Only the package's public face (runtime/__init__.py) re-exports
    # Plan, load, Ref and CompiledGraph from it.
    bad = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        rel = path.relative_to(ROOT / "runtime")
        if rel.parts[0] == "driver" or rel == Path("__init__.py"):
            continue
        for line, mod in _imports_in(path):
            if mod == "cgc.runtime.driver" or mod.startswith("cgc.runtime.driver."):
                bad.append(f"runtime/{rel}:{line}: {mod}")
    assert not bad, "code that runs in actors imports the driver's modules:\n" + "\n".join(bad)


def test_the_import_scan_sees_a_lazy_import_of_the_compiler(tmp_path: Path):
    # The scan above must be able to fail: a lazy import inside a function is found.
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from cgc import verify\n    import cgc.passes.lower\n")
    assert ("cgc.verify" in {m for _, m in _imports_in(probe)}
            and "cgc.passes.lower" in {m for _, m in _imports_in(probe)})


def test_verifier_depends_only_on_the_schema():
    mods = _imported_after("import cgc.plan_schema.verify")
    assert not _cgc_modules_outside(mods, ("cgc.plan_schema",))
    assert "ray" not in mods and "torch" not in mods


def test_the_old_verifier_package_is_gone():
    # One home for the verifier: a leftover cgc/verify/ would be a second copy to drift.
    assert not (ROOT / "cgc" / "verify").exists()
    assert "cgc.verify" not in _declared()


def test_ruff_clean(require_tool):
    require_tool("ruff")
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-3000:]
