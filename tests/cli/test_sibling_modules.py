"""A model file that imports local modules from its own folder (``helpers.py``, a package)
compiles into a plan that carries them, so ``cgc run`` works from any other folder;
``cgc check`` says what the plan needs installed; a local module that cannot travel as
source fails the compile, naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

MODEL = textwrap.dedent("""
    import cgc
    from cgc import InputNode

    import helpers
    from shapes.area import square
    from workers import Adder


    @cgc.actor
    class Scaler:
        def f(self, x):
            return helpers.twice(square(x))


    def build_dag():
        s, a = Scaler.bind(), Adder.bind(5)
        with InputNode() as inp:
            return a.add.bind(s.f.bind(inp))


    def example_inputs():
        return (3,)
""")


def _write_model(folder):
    folder.mkdir()
    (folder / "model.py").write_text(MODEL)
    (folder / "helpers.py").write_text("import json\n\ndef twice(x):\n    return 2 * x\n")
    (folder / "workers.py").write_text(textwrap.dedent("""
        import cgc

        @cgc.actor
        class Adder:
            def __init__(self, k):
                self.k = k

            def add(self, x):
                return x + self.k
    """))
    (folder / "shapes").mkdir()
    (folder / "shapes" / "__init__.py").write_text("")
    (folder / "shapes" / "area.py").write_text(
        "from .calc import mul\n\ndef square(x):\n    return mul(x, x)\n")
    (folder / "shapes" / "calc.py").write_text("def mul(a, b):\n    return a * b\n")


def _cli(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "cgc.cli.main", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_sibling_modules_travel_in_the_plan(tmp_path, ray_address):
    _write_model(tmp_path / "model_dir")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    plan = elsewhere / "m.cgplan"
    done = _cli(["compile", str(tmp_path / "model_dir" / "model.py"), "-o", str(plan)],
                elsewhere, env)
    assert done.returncode == 0, done.stderr
    checked = _cli(["check", str(plan)], elsewhere, env)
    assert checked.returncode == 0, checked.stderr
    assert "needs installed where it runs: cgc (imported by model.py" in checked.stdout
    assert "helpers" not in checked.stdout.split("needs installed")[1]  # it travels
    # The model folder is gone: only the plan is left, run from another folder.
    for p in sorted((tmp_path / "model_dir").rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    ran = _cli(["run", str(plan), "--iters", "3", "--json", "--address", ray_address],
               elsewhere, env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout)["outputs"] == 2 * 3 * 3 + 5


def test_local_module_that_cannot_travel_fails_the_compile_naming_it(tmp_path):
    folder = tmp_path / "m"
    _write_model(folder)
    # A folder without __init__.py imports fine (a namespace package) but has no one
    # source to carry.
    (folder / "nsp").mkdir()
    (folder / "nsp" / "tool.py").write_text("X = 1\n")
    (folder / "model.py").write_text(MODEL.replace("import helpers\n",
                                                   "import helpers\nimport nsp.tool\n"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = _cli(["compile", str(folder / "model.py"), "-o", str(tmp_path / "x.cgplan")],
                tmp_path, env)
    assert done.returncode == 3, done.stderr
    assert "'nsp'" in done.stderr and "cannot travel" in done.stderr
