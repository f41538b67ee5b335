"""Whether a plan may run here: decided from what it holds, never from a bit it carries.

A plan *needs trust* when starting it would run code that came with the file, or reach
outside the graph it describes:

- embedded module source (``EmbeddedModule``, anywhere): executed in the driver and actors;
- pickled values at any depth (``Value.pickled`` and any bytes field whose name holds
  "pickle", so a class carried by value is covered too): unpickling runs code;
- a ``runtime_env`` (``ActorOptions.runtime_env_json``): Ray installs packages and runs
  set-up hooks from it;
- external actors (``ExternalActor``): the graph calls into actors it did not create.

Such a plan runs only when it carries a valid signature by a key the user trusts
(``cgc.plan_schema.signing``), or when the user says so (``--trust`` / ``trust=True``).
The header's ``needs_trust`` bit is written for information and never read here.

Example::

    pf = open_plan_bytes(data, "x.cgplan")
    decision = decide(pf, trust=False)
    if not decision.allowed:
        raise untrusted_error(decision, "x.cgplan")
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import UntrustedPlanError

if TYPE_CHECKING:
    from cgc.plan_schema.planfile import PlanFile
    from cgc.plan_schema.signing import Keyring

__all__ = [
    "EmbeddedCode",
    "PickledValue",
    "RuntimeEnv",
    "ExternalBinding",
    "TrustNeeds",
    "TrustDecision",
    "plan_needs",
    "decide",
    "in_process",
    "untrusted_error",
]

# How a decision was reached (TrustDecision.basis).
PLAIN = "plain"  # nothing in the plan runs code from the file
SIGNED = "signed"  # signed by a key the user trusts
TRUST_FLAG = "trust-flag"  # the user passed --trust / trust=True
IN_PROCESS = "in-process"  # built in this process (cgc.compile, Plan(proto)): the caller's own
REFUSED = "refused"


@dataclass(frozen=True)
class EmbeddedCode:
    """An embedded module: executed as Python in the driver and every actor."""

    name: str
    source_file: str
    size: int  # bytes of UTF-8 source
    sha256: str  # hex digest of those bytes

    def text(self) -> str:
        return (f"embedded module {self.name} (from {self.source_file or '?'}, "
                f"{self.size:,} bytes, sha256 {self.sha256})")


@dataclass(frozen=True)
class PickledValue:
    """A pickle in the plan; ``where`` names it (``actor w0 constructor arg 1[2]``)."""

    where: str
    size: int

    def text(self) -> str:
        return f"pickled value at {self.where} ({self.size:,} bytes; unpickling runs code)"


@dataclass(frozen=True)
class RuntimeEnv:
    """An actor's Ray runtime_env (canonical JSON)."""

    actor: str
    json: str

    def text(self) -> str:
        return f"runtime_env of actor {self.actor}: {self.json}"


@dataclass(frozen=True)
class ExternalBinding:
    """An actor the graph binds to instead of creating it."""

    actor: str
    target: str

    def text(self) -> str:
        return f"external actor: {self.actor} is the existing actor {self.target}"


@dataclass(frozen=True)
class TrustNeeds:
    """Everything in a plan that runs code from the file or reaches outside the graph.

    Example: ``plan_needs(plan).needs_trust`` is False for installed classes and plain values.
    """

    modules: tuple[EmbeddedCode, ...] = ()
    pickles: tuple[PickledValue, ...] = ()
    runtime_envs: tuple[RuntimeEnv, ...] = ()
    externals: tuple[ExternalBinding, ...] = ()

    @property
    def needs_trust(self) -> bool:
        return bool(self.modules or self.pickles or self.runtime_envs or self.externals)

    def lines(self) -> list[str]:
        """One line per item, in plan order: what would run or be reached."""
        items: list[EmbeddedCode | PickledValue | RuntimeEnv | ExternalBinding] = [
            *self.modules, *self.pickles, *self.runtime_envs, *self.externals
        ]
        return [it.text() for it in items]

    def short(self) -> str:
        """A count per kind: ``1 embedded module, 2 pickled values``."""
        parts = []
        for n, one, many in ((len(self.modules), "embedded module", "embedded modules"),
                             (len(self.pickles), "pickled value", "pickled values"),
                             (len(self.runtime_envs), "runtime_env", "runtime_envs"),
                             (len(self.externals), "external actor", "external actors")):
            if n:
                parts.append(f"{n} {one if n == 1 else many}")
        return ", ".join(parts) or "nothing that runs code from the file"


# ---------------------------------------------------------------- finding what needs trust


class _Finder:
    def __init__(self) -> None:
        self.modules: list[EmbeddedCode] = []
        self.pickles: list[PickledValue] = []
        self.envs: list[RuntimeEnv] = []
        self.externals: list[ExternalBinding] = []

    def walk(self, msg: Message, where: str, owner: str = "") -> None:
        """Visit every set field of ``msg``; ``where`` names it for people, ``owner`` is
        the actor it belongs to (for options)."""
        if isinstance(msg, pb.EmbeddedModule):
            raw = msg.source.encode("utf-8")
            self.modules.append(EmbeddedCode(msg.name, msg.source_file, len(raw),
                                             hashlib.sha256(raw).hexdigest()))
        elif isinstance(msg, pb.ActorOptions) and msg.runtime_env_json:
            self.envs.append(RuntimeEnv(owner or where, msg.runtime_env_json))
        elif isinstance(msg, pb.ExternalActor) and (msg.name or msg.actor_id):
            target = (f"named {msg.name!r}" + (f" in namespace {msg.namespace!r}"
                                                if msg.namespace else "")
                      if msg.name else f"with id {msg.actor_id}")
            self.externals.append(ExternalBinding(owner or where, target))
        if isinstance(msg, pb.Actor):
            owner = msg.name
        for fd, value in msg.ListFields():
            if fd.type == FieldDescriptor.TYPE_BYTES and "pickle" in fd.name:
                items = value if _repeated(fd) else [value]
                for i, b in enumerate(items):
                    if b:
                        at = where if not _repeated(fd) else f"{where}[{i}]"
                        self.pickles.append(PickledValue(_join(at, fd, msg), len(b)))
            if fd.message_type is None:
                continue
            items = value if _repeated(fd) else [value]
            for i, child in enumerate(items):
                self.walk(child, _label(msg, fd, i, child, where), owner)


def _repeated(fd: FieldDescriptor) -> bool:
    return fd.is_repeated


def _join(where: str, fd: FieldDescriptor, msg: Message) -> str:
    # A Value's pickle is the value itself; another message's pickle field is named.
    if isinstance(msg, pb.Value):
        return where or "a value"
    return f"{where} {fd.name}".strip()


def _label(msg: Message, fd: FieldDescriptor, i: int, child: Any, where: str) -> str:
    """Where ``child`` (item ``i`` of field ``fd`` of ``msg``) is, in words."""
    name = fd.name
    if isinstance(msg, pb.Plan):
        if name == "example_args":
            return f"example input {i}"
        if name == "example_kwargs":
            return f"example input {child.name!r}"
        if name == "graph":
            return ""
    if isinstance(msg, pb.Graph):
        if name == "actors":
            return f"actor {child.name}"
        if name == "nodes":
            return f"node %{child.id} {child.name}".rstrip()
        if name == "modules":
            return f"module {child.name}"
    if isinstance(msg, pb.Actor):
        if name == "ctor_args":
            return f"{where} constructor arg {i}"
        if name == "ctor_kwargs":
            return f"{where} constructor arg {child.name!r}"
    if isinstance(msg, pb.Node):
        if name == "args":
            return f"{where} arg {i}"
        if name == "kwargs":
            return f"{where} arg {child.name!r}"
    if isinstance(msg, (pb.Arg, pb.NamedArg, pb.NamedValue)):
        return where  # the wrapper adds nothing a reader needs
    if isinstance(msg, pb.ValueList):
        return f"{where}[{i}]"
    if isinstance(msg, pb.ValueMap):
        from cgc.plan_schema.values import value_to_text  # never unpickles

        return f"{where}[{value_to_text(child.key, 24)}]"
    if isinstance(msg, pb.MapEntry):
        return f"{where} (the key)" if name == "key" else where
    if isinstance(msg, pb.Value):
        return where  # list_value/tuple_value/map_value: the items name themselves
    suffix = f"{name}[{i}]" if _repeated(fd) else name
    return f"{where} {suffix}".strip() if where else suffix


def plan_needs(plan: pb.Plan) -> TrustNeeds:
    """What in ``plan`` runs code from the file or reaches outside (see module docstring).

    Reads the protobuf only: nothing is unpickled, imported or executed.

    Example: ``plan_needs(plan).lines()`` -> ``["embedded module cgcmodel_chain (...)"]``.
    """
    f = _Finder()
    f.walk(plan, "")
    return TrustNeeds(tuple(f.modules), tuple(f.pickles), tuple(f.envs), tuple(f.externals))


# ---------------------------------------------------------------- deciding


@dataclass(frozen=True)
class TrustDecision:
    """The outcome of the trust check of one plan, kept on the loaded ``Plan``.

    ``allowed``: it may start. ``basis``: why (``plain``, ``signed``, ``trust-flag``,
    ``in-process``, or ``refused``). ``signer``: one line on the signature.

    Example: ``cgc.load("x.cgplan").trust.basis == "signed"``.
    """

    needs: TrustNeeds = field(default_factory=TrustNeeds)
    allowed: bool = True
    basis: str = IN_PROCESS
    signer: str = "unsigned"

    def permits(self, plan: pb.Plan) -> bool:
        """Whether this decision still covers ``plan`` (its content may have changed since:
        a decision that found nothing to trust covers only content with nothing to trust).
        """
        if not self.allowed:
            return False
        if self.basis == PLAIN:
            return not plan_needs(plan).needs_trust
        return True


def in_process() -> TrustDecision:
    """The decision for a plan built in this process (``cgc.compile``, ``Plan(proto)``)."""
    return TrustDecision(basis=IN_PROCESS, signer="built in this process")


def _signer_line(pf: PlanFile, keyring: Keyring | None) -> tuple[str, bool]:
    """(one line on the signature, whether it is valid and by a trusted key)."""
    from cgc.plan_schema.signing import fingerprint

    h = pf.header
    if not h.signature:
        return "unsigned", False
    fp = fingerprint(h.signer_key)
    if not pf.signature_valid:
        return (f"signature by {fp} does not match the content (changed after signing, or "
                "a forged header)"), False
    who = keyring.who(h.signer_key) if keyring is not None else None
    if who is None:
        return f"signed by {fp}, a key you do not trust", False
    return f"signed by {fp} ({who})", True


def decide(pf: PlanFile, *, trust: bool, keyring: Keyring | None = None) -> TrustDecision:
    """Decide whether the plan in ``pf`` may run here.

    Order: a signature that does not verify refuses (unless ``trust``); a valid signature
    by a trusted key allows (``signed``); ``trust`` allows (``trust-flag``); content with
    nothing that needs trust allows (``plain``: ``Plan.start()`` then also checks its
    classes are marked actors); otherwise refused. ``keyring`` defaults to the user's
    (read only when the plan is signed).

    Example: ``decide(open_plan_bytes(data), trust=False).allowed``.

    Raises:
        KeyFileError: the user's key files are malformed or unsafe (signed plans only).
    """
    from cgc.plan_schema.signing import load_keyring

    needs = plan_needs(pf.plan)
    if pf.header.signature and keyring is None:
        keyring = load_keyring()
    signer, trusted_sig = _signer_line(pf, keyring)
    bad_sig = bool(pf.header.signature) and not pf.signature_valid
    if bad_sig:
        basis = TRUST_FLAG if trust else REFUSED
    elif trusted_sig:
        basis = SIGNED
    elif trust:
        basis = TRUST_FLAG
    elif not needs.needs_trust:
        basis = PLAIN
    else:
        basis = REFUSED
    return TrustDecision(needs=needs, allowed=basis != REFUSED, basis=basis, signer=signer)


def refusal_text(decision: TrustDecision, name: str, path: str | None = None) -> str:
    """The message of a refused plan: why, exactly what would run, and how to proceed.

    ``path`` is the plan file, when there is one (the hints then name it).
    """
    where = f"{path}: plan {name!r}" if path else f"plan {name!r}"
    lines = [f"{where} is not trusted here: {decision.signer}."]
    if decision.needs.needs_trust:
        lines.append("starting it would run or reach:")
        lines.extend(f"  {line}" for line in decision.needs.lines())
    if path:
        lines.append(
            f"run it only if you trust where it came from: `cgc run --trust {path}` or "
            f"cgc.load({path!r}, trust=True); `cgc inspect --code {path}` prints the "
            "embedded source; `cgc keys add KEYFILE` trusts a colleague's key")
    else:
        lines.append("start it only if you trust where it came from: load it with "
                     "cgc.load(path, trust=True), or sign it with a key you trust")
    return "\n".join(lines)


def untrusted_error(decision: TrustDecision, name: str,
                    path: str | None = None) -> UntrustedPlanError:
    """The ``UntrustedPlanError`` for a refused decision (``.decision`` holds it).

    Example: ``raise untrusted_error(decision, "chain", "chain.cgplan")``.
    """
    err = UntrustedPlanError(refusal_text(decision, name, path))
    err.decision = decision  # type: ignore[attr-defined]
    return err
