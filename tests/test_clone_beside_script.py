"""A script beside a clone named ``cgc`` imports the installed cgc (issue 37, item 7).

``git clone ... cgc`` then a script in the same folder: the folder ``cgc`` (the source
tree's root) comes first on the script's ``sys.path``. It used to be imported as an empty
namespace package that hid the install (``cannot import name 'InputNode' from 'cgc'
(unknown location)``); the root ``__init__.py`` now hands over to the installed cgc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import cgc

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = str(Path(cgc.__file__).resolve())


def _clone_beside(tmp_path: Path) -> Path:
    """``tmp_path/cgc`` laid out as a clone's root: its files, its top folders (empty)."""
    clone = tmp_path / "cgc"
    clone.mkdir()
    for entry in ROOT.iterdir():
        if entry.name.startswith("."):
            continue
        if entry.is_file():
            shutil.copy(entry, clone / entry.name)
        elif entry.is_dir() and entry.name in ("cgc", "runtime", "plan_schema", "examples"):
            (clone / entry.name).mkdir()
    return clone


SCRIPT = textwrap.dedent("""\
    from pathlib import Path

    import cgc
    from cgc import InputNode
    from cgc.runtime import load
    from cgc.plan_schema.errors import CgcError

    print("cgc at", Path(cgc.__file__).resolve())
    print("runtime at", Path(load.__code__.co_filename).resolve().parent.name)
    """)


def test_script_beside_a_clone_imports_the_installed_cgc(tmp_path):
    _clone_beside(tmp_path)
    (tmp_path / "first.py").write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "first.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"cgc at {INSTALLED}" in proc.stdout
    # From the clone's parent as the current folder too (python -c puts "" first).
    proc = subprocess.run([sys.executable, "-c", "from cgc import InputNode, compile"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_clone_without_an_install_says_to_install_it(tmp_path):
    clone = _clone_beside(tmp_path)
    (tmp_path / "first.py").write_text(SCRIPT)
    # -S: no site-packages, so no cgc installed anywhere this interpreter looks.
    proc = subprocess.run([sys.executable, "-S", "first.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"{clone.resolve()} is cgc's source tree, not an installed cgc" in proc.stderr
    assert f"pip install -e {clone.resolve()}" in proc.stderr


def test_script_beside_a_clone_imports_a_regular_install(tmp_path):
    # cgc installed as a wheel lays it out: site/cgc, site/cgc/runtime, site/cgc/plan_schema.
    # (A namespace folder never beat a regular install; the clone's root __init__.py, a
    # regular package first on the path, must still hand over to it.)
    site = tmp_path / "site"
    shutil.copytree(ROOT / "cgc", site / "cgc", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("runtime", "plan_schema"):
        shutil.copytree(ROOT / folder, site / "cgc" / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    _clone_beside(work)
    (work / "first.py").write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "first.py"], cwd=work, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    assert f"cgc at {(site / 'cgc' / '__init__.py').resolve()}" in proc.stdout
