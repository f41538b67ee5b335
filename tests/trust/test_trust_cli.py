"""The trust model as a user meets it through the CLI (issue 10, "Done when"): a crafted plan
with the trust bit cleared and a valid checksum is refused with the summary and runs with
--trust; a plan signed by the user runs without a flag; one signed by an unknown key is
refused; inspect/viz/check/load on a plan with nested pickles run no code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trust_plans as T
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import cgc
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema import signing
from cgc.plan_schema.errors import EXIT_INVALID_PLAN, EXIT_USAGE, UntrustedPlanError
from cgc.plan_schema.planfile import write_plan_bytes

ROOT = Path(__file__).resolve().parents[2]
CHAIN = ROOT / "examples" / "chain.py"


def cgc_cli(*args: str, config: Path | None = None, timeout: int = 240):
    """The CLI in a fresh process; ``config`` overrides the session's config folder."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if config is not None:
        env["CGC_CONFIG_DIR"] = str(config)
    return subprocess.run([sys.executable, "-m", "cgc.cli.main", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def chain_proto() -> pb.Plan:
    """The chain example, compiled in this process (embedded model source, no Ray)."""
    return cgc.compile_file(CHAIN).proto


def test_crafted_plan_with_the_bit_cleared_is_refused_with_the_summary_then_runs_with_trust(
        chain_proto, tmp_path):
    marker = tmp_path / "ran"
    plan = pb.Plan()
    plan.CopyFrom(chain_proto)
    plan.needs_trust = False
    del plan.example_args[:]
    plan.example_args.add().CopyFrom(T.pickled(marker, 1.5))  # unpickles to the usual 1.5
    path = tmp_path / "crafted.cgplan"
    path.write_bytes(T.envelope(plan, needs_trust_bit=False))  # valid checksum, bit cleared

    refused = cgc_cli("run", str(path), "--iters", "2")
    assert refused.returncode == EXIT_INVALID_PLAN, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    err = refused.stderr
    assert "is not trusted here: unsigned" in err
    assert "embedded module cgcmodel_chain (from chain.py" in err
    source = plan.graph.modules[0].source.encode()
    import hashlib

    assert f"{len(source):,} bytes, sha256 {hashlib.sha256(source).hexdigest()}" in err
    assert "pickled value at example input 0 (" in err
    assert "--trust" in err
    assert not marker.exists()

    ran = cgc_cli("run", str(path), "--iters", "2", "--json", "--trust")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout)["outputs"] == 5.5
    assert marker.exists()  # with --trust the pickled input really was used


def test_plan_signed_by_the_user_runs_without_a_flag(tmp_path):
    path = tmp_path / "chain.cgplan"
    compiled = cgc_cli("compile", str(CHAIN), "-o", str(path))
    assert compiled.returncode == 0, compiled.stderr
    assert "signature: signed by SHA256:" in compiled.stdout and "(your key)" in compiled.stdout
    ran = cgc_cli("run", str(path), "--iters", "2", "--json")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout)["outputs"] == 5.5


def test_plan_signed_by_an_unknown_key_is_refused_until_the_key_is_trusted(
        chain_proto, tmp_path):
    config = tmp_path / "config"
    stranger = Ed25519PrivateKey.generate()
    plan = pb.Plan()
    plan.CopyFrom(chain_proto)
    path = tmp_path / "theirs.cgplan"
    path.write_bytes(write_plan_bytes(plan, key=stranger))
    fp = signing.fingerprint(signing.public_key_bytes(stranger))

    refused = cgc_cli("run", str(path), "--iters", "1", config=config)
    assert refused.returncode == EXIT_INVALID_PLAN
    assert f"signed by {fp}, a key you do not trust" in refused.stderr
    assert "embedded module cgcmodel_chain" in refused.stderr

    shown = cgc_cli("inspect", str(path), config=config)
    assert f"signature: signed by {fp}, a key you do not trust" in shown.stdout

    pub = tmp_path / "stranger.pub"
    pub.write_text(signing.public_key_line(signing.public_key_bytes(stranger), "bob@lab") + "\n")
    added = cgc_cli("keys", "add", str(pub), config=config)
    assert added.returncode == 0, added.stderr
    assert f"trusted: {fp}" in added.stdout
    again = cgc_cli("keys", "add", str(pub), config=config)
    assert f"already trusted: {fp}" in again.stdout
    shown = cgc_cli("inspect", str(path), config=config)
    assert f"signature: signed by {fp} (trusted key 'bob@lab')" in shown.stdout
    assert "runs here: yes, signed by a key you trust" in shown.stdout
    listed = cgc_cli("keys", "list", config=config)
    assert f"{fp} bob@lab" in listed.stdout


def test_a_signed_plan_changed_after_signing_is_refused(tmp_path):
    path = tmp_path / "chain.cgplan"
    assert cgc_cli("compile", str(CHAIN), "-o", str(path)).returncode == 0
    header, plan = T.split(path.read_bytes())
    plan.graph.modules[0].source += "\nimport os  # added later\n"
    # Checksum recomputed, the original signature and key kept.
    path.write_bytes(T.envelope(plan, signature=header.signature, signer_key=header.signer_key))
    refused = cgc_cli("run", str(path), "--iters", "1")
    assert refused.returncode == EXIT_INVALID_PLAN
    assert "does not match the content" in refused.stderr


def test_inspect_viz_check_and_load_run_no_code_from_nested_pickles(chain_proto, tmp_path):
    marker = tmp_path / "ran"
    plan = pb.Plan()
    plan.CopyFrom(chain_proto)
    T.nest_pickles(plan, marker)
    # The embedded model source leaves a marker too, were anything to import it.
    src_marker = tmp_path / "source-ran"
    mod = plan.graph.modules[0]
    mod.source = f"open({str(src_marker)!r}, 'w').close()\n" + mod.source
    path = tmp_path / "nested.cgplan"
    path.write_bytes(T.envelope(plan))

    shown = cgc_cli("inspect", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "[1, [<pickled, " in shown.stdout and "{'k': <pickled, " in shown.stdout
    assert "pickled value at node %1 adder0.add#0 arg 1[1][0] (" in shown.stdout
    assert "pickled value at actor adder0 constructor arg 1[0] (" in shown.stdout
    assert "pickled value at node %1 adder0.add#0 arg 'cfg'['k'] (" in shown.stdout
    for args in (["inspect", "--json"], ["inspect", "--code"], ["check"],
                 ["viz", "--ascii"], ["viz", "--schedule", "--ascii"],
                 ["viz", "-o", str(tmp_path / "g.dot")]):
        done = cgc_cli(*args, str(path))
        assert done.returncode == 0, (args, done.stderr)
    code = cgc_cli("inspect", "--code", str(path)).stdout
    assert "# ---- embedded module cgcmodel_chain" in code and "class Adder" in code
    assert "4 pickled values" in code

    with pytest.raises(UntrustedPlanError, match="pickled value at example input 0"):
        cgc.load(path)
    loaded = cgc.load(path, trust=True)  # loading with trust still unpickles nothing
    assert loaded.trust.basis == "trust-flag" and len(loaded.trust.needs.pickles) == 4
    assert not marker.exists() and not src_marker.exists()


def test_compile_no_sign_and_keys_show(tmp_path):
    config = tmp_path / "config"
    path = tmp_path / "u.cgplan"
    done = cgc_cli("compile", str(CHAIN), "-o", str(path), "--no-sign", config=config)
    assert done.returncode == 0, done.stderr
    assert "signature: unsigned" in done.stdout and "runs here: no, it holds code" in done.stdout
    assert not (config / signing.KEY_FILE).exists()  # --no-sign makes no key
    shown = cgc_cli("keys", "show", config=config)
    assert shown.returncode == 0, shown.stderr
    public, _ = signing.parse_public_key_line(shown.stdout)
    assert signing.fingerprint(public) in shown.stderr
    assert (config / signing.KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert config.stat().st_mode & 0o777 == 0o700


def test_a_key_file_open_to_others_is_refused_clearly(tmp_path):
    config = tmp_path / "config"
    assert cgc_cli("keys", "show", config=config).returncode == 0
    (config / signing.KEY_FILE).chmod(0o644)
    done = cgc_cli("compile", str(CHAIN), "-o", str(tmp_path / "x.cgplan"), config=config)
    assert done.returncode == EXIT_USAGE
    assert "Traceback" not in done.stderr
    assert "mode 644, open to other users" in done.stderr and "chmod 600" in done.stderr
