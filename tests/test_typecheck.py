"""mypy over every package: the compiler, the runtime, the schema, the CLI and the views.

What is checked and how strictly is ``[tool.mypy]`` in pyproject.toml. mypy cannot see the
editable install's package mapping (``runtime/`` installs as ``cgc.runtime``,
``plan_schema/`` as ``cgc.plan_schema``), so the packages are laid out here as they are
installed: a folder per package, its files symlinked, plus type stubs for ``plan_pb2``
generated from plan.proto (protoc's ``--pyi_out``). Findings are reported with the paths
of this checkout.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _installed_tree(dest: Path) -> Path:
    """``dest/cgc/...`` laid out as the wheel installs it, by symlinks into this checkout."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = config["package-dir"]
    for pkg in sorted(mapping, key=lambda p: p.count(".")):  # parents before children
        folder = dest.joinpath(*pkg.split("."))
        folder.mkdir(parents=True)
        for entry in sorted((ROOT / mapping[pkg]).iterdir()):
            if entry.name != "__pycache__":
                (folder / entry.name).symlink_to(entry)
    schema = dest / "cgc" / "plan_schema"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'plan_schema'}",
         f"--pyi_out={schema}", str(ROOT / "plan_schema" / "plan.proto")],
        check=True,
    )
    return dest


def _checkout_paths(output: str, tree: Path) -> str:
    """mypy's ``cgc/runtime/messages.py:68: ...`` -> ``runtime/messages.py:68: ...``."""
    lines = []
    for line in output.splitlines():
        path, sep, rest = line.partition(":")
        target = tree / path
        if sep and path.endswith((".py", ".pyi")) and target.exists():
            real = target.resolve()
            path = str(real.relative_to(ROOT)) if real.is_relative_to(ROOT) else path
        lines.append(path + sep + rest)
    return "\n".join(lines)


def test_mypy_is_clean(tmp_path: Path, require_tool: Callable[[str], None]) -> None:
    require_tool("mypy")
    require_tool("grpc_tools")
    tree = _installed_tree(tmp_path / "tree")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", "--show-error-codes"],
        cwd=tree, capture_output=True, text=True,
    )
    report = _checkout_paths(out.stdout + out.stderr, tree)
    assert out.returncode == 0, f"mypy found problems:\n{report}"


def test_mypy_covers_every_package() -> None:
    """No package is left out of ``[tool.mypy]`` (each is one of, or under, its packages)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    checked = config["mypy"]["packages"]
    missed = [pkg for pkg in config["setuptools"]["packages"]
              if not any(pkg == c or pkg.startswith(c + ".") for c in checked)]
    assert not missed, f"[tool.mypy] packages leave out {missed}"
