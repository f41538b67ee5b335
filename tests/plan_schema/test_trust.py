"""What in a plan needs trust, named where it is (golden text), and the decision."""

from __future__ import annotations

import hashlib

import pytest

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema import signing
from cgc.plan_schema.planfile import open_plan_bytes, write_plan_bytes
from cgc.plan_schema.trust import decide, plan_needs
from cgc.plan_schema.trusted_modules import ModuleTrust

PK = b"\x80\x05K\x01."  # a pickle of 1


def _plan() -> pb.Plan:
    plan = pb.Plan(name="t")
    w0 = plan.graph.actors.add(name="w0")
    w0.cls.module, w0.cls.qualname = "pkg.mod", "W"
    w1 = plan.graph.actors.add(name="w1")
    w1.cls.module, w1.cls.qualname = "pkg.mod", "W"
    plan.graph.nodes.add(id=0, kind=pb.INPUT, name="input")
    plan.graph.nodes.add(id=1, kind=pb.CALL, name="w0.f#0", actor="w0", method="f")
    return plan


def test_a_plan_of_installed_classes_and_plain_values_needs_nothing():
    plan = _plan()
    plan.graph.nodes[1].args.add().constant.list_value.items.add(int_value=3)
    plan.graph.actors[0].options.num_cpus = 1
    needs = plan_needs(plan)
    assert not needs.needs_trust and needs.lines() == []
    assert needs.short() == "nothing that runs code from the file"


def test_everything_that_needs_trust_is_found_and_named():
    plan = _plan()
    mod = plan.graph.modules.add(name="cgcmodel_t", source="x = 1\n", source_file="t.py")
    w0, w1 = plan.graph.actors
    w0.ctor_args.add(int_value=1)
    w0.ctor_args.add().tuple_value.items.add(pickled=PK)
    w0.ctor_kwargs.add(name="cfg").value.map_value.entries.add(
        key=pb.Value(str_value="k"), value=pb.Value(pickled=PK + b"xx"))
    w0.options.runtime_env_json = '{"pip":["evil"]}'
    w1.external.name, w1.external.namespace = "svc", "prod"
    node = plan.graph.nodes[1]
    node.args.add().constant.list_value.items.add().list_value.items.add(pickled=PK)
    node.kwargs.add(name="opt").arg.constant.pickled = PK
    entry = node.args.add().constant.map_value.entries.add(value=pb.Value(int_value=1))
    entry.key.pickled = PK  # a pickle as a dict key
    plan.example_args.add(int_value=0)
    plan.example_args.add(pickled=PK)
    plan.example_kwargs.add(name="scale", value=pb.Value(pickled=PK))
    needs = plan_needs(plan)
    digest = hashlib.sha256(b"x = 1\n").hexdigest()
    assert needs.lines() == [
        f"embedded module cgcmodel_t (from t.py, 6 bytes, sha256 {digest})",
        "pickled value at actor w0 constructor arg 1[0] (5 bytes; unpickling runs code)",
        "pickled value at actor w0 constructor arg 'cfg'['k'] (7 bytes; unpickling runs code)",
        "pickled value at node %1 w0.f#0 arg 0[0][0] (5 bytes; unpickling runs code)",
        "pickled value at node %1 w0.f#0 arg 1[<pickled, 5 bytes>] (the key) (5 bytes; "
        "unpickling runs code)",
        "pickled value at node %1 w0.f#0 arg 'opt' (5 bytes; unpickling runs code)",
        "pickled value at example input 1 (5 bytes; unpickling runs code)",
        "pickled value at example input 'scale' (5 bytes; unpickling runs code)",
        'runtime_env of actor w0: {"pip":["evil"]}',
        "external actor: w1 is the existing actor named 'svc' in namespace 'prod'",
    ]
    assert needs.short() == "1 embedded module, 7 pickled values, 1 runtime_env, 1 external actor"
    del mod


PKG = ModuleTrust(("pkg",), "trusted_modules")  # the user trusts pkg (so pkg.mod)


def _decide(plan: pb.Plan, key=None, *, trust=False, keyring=None, modules=PKG):
    return decide(open_plan_bytes(write_plan_bytes(plan, key=key)), trust=trust,
                  keyring=keyring or signing.Keyring(), modules=modules)


@pytest.fixture()
def keys(tmp_path):
    mine = signing.load_or_create_key(tmp_path / "me")
    friend = signing.load_or_create_key(tmp_path / "friend")
    stranger = signing.load_or_create_key(tmp_path / "stranger")
    ring = signing.Keyring(own=signing.public_key_bytes(mine),
                           trusted={signing.public_key_bytes(friend): "friend"})
    return mine, friend, stranger, ring


def test_decisions(keys):
    mine, friend, stranger, ring = keys
    code = _plan()
    code.graph.modules.add(name="m", source="import os\n")
    plain = _plan()
    private = _plan()
    private.graph.nodes[1].method = "_secret"
    cases = {
        "plain unsigned, module trusted": (_decide(plain, keyring=ring), True,
                                           "trusted-modules"),
        "plain unsigned, no module trusted": (_decide(plain, keyring=ring,
                                                      modules=ModuleTrust()), False, "refused"),
        "plain unsigned, a sibling trusted": (
            _decide(plain, keyring=ring, modules=ModuleTrust(("pk", "pkg.other"))), False,
            "refused"),
        "plain unsigned, private method": (_decide(private, keyring=ring), False, "refused"),
        "plain, private method, mine": (_decide(private, mine, keyring=ring), True, "signed"),
        "code unsigned": (_decide(code, keyring=ring), False, "refused"),
        "code, mine": (_decide(code, mine, keyring=ring), True, "signed"),
        "code, friend": (_decide(code, friend, keyring=ring), True, "signed"),
        "code, stranger": (_decide(code, stranger, keyring=ring), False, "refused"),
        "code, stranger, --trust": (_decide(code, stranger, trust=True, keyring=ring), True,
                                    "trust-flag"),
        "plain, --trust": (_decide(plain, trust=True, keyring=ring), True, "trust-flag"),
    }
    for what, (decision, allowed, basis) in cases.items():
        assert (decision.allowed, decision.basis) == (allowed, basis), what
    assert cases["code, mine"][0].signer.endswith("(your key)")
    assert cases["code, friend"][0].signer.endswith("(trusted key 'friend')")
    assert "a key you do not trust" in cases["code, stranger"][0].signer


def test_a_signature_that_does_not_verify_refuses_even_plain_plans(keys):
    mine, _, _, ring = keys
    data = bytearray(write_plan_bytes(_plan(), key=mine))
    pf = open_plan_bytes(bytes(data))
    header = pf.header
    header.signature = bytes([header.signature[0] ^ 1]) + header.signature[1:]
    raw = header.SerializeToString(deterministic=True)
    from cgc.plan_schema.version import MAGIC

    bad = MAGIC + len(raw).to_bytes(4, "little") + raw + pf.plan.SerializeToString(
        deterministic=True)
    bad_pf = open_plan_bytes(bad)
    assert not bad_pf.signature_valid
    decision = decide(bad_pf, trust=False, keyring=ring)
    assert not decision.allowed and "does not match the content" in decision.signer
    assert decide(bad_pf, trust=True, keyring=ring).basis == "trust-flag"


def test_a_refusal_by_module_names_the_classes_and_the_fix():
    decision = _decide(_plan(), modules=ModuleTrust())
    assert decision.unvouched == (
        "actor w0: class pkg.mod.W, from a module you do not trust (pkg.mod)",
        "actor w1: class pkg.mod.W, from a module you do not trust (pkg.mod)",
    )
    assert "not every class is from a module you trust" in decision.rule()
    from cgc.plan_schema.trust import refusal_text

    text = refusal_text(decision, "t", "t.cgplan")
    assert "`cgc trust add-module pkg.mod` trusts them" in text
    allowed = _decide(_plan())
    assert allowed.rule() == ("runs here: yes, unsigned, but every class is from a module "
                              "you trust (pkg; trusted_modules)")


def test_a_trusted_modules_decision_covers_only_what_the_modules_vouch_for():
    decision = _decide(_plan())
    plan = _plan()
    assert decision.permits(plan)
    plan.example_args.add(pickled=PK)
    assert not decision.permits(plan)
    other = _plan()
    other.graph.actors[1].cls.module = "subprocess"
    assert not decision.permits(other)
    private = _plan()
    private.graph.nodes[1].method = "__init__"
    assert not decision.permits(private)
