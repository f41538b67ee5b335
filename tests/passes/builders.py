"""A tiny pb.Graph builder for compiler tests (no frontend needed)."""

from __future__ import annotations

from cgc.plan_schema import plan_pb2 as pb

Ref = int | tuple[int, int]


class GraphBuilder:
    """Build a ``pb.Graph`` node by node; ``plan()`` wraps it in a ``pb.Plan``.

    Example::

        b = GraphBuilder()
        b.actor("a"); x = b.input(0)
        y = b.call("a", "f", x)
        b.output(y)
        plan = b.plan("demo")
    """

    def __init__(self) -> None:
        self.g = pb.Graph()
        self._bind: dict[str, int] = {}
        self._input: int | None = None

    def actor(self, name: str, gpus: float = 0) -> str:
        a = self.g.actors.add(name=name)
        a.cls.module, a.cls.qualname = "model", name.capitalize()
        if gpus:
            a.options.num_gpus = gpus
        return name

    def _node(self, kind: int, **kw) -> pb.Node:
        n = self.g.nodes.add(id=len(self.g.nodes), kind=kind, **kw)
        n.loc.file, n.loc.line = "model.py", 10 + n.id
        return n

    def _input_node(self) -> int:
        if self._input is None:
            self._input = self._node(pb.INPUT, name="input").id
        return self._input

    def whole(self) -> int:
        """The INPUT node itself (a task that takes the whole input)."""
        self.g.whole_input = True
        return self._input_node()

    def input(self, index: int) -> int:
        self._input_node()
        self.g.num_positional = max(self.g.num_positional, index + 1)
        return self._node(pb.INPUT_ATTR, key_kind=pb.INDEX, index=index, name=f"input[{index}]").id

    @staticmethod
    def _arg(a) -> pb.Arg:
        if isinstance(a, tuple):
            return pb.Arg(ref=pb.NodeRef(node=a[0], output_index=a[1]))
        if isinstance(a, int) and not isinstance(a, bool):
            return pb.Arg(ref=pb.NodeRef(node=a))
        return pb.Arg(constant=pb.Value(str_value=str(a)))

    def call(
        self,
        actor: str,
        method: str,
        *args,
        num_returns: int = 1,
        hint: int | None = None,
        device: int = 0,
    ) -> int:
        i = self._bind.get(actor, 0)
        self._bind[actor] = i + 1
        n = self._node(
            pb.CALL,
            actor=actor,
            method=method,
            name=f"{actor}.{method}#{i}",
            num_returns=num_returns,
            bind_index=i,
        )
        n.args.extend(self._arg(a) for a in args)
        if hint is not None:
            for out in range(num_returns):
                h = n.hints.add(output_index=out)
                h.hint.transport = hint
                h.hint.device = device
        return n.id

    def allreduce(self, inputs: list[Ref], actors: list[str] | None = None) -> list[int]:
        """One allreduce; member k runs on ``actors[k]`` (default: the input's actor)."""
        c = self.g.collectives.add(id=len(self.g.collectives), kind=pb.ALLREDUCE)
        ids = []
        for k, ref in enumerate(inputs):
            src = self.g.nodes[ref if isinstance(ref, int) else ref[0]]
            actor = actors[k] if actors else src.actor
            i = self._bind.get(actor, 0)
            self._bind[actor] = i + 1
            n = self._node(
                pb.COLLECTIVE,
                actor=actor,
                method="allreduce",
                name=f"{actor}.allreduce#{i}",
                bind_index=i,
                collective=c.id,
            )
            n.args.append(self._arg(ref))
            ids.append(n.id)
        c.nodes.extend(ids)
        return ids

    def output(self, *refs: Ref) -> int:
        n = self._node(pb.OUTPUT, name="output", multi_output=len(refs) > 1)
        n.args.extend(self._arg(r) for r in refs)
        return n.id

    def plan(self, name: str = "test") -> pb.Plan:
        return pb.Plan(name=name, graph=self.g)
