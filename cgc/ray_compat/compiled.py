"""``CompiledDAG``: what ``dag.experimental_compile()`` returns once ``cgc.ray_compat`` is
installed — a cgc plan compiled from the Ray DAG and started, behind Ray's interface.

Ray's arguments map onto cgc's (missing ones take Ray's ``DAGContext`` defaults):

===============================  ==========================================================
Ray                              cgc
===============================  ==========================================================
``_submit_timeout``              ``start(submit_timeout=)``; Ray's 0 (do not wait) and -1
                                 (wait forever) keep their meaning
``_buffer_size_bytes``           ``start(slot_bytes=)``: the initial slot size of channels
``enable_asyncio``               ``execute`` or ``execute_async`` (the other raises, as Ray)
``_max_inflight_executions``     ``compile(capacity=)``, with ``at_capacity="raise"``
``_max_buffered_results``        ``start(max_buffered_results=)``
``_overlap_gpu_communication``   ``compile(overlap=)``
``_default_communicator``        ``"create"``: ``communicator="auto"``; None: refused when
                                 the graph needs a communicator; a ``Communicator`` object
                                 is not supported (cgc binds its own)
``DAGContext.get_timeout``       ``start(get_timeout=)``; ``teardown_timeout`` likewise
===============================  ==========================================================

Example::

    cgc.ray_compat.install()
    compiled = dag.experimental_compile(_max_inflight_executions=4)
    print(ray.get(compiled.execute(1)))
    compiled.teardown()
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cgc.errors import CompileError, UnsupportedNodeError
from cgc.plan_schema.errors import ConfigError
from cgc.ray_compat.errors import to_ray_error
from cgc.ray_compat.refs import FOREVER_S, CgcDAGFuture, CgcDAGRef
from cgc.runtime.errors import CgcError

__all__ = ["CompiledDAG", "compile_ray_dag"]

_IMMEDIATE = 1e-6  # Ray's timeout 0: succeed at once or time out (cgc's 0 means no limit)


def _timeout(value: float | None, default: float) -> float:
    """A Ray timeout (None: the DAGContext default, 0: immediate, -1: forever) for cgc."""
    if value is None:
        value = default
    if value < 0:
        return FOREVER_S
    return value if value > 0 else _IMMEDIATE


def _check_not_compiled(node: Any) -> None:
    """Ray refuses to compile a DAG twice, or a node of a DAG compiled before."""
    from cgc.frontend import ray_private as rp

    if getattr(node, "is_cgraph_output_node", False):
        raise ValueError(
            "experimental_compile() was already called on this DAG node (torn down or "
            "not); reuse the compiled graph or build a new DAG")
    seen: set[int] = set()
    stack = list(rp.downstream(node))
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if getattr(n, "is_cgraph_output_node", False):
            raise ValueError(
                f"The DAG was compiled more than once: {type(n).__name__} called "
                f"experimental_compile() on a DAG holding this {type(node).__name__}; "
                "build a new DAG to compile a part of it")
        stack.extend(rp.downstream(n))


def compile_ray_dag(
    dag: Any,
    _submit_timeout: float | None = None,
    _buffer_size_bytes: int | None = None,
    enable_asyncio: bool = False,
    _max_inflight_executions: int | None = None,
    _max_buffered_results: int | None = None,
    _overlap_gpu_communication: bool | None = None,
    _default_communicator: Any = "create",
) -> CompiledDAG:
    """Compile a Ray DAG with cgc and start it; Ray's ``experimental_compile`` arguments.

    Example: ``compiled = compile_ray_dag(dag, _max_inflight_executions=2)``.

    Raises:
        ValueError: the DAG was compiled before, is invalid (cgc's message, naming the
            node and its ``.bind()`` line), or a setting is out of range.
        NotImplementedError: the DAG holds a node cgc cannot compile (a remote function),
            or ``_default_communicator`` is a ``Communicator`` object.
        cgc.runtime.PlacementError / SetupError: the graph could not start.
    """
    from ray.dag import DAGContext

    import cgc

    _check_not_compiled(dag)
    dag.is_cgraph_output_node = True  # as Ray: even a failed compile uses the node up
    ctx = DAGContext.get_current()
    if _default_communicator not in ("create", None):
        raise NotImplementedError(
            f"_default_communicator={_default_communicator!r}: cgc binds its own "
            "communicators (NCCL between GPUs, CUDA IPC, CPU); pass 'create' (the default)")
    capacity = _max_inflight_executions or ctx.max_inflight_executions
    overlap = _overlap_gpu_communication
    if overlap is None:
        overlap = ctx.overlap_gpu_communication
    try:
        plan = cgc.compile(dag, name="ray_dag", capacity=capacity, at_capacity="raise",
                           overlap=overlap)
    except UnsupportedNodeError:
        raise
    except (CompileError, ConfigError) as exc:
        raise ValueError(str(exc)) from exc
    if _default_communicator is None and len(plan.proto.lowered.communicators):
        raise ValueError(
            "_default_communicator=None, but the graph needs a communicator (NCCL edges or "
            "collectives); pass 'create'")
    try:
        graph = plan.start(
            submit_timeout=_timeout(_submit_timeout, ctx.submit_timeout),
            get_timeout=_timeout(None, ctx.get_timeout),
            teardown_timeout=_timeout(None, ctx.teardown_timeout),
            max_buffered_results=_max_buffered_results or ctx.max_buffered_results,
            slot_bytes=_buffer_size_bytes or ctx.buffer_size_bytes,
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc
    return CompiledDAG(plan, graph, enable_asyncio)


class CompiledDAG:
    """A cgc graph behind Ray's ``CompiledDAG`` interface (``execute``, ``execute_async``,
    ``teardown``, ``visualize``, ``get_id``). ``graph`` is the running
    ``cgc.runtime.CompiledGraph``, ``plan`` its plan (``plan.save(path)`` keeps it).
    """

    def __init__(self, plan: Any, graph: Any, enable_asyncio: bool) -> None:
        self.plan = plan
        self.graph = graph
        self._enable_asyncio = enable_asyncio
        self._multi = graph._multi
        self._get_timeout = graph.get_timeout
        self._torn_down = False

    @property
    def is_teardown(self) -> bool:
        """True once ``teardown()`` ran (Ray's attribute)."""
        return self._torn_down or self.graph.closing

    def get_id(self) -> str:
        """The graph's id (also in its actors' Ray names)."""
        return self.graph.gid

    def execute(self, *args: Any, **kwargs: Any) -> CgcDAGRef | list[CgcDAGRef]:
        """Submit one execution; a ref for ``ray.get`` (a list with a ``MultiOutputNode``).

        Raises:
            ValueError: ``enable_asyncio=True`` (use ``execute_async``), or the arguments do
                not match the graph's inputs.
            RayCgraphCapacityExceeded: ``_max_inflight_executions`` are in flight.
            RayChannelTimeoutError, RayChannelError, ActorDiedError: see
                ``cgc.ray_compat.errors``.
        """
        if self._enable_asyncio:
            raise ValueError("this graph was compiled with enable_asyncio=True: use "
                             "execute_async()")
        try:
            out = self.graph.execute(*args, **kwargs)
        except CgcError as exc:
            raise to_ray_error(exc) from exc
        if isinstance(out, list):
            return [CgcDAGRef(self, r) for r in out]
        return CgcDAGRef(self, out)

    async def execute_async(self, *args: Any, **kwargs: Any) -> CgcDAGFuture | list[CgcDAGFuture]:
        """``execute`` for asyncio; ``await`` the future(s) it returns.

        Raises:
            ValueError: the graph was compiled without ``enable_asyncio=True``.
            The same errors as ``execute``.
        """
        if not self._enable_asyncio:
            raise ValueError("this graph was compiled without enable_asyncio=True: use "
                             "execute()")
        try:
            out = await self.graph.execute_async(*args, **kwargs)
        except CgcError as exc:
            raise to_ray_error(exc) from exc
        if isinstance(out, list):
            return [CgcDAGFuture(self, r) for r in out]
        return CgcDAGFuture(self, out)

    def teardown(self, kill_actors: bool = False) -> None:
        """Stop the graph; idempotent. Actors the DAG got as live handles stay alive
        (and reusable) unless ``kill_actors``; actors it created are removed."""
        self._torn_down = True
        self.graph.teardown()
        if kill_actors:
            import ray

            for handle in self.plan.live_handles.values():
                ray.kill(handle)

    def visualize(self, filename: str = "compiled_graph", format: str = "png",
                  view: bool = False, channel_details: bool = False) -> str:
        """Draw the graph (cgc's view: actors, transports; ``channel_details`` adds the
        schedule view) to ``filename.format``; ``format="ascii"`` returns text.

        Returns the DOT source for picture formats (as Ray does) or the ASCII text.

        Raises:
            ValueError: an unknown format.
            cgc.viz.RenderError: Graphviz is missing for a picture format.
        """
        from cgc import viz

        proto = self.plan.proto
        if format == "ascii":
            text = viz.ascii_view(proto)
            if channel_details:
                text += "\n" + viz.schedule_ascii(proto)
            if view:
                print(text)
            return text
        if format not in viz.FORMATS:
            raise ValueError(f"format {format!r}: use one of {', '.join(viz.FORMATS)} or 'ascii'")
        dot = viz.schedule_dot(proto) if channel_details else viz.graph_dot(proto)
        out = viz.render(dot, Path(f"{os.fspath(filename)}.{format}"))
        if view:
            import webbrowser

            webbrowser.open(out.resolve().as_uri())
        return dot

    def __del__(self) -> None:
        # Ray tears a compiled graph down when it is collected: the actors are then free.
        try:
            if not self.is_teardown:
                self.graph.teardown()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __str__(self) -> str:
        return f"CompiledDAG(cgc {self.get_id()}, {self.graph!r})"
