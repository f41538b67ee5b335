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

A plan that needs none of that still names classes and methods, and naming an installed
class with plain arguments can be as strong as code (``subprocess.Popen``, or a Ray
library actor that serves files). So an unsigned plan runs without ``--trust`` only when
every class it names comes from a module the user declared trusted
(``cgc.plan_schema.trusted_modules``, ``cgc trust add-module``) and no task calls a private
method (a name starting with ``_``, except ``__call__``): basis ``trusted-modules``.
Deciding reads the plan and the user's files only: it imports and runs nothing the plan
names.

Example::

    pf = open_plan_bytes(data, "x.cgplan")
    decision = decide(pf, trust=False)
    if not decision.allowed:
        raise untrusted_error(decision, "x.cgplan")
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import UntrustedPlanError
from cgc.plan_schema.trusted_modules import ModuleTrust

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
    "unvouched_names",
    "decide",
    "in_process",
    "untrusted_error",
    "class_modules",
    "header_refusal",
]

# How a decision was reached (TrustDecision.basis).
TRUSTED_MODULES = "trusted-modules"  # no code from the file; every class from a trusted module
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
        """One line per item, in plan order: what would run or be reached (escaped: one
        line each, whatever the plan's strings hold)."""
        from cgc.plan_schema.display import escape

        items: list[EmbeddedCode | PickledValue | RuntimeEnv | ExternalBinding] = [
            *self.modules, *self.pickles, *self.runtime_envs, *self.externals
        ]
        return [escape(it.text()) for it in items]

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

    def walk(self, msg: Message, where_fn: Callable[[], str], owner: str = "") -> None:
        """Visit every set field of ``msg`` that can hold something needing trust;
        ``where_fn()`` names it for people (built only when something is found), ``owner``
        is the actor it belongs to (for options)."""
        if isinstance(msg, pb.EmbeddedModule):
            raw = msg.source.encode("utf-8")
            self.modules.append(EmbeddedCode(msg.name, msg.source_file, len(raw),
                                             hashlib.sha256(raw).hexdigest()))
        elif isinstance(msg, pb.ActorOptions) and msg.runtime_env_json:
            self.envs.append(RuntimeEnv(owner or where_fn(), msg.runtime_env_json))
        elif isinstance(msg, pb.ExternalActor) and (msg.name or msg.actor_id):
            target = (f"named {msg.name!r}" + (f" in namespace {msg.namespace!r}"
                                                if msg.namespace else "")
                      if msg.name else f"with id {msg.actor_id}")
            self.externals.append(ExternalBinding(owner or where_fn(), target))
        if isinstance(msg, pb.Actor):
            owner = msg.name
        for fd, value in msg.ListFields():
            if fd.type == FieldDescriptor.TYPE_BYTES and "pickle" in fd.name:
                items = value if _repeated(fd) else [value]
                for i, b in enumerate(items):
                    if b:
                        where = where_fn()
                        at = where if not _repeated(fd) else f"{where}[{i}]"
                        self.pickles.append(PickledValue(_join(at, fd, msg), len(b)))
            if fd.message_type is None or not _may_need_trust(fd.message_type):
                continue
            items = value if _repeated(fd) else [value]
            for i, child in enumerate(items):
                self.walk(child, functools.partial(_label, msg, fd, i, child, where_fn), owner)


_TRUST_TYPES = ("EmbeddedModule", "ActorOptions", "ExternalActor")


@functools.cache
def _may_need_trust(desc: Descriptor) -> bool:
    """Whether a message of type ``desc`` can hold (at any depth) a pickle, embedded code,
    a runtime_env or an external actor: the walk skips the others (channels, programs)."""
    seen: set[str] = set()
    todo = [desc]
    while todo:
        d = todo.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        if d.name in _TRUST_TYPES:
            return True
        for fd in d.fields:
            if fd.type == FieldDescriptor.TYPE_BYTES and "pickle" in fd.name:
                return True
            if fd.message_type is not None:
                todo.append(fd.message_type)
    return False


def _repeated(fd: FieldDescriptor) -> bool:
    return fd.is_repeated


def _join(where: str, fd: FieldDescriptor, msg: Message) -> str:
    # A Value's pickle is the value itself; another message's pickle field is named.
    if isinstance(msg, pb.Value):
        return where or "a value"
    return f"{where} {fd.name}".strip()


def _label(msg: Message, fd: FieldDescriptor, i: int, child: Any,
           where_fn: Callable[[], str]) -> str:
    """Where ``child`` (item ``i`` of field ``fd`` of ``msg``) is, in words."""
    where = where_fn()
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
    f.walk(plan, str)  # str() == "": the plan itself
    return TrustNeeds(tuple(f.modules), tuple(f.pickles), tuple(f.envs), tuple(f.externals))


def unvouched_names(plan: pb.Plan, modules: ModuleTrust) -> list[str]:
    """Why ``plan``'s names are not vouched for by ``modules``: one line per class from a
    module the user does not trust and per private method called (empty: all vouched).

    External actors and classes carried by value are left out: they need trust anyway
    (``plan_needs``). Nothing is imported.

    Example: ``unvouched_names(plan, ModuleTrust())`` ->
    ``["actor w0: class subprocess.Popen, from a module you do not trust (subprocess)"]``.
    """
    out = []
    for actor in plan.graph.actors:
        if actor.external.name or actor.external.actor_id or actor.cls.pickled_class:
            continue
        ref = actor.cls
        if modules.covering(ref.module) is None:
            out.append(f"actor {actor.name}: class {ref.module}.{ref.qualname}, from a module "
                       f"you do not trust ({ref.module})")
    for node in plan.graph.nodes:
        if node.kind == pb.CALL and node.method.startswith("_") and node.method != "__call__":
            out.append(f"node {node.name} calls the private method {node.method!r} of actor "
                       f"{node.actor}")
    from cgc.plan_schema.display import escape

    return [escape(line) for line in out]  # one line each, whatever the names hold


# ---------------------------------------------------------------- deciding


@dataclass(frozen=True)
class TrustDecision:
    """The outcome of the trust check of one plan, kept on the loaded ``Plan``.

    ``allowed``: it may start. ``basis``: why (``trusted-modules``, ``signed``,
    ``trust-flag``, ``in-process``, or ``refused``). ``signer``: one line on the signature.
    ``modules``: the user's trusted modules the decision read; ``unvouched``: the classes
    and private calls they do not cover (see ``unvouched_names``).

    Example: ``cgc.load("x.cgplan").trust.basis == "signed"``.
    """

    needs: TrustNeeds = field(default_factory=TrustNeeds)
    allowed: bool = True
    basis: str = IN_PROCESS
    signer: str = "unsigned"
    modules: ModuleTrust = field(default_factory=ModuleTrust)
    unvouched: tuple[str, ...] = ()
    class_modules: tuple[str, ...] = ()  # the modules of the classes the plan names

    def permits(self, plan: pb.Plan) -> bool:
        """Whether this decision still covers ``plan`` (its content may have changed since:
        a decision from trusted modules covers only content those modules still vouch for).
        """
        if not self.allowed:
            return False
        if self.basis == TRUSTED_MODULES:
            return (not plan_needs(plan).needs_trust
                    and not unvouched_names(plan, self.modules))
        return True

    def rule(self) -> str:
        """One line on which rule decided, for ``cgc check``/``inspect`` and refusals."""
        if self.basis == SIGNED:
            return "runs here: yes, signed by a key you trust"
        if self.basis == TRUST_FLAG:
            return "runs here: yes, because you passed --trust"
        if self.basis == IN_PROCESS:
            return "runs here: yes, built in this process"
        if self.basis == TRUSTED_MODULES:
            used = sorted({self.modules.covering(m) or m for m in self.class_modules})
            return ("runs here: yes, unsigned, but every class is from a module you trust ("
                    + (", ".join(used) or "no classes") + f"; {self.modules.source})")
        if self.needs.needs_trust:
            return ("runs here: no, it holds code or reaches outside the graph, and no "
                    "trusted signature vouches for it (--trust runs it)")
        return ("runs here: no, unsigned and not every class is from a module you trust "
                "(`cgc trust add-module NAME` trusts one; --trust runs it once)")


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


def decide(pf: PlanFile, *, trust: bool, keyring: Keyring | None = None,
           modules: ModuleTrust | None = None) -> TrustDecision:
    """Decide whether the plan in ``pf`` may run here.

    Order: a signature that does not verify refuses (unless ``trust``); a valid signature
    by a trusted key allows (``signed``); ``trust`` allows (``trust-flag``); content with
    nothing that needs trust, whose every class comes from a module the user trusts and
    that calls no private method, allows (``trusted-modules``); otherwise refused.
    ``keyring`` defaults to the user's (read only when the plan is signed), ``modules`` to
    the user's ``trusted_modules`` (read only when it decides). Imports nothing the plan
    names.

    Example: ``decide(open_plan_bytes(data), trust=False).allowed``.

    Raises:
        KeyFileError: the user's key or module files are malformed or unsafe.
    """
    from cgc.plan_schema.signing import load_keyring

    needs = plan_needs(pf.plan)
    if pf.header.signature and keyring is None:
        keyring = load_keyring()
    signer, trusted_sig = _signer_line(pf, keyring)
    bad_sig = bool(pf.header.signature) and not pf.signature_valid
    unvouched: tuple[str, ...] = ()
    if bad_sig:
        basis = TRUST_FLAG if trust else REFUSED
    elif trusted_sig:
        basis = SIGNED
    elif trust:
        basis = TRUST_FLAG
    elif needs.needs_trust:
        basis = REFUSED
    else:
        if modules is None:
            from cgc.plan_schema.trusted_modules import load_trusted_modules

            modules = load_trusted_modules()
        unvouched = tuple(unvouched_names(pf.plan, modules))
        basis = REFUSED if unvouched else TRUSTED_MODULES
    return TrustDecision(needs=needs, allowed=basis != REFUSED, basis=basis, signer=signer,
                         modules=modules or ModuleTrust(), unvouched=unvouched,
                         class_modules=class_modules(pf.plan))


# Above this payload size, a refusal the header decides is made before parsing the graph
# (the refusal then lists no items: ``cgc inspect`` does); below, the listing costs little.
DETAIL_BYTES = 16 << 20


def header_refusal(pf: PlanFile, *, trust: bool, keyring: Keyring | None = None,
                   modules: ModuleTrust | None = None) -> UntrustedPlanError | None:
    """The refusal the envelope alone decides for a large plan, before its graph is parsed
    (``pf`` may be ``open_plan(path, parse=False)``): None unless the payload is over
    ``DETAIL_BYTES``, ``trust`` is False, no valid signature by a trusted key vouches for
    it, and either its signature does not verify, or its header says it needs trust, or its
    header (format 1.8 on) lists a class module the user does not trust (``modules``: the
    user's ``trusted_modules`` by default). A header that says it needs nothing and lists
    only trusted modules decides nothing: the content is checked (and must match the list:
    ``open_plan`` refuses a header that lies).

    Example: ``err = header_refusal(open_plan(path, parse=False), trust=False)``.

    Raises:
        KeyFileError: the user's key or module files are malformed or unsafe.
    """
    from cgc.plan_schema.display import escape

    h = pf.header
    if trust or h.payload_len <= DETAIL_BYTES:
        return None
    if h.signature and keyring is None:
        from cgc.plan_schema.signing import load_keyring

        keyring = load_keyring()
    signer, trusted_sig = _signer_line(pf, keyring)
    if trusted_sig:
        return None
    bad_sig = bool(h.signature) and not pf.signature_valid
    untrusted: list[str] = []
    if not (bad_sig or h.needs_trust) and h.lists_class_modules:
        if modules is None:
            from cgc.plan_schema.trusted_modules import load_trusted_modules

            modules = load_trusted_modules()
        untrusted = [m for m in h.class_modules if modules.covering(m) is None]
    if not (bad_sig or h.needs_trust or untrusted):
        return None
    where = f"{pf.source}: plan {h.name!r}"
    if bad_sig:
        why = "its signature does not verify"
    elif h.needs_trust:
        why = "its header says it holds code from the file or reaches outside the graph"
    else:
        names = escape(" ".join(untrusted))
        why = (f"its header names classes from modules you do not trust ({names}; "
               f"`cgc trust add-module {names}` trusts them, if you vouch for what their "
               "public methods do)")
    err = UntrustedPlanError(
        f"{where} is not trusted here: {signer}.\n{why} (refused from the envelope, "
        f"before reading its {h.payload_len:,}-byte graph: `cgc inspect --code {pf.source}` "
        "lists what would run)\n"
        f"run it only if you trust where it came from: `cgc run --trust {pf.source}` or "
        f"cgc.load({pf.source!r}, trust=True); `cgc keys add KEYFILE` trusts a colleague's key")
    err.decision = TrustDecision(allowed=False, basis=REFUSED,  # type: ignore[attr-defined]
                                 signer=signer, modules=modules or ModuleTrust(),
                                 class_modules=tuple(h.class_modules))
    return err


def class_modules(plan: pb.Plan) -> tuple[str, ...]:
    """The modules of the classes ``plan``'s actors name, sorted and unique (actors bound to
    external ones and classes carried by value left out): what the header of a 1.8 plan
    lists (``PlanHeader.class_modules``). Nothing is imported.

    >>> p = pb.Plan()
    >>> p.graph.actors.add(name="w0", cls=pb.ClassRef(module="m.b", qualname="W")).name
    'w0'
    >>> class_modules(p)
    ('m.b',)

    Raises:
        Nothing.
    """
    return tuple(sorted({a.cls.module for a in plan.graph.actors
                         if not (a.external.name or a.external.actor_id)
                         and not a.cls.pickled_class}))


def refusal_text(decision: TrustDecision, name: str, path: str | None = None) -> str:
    """The message of a refused plan: why, exactly what would run, and how to proceed.

    ``path`` is the plan file, when there is one (the hints then name it).
    """
    where = f"{path}: plan {name!r}" if path else f"plan {name!r}"
    lines = [f"{where} is not trusted here: {decision.signer}."]
    if decision.needs.needs_trust:
        lines.append("starting it would run or reach:")
        lines.extend(f"  {line}" for line in decision.needs.lines())
    if decision.unvouched:
        lines.append("an unsigned plan may use only classes from modules you trust "
                     f"({decision.modules.source or 'trusted_modules'}) and public methods:")
        lines.extend(f"  {line}" for line in decision.unvouched)
        mods = sorted({u.rsplit("(", 1)[-1].rstrip(")") for u in decision.unvouched
                       if u.endswith(")") and "private method" not in u})
        if mods:
            lines.append("  `cgc trust add-module " + " ".join(mods) + "` trusts them, if you "
                         "vouch for what their public methods do")
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
