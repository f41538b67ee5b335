"""Actor classes of ``__main__`` travel by value (cloudpickle), never by running the script
again: a script without a main guard, ``python -c``, stdin and notebook-style cells all
compile and run, their top level runs exactly once, and a plan saved from such a session
holds the class pickled (so it needs trust)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# A graph whose actor class lives in __main__; every run of the top level appends a line
# to $MARK, so "ran once" is a fact the test reads back.
SCRIPT = textwrap.dedent("""
    import os
    import cgc
    from cgc import InputNode

    with open(os.environ["MARK"], "a") as f:
        f.write("top level ran\\n")


    def helper(x):
        return x + 1


    @cgc.actor
    class Doubler:
        def __init__(self, k):
            self.k = k

        def run(self, x):
            return helper(x) * self.k


    w = Doubler.bind(2)
    with InputNode() as inp:
        dag = w.run.bind(inp)
    plan = cgc.compile(dag, name="by_value")
    with plan.start(address=os.environ["ADDR"], get_timeout=60) as g:
        print("RESULT", g.execute(3).get())
    if os.environ.get("SAVE"):
        plan.save(os.environ["SAVE"])
""")


def _run(args, env_extra, tmp_path, ray_address, stdin=None):
    mark = tmp_path / "mark.txt"
    env = {**os.environ, "MARK": str(mark), "ADDR": ray_address, **env_extra}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, *args], input=stdin, capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, mark.read_text().splitlines() if mark.exists() else []


def test_script_without_main_guard_runs_its_top_level_once(tmp_path, ray_address):
    script = tmp_path / "no_guard.py"
    script.write_text(SCRIPT)
    stdout, marks = _run([str(script)], {}, tmp_path, ray_address)
    assert "RESULT 8" in stdout
    assert marks == ["top level ran"]  # the actor got the class, not the script


def test_python_dash_c(tmp_path, ray_address):
    stdout, marks = _run(["-c", SCRIPT], {}, tmp_path, ray_address)
    assert "RESULT 8" in stdout and marks == ["top level ran"]


def test_stdin(tmp_path, ray_address):
    stdout, marks = _run(["-"], {}, tmp_path, ray_address, stdin=SCRIPT)
    assert "RESULT 8" in stdout and marks == ["top level ran"]


def test_notebook_style_cell(tmp_path, ray_address):
    # What IPython does with a cell: compile it under a pseudo file name, run it in __main__.
    cell = f"exec(compile({SCRIPT!r}, '<ipython-input-1>', 'exec'))\n"
    stdout, marks = _run(["-c", cell], {}, tmp_path, ray_address)
    assert "RESULT 8" in stdout and marks == ["top level ran"]


def test_saved_plan_holds_the_class_pickled_and_needs_trust(tmp_path, ray_address):
    saved = tmp_path / "by_value.cgplan"
    _run(["-c", SCRIPT], {"SAVE": str(saved)}, tmp_path, ray_address)
    from cgc.plan_schema.planfile import open_plan
    from cgc.plan_schema.trust import plan_needs

    proto = open_plan(saved).plan
    needs = plan_needs(proto)
    assert needs.needs_trust and not needs.modules  # no script source travels
    assert [p.where for p in needs.pickles] and "pickled_class" in needs.pickles[0].where
    # Another process runs it (signed with this user's key) without the script's top level.
    runner = textwrap.dedent(f"""
        import os, cgc
        plan = cgc.load({str(saved)!r})
        with plan.start(address=os.environ["ADDR"], get_timeout=60) as g:
            print("RESULT", g.execute(4).get())
    """)
    stdout, marks = _run(["-c", runner], {}, tmp_path, ray_address)
    assert "RESULT 10" in stdout
    assert marks == ["top level ran"]  # still only the first session's line


def test_unsigned_plan_with_a_pickled_class_is_refused(tmp_path, ray_address):
    saved = tmp_path / "unsigned.cgplan"
    script = SCRIPT.replace("plan.save(os.environ[\"SAVE\"])",
                            "plan.save(os.environ[\"SAVE\"], sign=False)")
    _run(["-c", script], {"SAVE": str(saved)}, tmp_path, ray_address)
    import cgc
    from cgc.plan_schema.errors import UntrustedPlanError

    with pytest.raises(UntrustedPlanError, match="pickled"):
        cgc.load(saved)
