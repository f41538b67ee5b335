"""``Plan.start()`` refuses a plan its trust decision does not cover before any actor exists,
and a plain (unsigned, no --trust) plan may only name marked actor classes and public
methods: naming an installed callable with plain arguments can be as strong as code."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trust_plans as T

import cgc
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import UntrustedPlanError
from cgc.plan_schema.planfile import write_plan_bytes
from cgc.plan_schema.trust import TrustDecision
from cgc.runtime import Plan
from cgc.runtime.trust_gate import require_trusted

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


def test_an_installed_callable_with_plain_args_does_not_start(tmp_path):
    marker = tmp_path / "ran"
    argv = pb.Value()
    for word in ("touch", str(marker)):
        argv.list_value.items.add(str_value=word)
    path = tmp_path / "popen.cgplan"
    path.write_bytes(write_plan_bytes(_plain_plan("subprocess", "Popen", "wait", [argv])))
    script = textwrap.dedent(f"""
        import cgc, ray
        plan = cgc.load({str(path)!r})           # plain content: loads without trust
        assert plan.trust.basis == "plain", plan.trust
        try:
            plan.start()
        except cgc.runtime.UntrustedPlanError as exc:
            print("REFUSED", exc)
        print("RAY", ray.is_initialized())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert "REFUSED" in done.stdout, done.stdout + done.stderr
    assert "subprocess.Popen) is not marked as an actor class" in done.stdout
    assert "RAY False" in done.stdout  # refused before Ray or any actor
    assert not marker.exists()


def test_a_plain_plan_may_not_call_private_methods(tmp_path, monkeypatch):
    (tmp_path / "installed_actors.py").write_text(textwrap.dedent("""
        import cgc

        @cgc.actor
        class Worker:
            def f(self, x):
                return x
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    ok = tmp_path / "ok.cgplan"
    ok.write_bytes(write_plan_bytes(_plain_plan("installed_actors", "Worker")))
    plan = cgc.load(ok)
    assert plan.trust.basis == "plain"
    require_trusted(plan)  # a marked class and a public method: may start
    bad = tmp_path / "bad.cgplan"
    bad.write_bytes(write_plan_bytes(_plain_plan("installed_actors", "Worker", "__init__")))
    with pytest.raises(UntrustedPlanError, match="private method '__init__'"):
        require_trusted(cgc.load(bad))
    require_trusted(cgc.load(bad, trust=True))  # the user vouches for it


def test_content_added_after_a_plain_load_is_not_covered(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "p.cgplan"
    path.write_bytes(write_plan_bytes(_plain_plan("installed_nowhere", "W")))
    plan = cgc.load(path)
    plan.proto.example_args.add().CopyFrom(T.pickled(marker))
    with pytest.raises(UntrustedPlanError, match="pickled value at example input 1"):
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
