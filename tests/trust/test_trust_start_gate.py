"""``Plan.start()`` refuses a plan its trust decision does not cover before any actor exists,
and an unsigned plan run without --trust may only name classes from modules the user
trusts, and public methods: naming an installed callable with plain arguments can be as
strong as code (issue 20: Ray's own file server took the signing key). Deciding imports
nothing the plan names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trust_plans as T

import cgc
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema import signing
from cgc.plan_schema.errors import UntrustedPlanError
from cgc.plan_schema.planfile import write_plan_bytes
from cgc.plan_schema.trust import TrustDecision
from cgc.plan_schema.trusted_modules import add_trusted_module, remove_trusted_module
from cgc.runtime import Plan
from cgc.runtime.actor.host import load_class
from cgc.runtime.driver.trust_gate import require_trusted

ROOT = Path(__file__).resolve().parents[2]


def _plain_plan(module: str, qualname: str, method: str = "f", ctor: list | None = None):
    """A lowered one-actor plan naming ``module.qualname`` with plain constructor args."""
    plan = cgc.compile_file(ROOT / "examples" / "echo.py").proto
    del plan.graph.modules[:]
    actor = plan.graph.actors[0]
    actor.cls.module, actor.cls.qualname = module, qualname
    for v in ctor or []:
        actor.ctor_args.add().CopyFrom(v)
    for n in plan.graph.nodes:
        if n.kind == pb.CALL:
            n.method = method
    return plan


def _refused_in_a_fresh_process(path: Path, cwd: Path, config: Path, forbidden: str):
    """Load and start ``path`` as a user would, in a fresh process; return what it printed.

    The child reports whether Ray started and whether any module under ``forbidden`` was
    imported: deciding trust must import nothing the plan names.
    """
    script = textwrap.dedent(f"""
        import sys, cgc, cgc.runtime
        try:
            cgc.load({str(path)!r}).start()
        except cgc.runtime.UntrustedPlanError as exc:
            print("REFUSED", exc)
        import ray
        print("RAY", ray.is_initialized())
        print("IMPORTED", sorted(m for m in sys.modules
                                 if m == {forbidden!r} or m.startswith({forbidden + "."!r})))
    """)
    env = {**os.environ, "CGC_CONFIG_DIR": str(config)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)
    return done.stdout + done.stderr


def test_an_installed_callable_with_plain_args_does_not_start(tmp_path):
    marker = tmp_path / "ran"
    argv = pb.Value()
    for word in ("touch", str(marker)):
        argv.list_value.items.add(str_value=word)
    path = tmp_path / "popen.cgplan"
    path.write_bytes(write_plan_bytes(_plain_plan("subprocess", "Popen", "wait", [argv])))
    out = _refused_in_a_fresh_process(path, tmp_path, tmp_path / "cfg", "subprocess")
    assert "REFUSED" in out, out
    assert "class subprocess.Popen, from a module you do not trust (subprocess)" in out
    assert "RAY False" in out  # refused before Ray or any actor
    assert not marker.exists()


def test_rays_own_file_server_cannot_take_the_signing_key(tmp_path):
    """The audit's exfiltration plan: only Ray's own installed @ray.remote classes, plain
    string arguments (the victim's config folder), unsigned. Refused at load; nothing of
    ray.data is imported, no Ray starts, no server listens."""
    config = tmp_path / "cfg"
    signing.load_or_create_key(config)  # the victim has a key worth stealing
    plan = cgc.compile_file(ROOT / "examples" / "chain.py").proto  # two actors or more
    del plan.graph.modules[:]
    first, second = plan.graph.actors[0], plan.graph.actors[1]
    first.cls.module = ("ray.data._internal.execution.operators.shuffle_operators."
                        "disk_shuffle_runtime")
    first.cls.qualname = "ShuffleFileServer"
    del first.ctor_args[:]
    first.ctor_args.add(str_value=str(config))
    second.cls.module, second.cls.qualname = "ray._private.ray_experimental_perf", "DAGActor"
    for a in plan.graph.actors[2:]:
        a.cls.module, a.cls.qualname = second.cls.module, second.cls.qualname
    path = tmp_path / "exfil.cgplan"
    path.write_bytes(write_plan_bytes(plan))
    out = _refused_in_a_fresh_process(path, tmp_path, config, "ray.data")
    assert "REFUSED" in out, out
    assert "class ray.data._internal.execution.operators.shuffle_operators." in out
    assert "RAY False" in out and "IMPORTED []" in out
    # and through the CLI: exit 4, the rule named
    cli = subprocess.run([sys.executable, "-m", "cgc.cli.main", "check", str(path)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CGC_CONFIG_DIR": str(config)})
    assert cli.returncode == 0, cli.stdout + cli.stderr  # a valid plan...
    assert "runs here: no, unsigned and not every class is from a module you trust" in cli.stdout
    run = subprocess.run([sys.executable, "-m", "cgc.cli.main", "run", str(path)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CGC_CONFIG_DIR": str(config)})
    assert run.returncode == 4 and "Traceback" not in run.stderr, run.stdout + run.stderr


def test_a_module_whose_import_runs_a_program_is_never_imported(tmp_path):
    """``venv.__main__`` builds virtualenvs when imported; the trust check must not import
    it (it did: `cgc run` made a virtualenv in the current folder)."""
    work = tmp_path / "cwd"
    work.mkdir()
    path = work / "venv.cgplan"
    path.write_bytes(write_plan_bytes(_plain_plan("venv.__main__", "EnvBuilder")))
    before = sorted(p.name for p in work.iterdir())
    out = _refused_in_a_fresh_process(path, work, tmp_path / "cfg", "venv")
    assert "REFUSED" in out and "IMPORTED []" in out, out
    run = subprocess.run([sys.executable, "-m", "cgc.cli.main", "run", str(path)], cwd=work,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CGC_CONFIG_DIR": str(tmp_path / "cfg")})
    assert run.returncode == 4, run.stdout + run.stderr
    assert sorted(p.name for p in work.iterdir()) == before  # no virtualenv was made


def test_attribute_lookups_do_not_make_a_class_trusted(tmp_path):
    """``torch.ops`` and ``unittest.mock.sentinel`` answer any attribute (they passed the
    old "marked actor" test); under the module rule they are untrusted modules."""
    for module, qualname in (("torch", "ops.Anything"), ("unittest.mock", "sentinel.X")):
        path = tmp_path / f"{module}.cgplan"
        path.write_bytes(write_plan_bytes(_plain_plan(module, qualname)))
        with pytest.raises(UntrustedPlanError, match="from a module you do not trust"):
            cgc.load(path)


def _installed_module(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "installed_actors.py").write_text(textwrap.dedent("""
        import subprocess  # noqa: F401 - reachable as installed_actors.subprocess

        import cgc

        @cgc.actor
        class Worker:
            def f(self, x):
                return x
    """))
    return tmp_path


def test_a_plan_of_a_trusted_modules_classes_runs_unsigned(tmp_path):
    """The user vouches for installed_actors; an unsigned plan of its class runs through
    `cgc run` with no flag (a real local Ray, actors importing the module)."""
    lib = _installed_module(tmp_path / "lib")
    config = tmp_path / "cfg"
    path = tmp_path / "u.cgplan"
    path.write_bytes(write_plan_bytes(_plain_plan("installed_actors", "Worker")))
    env = {**os.environ, "CGC_CONFIG_DIR": str(config),
           "PYTHONPATH": os.pathsep.join([str(lib), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cgc.cli.main", *args], env=env,
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)

    refused = cli("run", str(path), "--iters", "2")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "cgc trust add-module installed_actors" in refused.stderr
    added = cli("trust", "add-module", "installed_actors")
    assert added.returncode == 0 and "trusted: installed_actors" in added.stdout
    check = cli("check", str(path))
    assert ("runs here: yes, unsigned, but every class is from a module you trust "
            "(installed_actors;") in check.stdout, check.stdout
    ran = cli("run", str(path), "--iters", "2", "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(ran.stdout)["outputs"] == "hello"


def test_a_trusted_module_cannot_lend_another_modules_class(tmp_path, monkeypatch):
    """``installed_actors.subprocess.Popen`` is subprocess's class reached through a trusted
    module's import: refused when the class is loaded, before any actor is created."""
    monkeypatch.syspath_prepend(str(_installed_module(tmp_path)))
    add_trusted_module("installed_actors")
    marker = tmp_path / "ran"
    argv = pb.Value()
    for word in ("touch", str(marker)):
        argv.list_value.items.add(str_value=word)
    path = tmp_path / "smuggled.cgplan"
    path.write_bytes(write_plan_bytes(_plain_plan("installed_actors", "subprocess.Popen",
                                                  "wait", [argv])))
    try:
        plan = cgc.load(path)  # the module is trusted: it loads
        with pytest.raises(ImportError, match="is the class subprocess.Popen, defined in "
                                              "another module"):
            load_class("installed_actors", "subprocess.Popen")
        assert plan.trust.basis == "trusted-modules"
    finally:
        remove_trusted_module("installed_actors")
    assert not marker.exists()


def test_a_plain_plan_may_not_call_private_methods(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(_installed_module(tmp_path)))
    add_trusted_module("installed_actors")
    try:
        ok = tmp_path / "ok.cgplan"
        ok.write_bytes(write_plan_bytes(_plain_plan("installed_actors", "Worker")))
        plan = cgc.load(ok)
        assert plan.trust.basis == "trusted-modules"
        require_trusted(plan)  # a trusted module's class and a public method: may start
        bad = tmp_path / "bad.cgplan"
        bad.write_bytes(write_plan_bytes(_plain_plan("installed_actors", "Worker",
                                                     "__init__")))
        with pytest.raises(UntrustedPlanError, match="private method '__init__'"):
            cgc.load(bad)
        require_trusted(cgc.load(bad, trust=True))  # the user vouches for it
    finally:
        remove_trusted_module("installed_actors")


def test_content_added_after_a_trusted_modules_load_is_not_covered(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(_installed_module(tmp_path)))
    add_trusted_module("installed_actors")
    marker = tmp_path / "ran"
    path = tmp_path / "p.cgplan"
    path.write_bytes(write_plan_bytes(_plain_plan("installed_actors", "Worker")))
    try:
        plan = cgc.load(path)
    finally:
        remove_trusted_module("installed_actors")
    plan.proto.example_args.add().CopyFrom(T.pickled(marker))
    with pytest.raises(UntrustedPlanError, match="pickled value at example input 1"):
        plan.start()
    plan.proto.example_args.pop()
    plan.proto.graph.actors[0].cls.module = "subprocess"
    with pytest.raises(UntrustedPlanError, match="from a module you do not trust"):
        plan.start()
    assert not marker.exists()


def test_a_refused_decision_stops_start_and_in_process_plans_are_the_callers(tmp_path):
    marker = tmp_path / "ran"
    proto = cgc.compile_file(ROOT / "examples" / "chain.py").proto
    proto.graph.actors[0].ctor_args.add().CopyFrom(T.pickled(marker))
    refused = TrustDecision(allowed=False, basis="refused")
    with pytest.raises(UntrustedPlanError, match="pickled value at actor adder0"):
        Plan(proto, trust=refused).start()
    assert Plan(proto).trust.basis == "in-process"
    require_trusted(Plan(proto))  # built here: the caller's own code
    assert not marker.exists()


def test_save_signs_and_load_records_the_decision(tmp_path):
    plan = cgc.compile_file(ROOT / "examples" / "chain.py")
    signed, unsigned = tmp_path / "s.cgplan", tmp_path / "u.cgplan"
    plan.save(signed)
    plan.save(unsigned, sign=False)
    loaded = cgc.load(signed)
    assert loaded.trust.allowed and loaded.trust.basis == "signed"
    assert "(your key)" in loaded.trust.signer
    assert [m.name for m in loaded.trust.needs.modules] == ["cgcmodel_chain"]
    with pytest.raises(UntrustedPlanError, match="unsigned"):
        cgc.load(unsigned)
    assert cgc.load(unsigned, trust=True).trust.basis == "trust-flag"
    again = tmp_path / "s2.cgplan"
    plan.save(again)
    assert again.read_bytes() == signed.read_bytes()  # signing keeps plans deterministic
