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
``_default_communicator``        ``"create"`` or a ``Communicator`` object (its actors are
                                 checked as Ray checks them; cgc binds its own communicator
                                 among them where it stands in for Ray's class, else
                                 ``CustomCommunicatorError``: communicators.py):
                                 ``communicator="auto"``; None: an accelerator edge without
                                 a communicator of its own is refused (Ray's)
``DAGContext.get_timeout``       ``start(get_timeout=)``; ``teardown_timeout`` likewise
===============================  ==========================================================

Example::

    cgc.ray_compat.install()
    compiled = dag.experimental_compile(_max_inflight_executions=4)
    print(ray.get(compiled.execute(1)))
    compiled.teardown()
"""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

from cgc.errors import CompileError, UnsupportedNodeError
from cgc.plan_schema.errors import ConfigError
from cgc.ray_compat.auto_hints import apply_auto_hints
from cgc.ray_compat.checks import (
    COMPILED_TWICE,
    RayDag,
    accelerator_hint,
    check_compile_args,
    check_ray_dag,
)
from cgc.ray_compat.communicators import refuse_custom_communicators
from cgc.ray_compat.errors import RayWords, to_ray_error
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


def _profiling() -> dict[str, Any]:
    """Ray's profiling switches (``ray.dag.constants``, read from the environment when Ray
    is imported, as Ray reads them) as cgc's run options: ``RAY_CGRAPH_ENABLE_PROFILING``
    -> ``ray_events`` (Ray's per-actor records in ``__ray_cgraph_events``),
    ``RAY_CGRAPH_ENABLE_TORCH_PROFILING`` -> ``torch_profile`` into Ray's folder
    ``compiled_graph_torch_profiles`` (relative to each actor's working directory, as
    Ray's), ``RAY_CGRAPH_ENABLE_NVTX_PROFILING`` -> ``nvtx`` (both at once: a ValueError,
    as cgc refuses them together)."""
    from ray.dag import constants as rc

    out: dict[str, Any] = {}
    if getattr(rc, "RAY_CGRAPH_ENABLE_PROFILING", False):
        out["ray_events"] = True
    if getattr(rc, "RAY_CGRAPH_ENABLE_TORCH_PROFILING", False):
        out["torch_profile"] = "compiled_graph_torch_profiles"
    if getattr(rc, "RAY_CGRAPH_ENABLE_NVTX_PROFILING", False):
        out["nvtx"] = True
    return out


def _breaks_on_error(ray_dag: RayDag | None) -> bool:
    """Whether an app error leaves the graph unusable, as in Ray 2.60: an NCCL edge with
    ``_static_shape`` or ``_direct_return`` cannot carry the error to its reader, so Ray's
    channel breaks and the graph is torn down (the next ``execute`` raises
    ``RayChannelError``). Ray's CPU communicator carries it: the graph goes on."""
    from ray.experimental.channel.cpu_communicator import CPUCommunicator

    from cgc.frontend import ray_private as rp

    for node in ray_dag.tasks if ray_dag is not None else ():
        hint = rp.type_hint(node)
        if (accelerator_hint(node) and hint is not None
                and not isinstance(hint.communicator, CPUCommunicator)
                and (hint.static_shape or hint.direct_return)):
            return True
    return False


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
        ValueError: the DAG was compiled before or fails one of Ray's checks (Ray's
            exception and message, ``cgc.ray_compat.checks``), is invalid in a way only
            cgc checks (cgc's message, naming the node and its ``.bind()`` line), or a
            setting is out of range.
        NotImplementedError: the DAG holds a remote function (as Ray).
        cgc.ray_compat.CustomCommunicatorError: an edge or collective runs on a user's own
            ``Communicator`` class, which cgc cannot run (a ``ValueError``).
        cgc.runtime.PlacementError / SetupError: the graph could not start.
    """
    from ray.dag import DAGContext

    import cgc

    if getattr(dag, "is_cgraph_output_node", False):
        raise ValueError(COMPILED_TWICE)
    dag.is_cgraph_output_node = True  # as Ray: even a failed compile uses the node up
    ctx = DAGContext.get_current()
    check_compile_args(_buffer_size_bytes or ctx.buffer_size_bytes, _default_communicator)
    try:
        ray_dag = check_ray_dag(dag, default_communicator=_default_communicator)
    except CompileError as exc:  # a live actor that cannot say what it holds (cgc's words)
        raise ValueError(str(exc)) from exc
    # After Ray's checks of the communicators: a user's own Communicator class is refused,
    # never silently replaced by cgc's (communicators.py).
    refuse_custom_communicators(ray_dag.tasks, _default_communicator,
                                [n for n, hint, _ in ray_dag.auto
                                 if hint.requires_accelerator()])
    capacity = _max_inflight_executions or ctx.max_inflight_executions
    overlap = _overlap_gpu_communication
    if overlap is None:
        overlap = ctx.overlap_gpu_communication
    try:
        # allow_pickle: constants Ray passes by pickle (a torch.dtype, any object) travel
        # pickled here too; the in-memory plan is the user's own, so it needs no signature.
        # Ray 2.60 compiles a device="gpu" hint towards a reader without a GPU; the read
        # fails when it runs ("No CUDA GPUs are available"), as Ray's does.
        plan = cgc.compile(dag, name="ray_dag", capacity=capacity, at_capacity="raise",
                           overlap=overlap, allow_pickle=True, _gpu_hint_without_gpu="run")
    except UnsupportedNodeError:
        raise
    except (CompileError, ConfigError) as exc:
        raise ValueError(str(exc)) from exc
    apply_auto_hints(list(ray_dag.auto))  # Ray's nodes show the transport Ray picked
    submit_s = ctx.submit_timeout if _submit_timeout is None else _submit_timeout
    try:
        graph = plan.start(
            **_profiling(),
            submit_timeout=_timeout(submit_s, ctx.submit_timeout),
            get_timeout=_timeout(None, ctx.get_timeout),
            teardown_timeout=_timeout(None, ctx.teardown_timeout),
            max_buffered_results=_max_buffered_results or ctx.max_buffered_results,
            slot_bytes=_buffer_size_bytes or ctx.buffer_size_bytes,
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc
    except CgcError as exc:
        raise to_ray_error(exc) from exc
    return CompiledDAG(plan, graph, enable_asyncio, ray_dag, RayWords(
        submit_timeout=submit_s, get_timeout=ctx.get_timeout,
        max_inflight=capacity, max_buffered=_max_buffered_results or ctx.max_buffered_results))


class CompiledDAG:
    """A cgc graph behind Ray's ``CompiledDAG`` interface (``execute``, ``execute_async``,
    ``teardown``, ``visualize``, ``get_id``). ``graph`` is the running
    ``cgc.runtime.CompiledGraph``, ``plan`` its plan (``plan.save(path)`` keeps it).
    """

    def __init__(self, plan: Any, graph: Any, enable_asyncio: bool,
                 ray_dag: RayDag | None = None, words: RayWords | None = None) -> None:
        self.plan = plan
        self.graph = graph
        self._enable_asyncio = enable_asyncio
        self._ray_dag = ray_dag
        self._inputs = ray_dag.inputs if ray_dag is not None else None
        self._words = words or RayWords()
        # Ray's accounting of refs per execution (channel index; None for one output):
        # fetched ("got") and dropped unfetched ("destructed"), until the runtime let go of
        # the execution (see _result_buffer).
        self._got: dict[int, set[int | None]] = {}
        self._destructed: dict[int, set[int | None]] = {}
        # Why a deque: refs are dropped in __del__, at any moment in any thread (the garbage
        # collector); appending is atomic, the books are updated where they are read.
        self._dropped_refs: collections.deque[tuple[int, int | None]] = collections.deque()
        self._multi = graph.multi_output
        self._get_timeout = graph.get_timeout
        self._torn_down = False
        self._breaks_on_error = _breaks_on_error(ray_dag)
        # As Ray's ray.shutdown() does with its compiled graphs' actors (kill_actors=True).
        graph.kill_with_session(list(plan.live_handles.values()))

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
            raise ValueError("Use execute_async if enable_asyncio=True")
        kwargs = self._ray_inputs(args, kwargs)
        try:
            out = self.graph.execute(*args, **kwargs)
        except CgcError as exc:
            raise to_ray_error(exc, self._words) from exc
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
            raise ValueError("Use execute if enable_asyncio=False")
        kwargs = self._ray_inputs(args, kwargs)
        try:
            out = await self.graph.execute_async(*args, **kwargs)
        except CgcError as exc:
            raise to_ray_error(exc, self._words) from exc
        if isinstance(out, list):
            return [CgcDAGFuture(self, r) for r in out]
        return CgcDAGFuture(self, out)

    # ------------------------------------------------------------------ Ray's accounting
    def _note(self, book: dict[int, set[int | None]], e: int, ch: int | None) -> None:
        book.setdefault(e, set()).add(ch)

    def _app_error(self) -> None:
        """An execution's app error was returned: with a static-shape or direct-return
        accelerator edge, Ray's graph is broken from then on (its next ``execute`` raises
        ``RayChannelError``), so this one is torn down; cgc's own API keeps serving."""
        if self._breaks_on_error:
            self.teardown()

    def _after_get(self) -> None:
        """As Ray after a get: free executions at the head whose refs were all dropped."""
        try:
            self.graph.release_dropped()
        except CgcError:
            pass  # a slow dropped execution keeps its place; the next get or execute frees it

    def _dropped(self, e: int, ch: int | None) -> None:
        """A ref of execution ``e`` went unfetched (its ``__del__``; lock-free)."""
        self._dropped_refs.append((e, ch))

    def _accounting(self) -> tuple[dict[int, dict[int, Any]], set[int]]:
        """(the results held, executions the runtime still holds or has not read)."""
        q = self._dropped_refs
        while q:
            self._note(self._destructed, *q.popleft())
        held = self.graph.held_results()
        upto = self.graph.read_upto
        live = set(held) | {e for e in [*self._got, *self._destructed] if e >= upto}
        for book in (self._got, self._destructed):
            for e in [e for e in list(book) if e not in live]:
                del book[e]
        return held, live

    @property
    def _result_buffer(self) -> dict[int, dict[int, Any]]:
        """Ray's result buffer: execution -> {channel index: value} of results read and
        held for refs neither fetched nor dropped yet."""
        held, _ = self._accounting()
        out = {}
        for e, vals in held.items():
            done = self._got.get(e, set()) | self._destructed.get(e, set())
            keep = {i: v for i, v in vals.items()
                    if (i if self._multi else None) not in done}
            if keep:
                out[e] = keep
        return out

    @property
    def _destructed_ref_idxs(self) -> dict[int, set[int | None]]:
        """Ray's record of refs dropped unfetched, per execution still held."""
        self._accounting()
        return {e: set(s) for e, s in self._destructed.items()}

    @property
    def _got_ref_idxs(self) -> dict[int, set[int | None]]:
        """Ray's record of refs fetched, per execution still held."""
        self._accounting()
        return {e: set(s) for e, s in self._got.items()}

    @property
    def _execution_index(self) -> int:
        """The index of the last submitted execution (-1 before the first), as Ray's."""
        return int(self.graph.submitted) - 1

    @property
    def _max_finished_execution_index(self) -> int:
        """The last execution read completely from the output channels, as Ray's."""
        return int(self.graph.read_upto) - 1

    def _ray_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Ray's argument check (its words); keywords Ray would ignore are left out."""
        if self._inputs is None:
            return kwargs
        self._inputs.check(args, kwargs)
        if self._inputs.whole:
            return kwargs
        return {k: v for k, v in kwargs.items() if k in self._inputs.keywords}

    def teardown(self, kill_actors: bool = False) -> None:
        """Stop the graph; idempotent. Actors the DAG got as live handles stay alive
        (and reusable) unless ``kill_actors``; actors it created are removed."""
        self._torn_down = True
        self.graph.teardown()
        if kill_actors:
            import ray

            from cgc.runtime.driver.session import ray_calls

            with ray_calls(self.graph.ray_session) as ok:
                for handle in self.plan.live_handles.values() if ok else ():
                    ray.kill(handle)

    def visualize(self, filename: str = "compiled_graph", format: str = "png",
                  view: bool = False, channel_details: bool = False) -> str:
        """Draw the graph as Ray 2.60 does (``cgc.ray_compat.ray_view``: Ray's task numbers,
        labels and edges) to ``filename.format``; ``format="ascii"`` returns Ray's listing
        followed by cgc's view of the plan. ``channel_details`` labels each edge with its
        Ray type hint.

        Returns the DOT source for picture formats (as Ray does) or the ASCII text.

        Raises:
            ValueError: an unknown format, or ``channel_details`` with ``"ascii"`` (as Ray).
            cgc.viz.RenderError: Graphviz is missing for a picture format.
        """
        from cgc import viz
        from cgc.ray_compat.ray_view import ray_ascii, ray_dot

        proto = self.plan.proto
        if format == "ascii":
            if channel_details:
                raise ValueError(
                    "Parameters 'channel_details' are not compatible with 'ascii' format.")
            own = viz.ascii_view(proto)
            text = ray_ascii(self._ray_dag, own) if self._ray_dag is not None else own
            if view:
                print(text)
            return text
        if format not in viz.FORMATS:
            raise ValueError(f"format {format!r}: use one of {', '.join(viz.FORMATS)} or 'ascii'")
        if self._ray_dag is not None:
            dot = ray_dot(self._ray_dag, channel_details)
        else:
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
        return f"CompiledDAG({self.get_id()})"  # as Ray prints its own
