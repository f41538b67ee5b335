"""README.md's Python snippets are valid Python, and the drop-in snippet runs on its model."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks() -> list[str]:
    """The README's ```python blocks, in order."""
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_every_python_block_compiles():
    for block in _python_blocks():
        compile(block, "README.md", "exec")  # SyntaxError: e.g. await outside a function


def test_the_drop_in_snippet_runs_on_the_readmes_model(tmp_path):
    [model] = [b for b in _python_blocks() if "def build_dag" in b]
    [snippet] = [b for b in _python_blocks() if "plan.start()" in b]
    script = tmp_path / "readme.py"
    script.write_text(f"{model}\ndag = build_dag()\n{snippet}")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["6", "9"]


def test_ci_runs_the_readmes_test_commands_in_a_fresh_venv():
    readme = (ROOT / "README.md").read_text()
    [command] = re.findall(r"Run the tests.*?```bash\n(.*?)\n```", readme, re.S)
    ci = [line.split("  #")[0] for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if not line.startswith("#")]
    assert [line for line in ci if line.startswith("python3 -m venv")]
    for part in command.split(" && "):  # each of the README's commands, verbatim, in the venv
        assert [line for line in ci if part in line], part
    assert "xdist" in (ROOT / "pyproject.toml").read_text()  # -n needs pytest-xdist
