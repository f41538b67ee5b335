"""``cgc run PLAN``: run a plan on Ray and report latency, throughput and set-up time.

Inputs come from the plan's stored example inputs, or ``--input '[1, "a"]'`` (a JSON list
of positional arguments). ``--json`` prints one JSON object::

    {"plan": ..., "iters": N, "outputs": ..., "latency_us": {"p50": .., "p90": .., "p99": ..},
     "throughput_per_s": .., "setup_s": ..}

Example: ``cgc run echo.cgplan --iters 1000 --json``.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import click

from cgc.plan_schema.errors import EXIT_USAGE, CgcError

__all__ = ["run_cmd"]


class InputError(CgcError):
    """No inputs to run the plan with, or ``--input`` is not a JSON list."""

    exit_code = EXIT_USAGE


def _jsonable(v: Any) -> Any:
    """``v`` as JSON values where possible (lists element-wise), else its ``repr``."""
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    try:
        return json.loads(json.dumps(v, allow_nan=False))
    except (TypeError, ValueError):
        return repr(v)


# Tensors and arrays of at most this many elements are shown with their values.
SHOW_VALUES_UP_TO = 16


def _brief(v: Any, limit: int = 160) -> str:
    """``v`` for one line of ``cgc run``'s report: a small tensor or array (up to
    ``SHOW_VALUES_UP_TO`` elements) with its values, a larger one as its shape and dtype,
    anything else as its ``repr``, cut at ``limit`` characters.

    Example: ``_brief(torch.zeros(8, 64))`` is ``'Tensor(shape=(8, 64), dtype=torch.float32,
    device=cpu)'``; ``_brief(torch.arange(3.0))`` is ``'Tensor([0.0, 1.0, 2.0],
    dtype=torch.float32, device=cpu)'``.
    """
    shape = getattr(v, "shape", None)
    if shape is not None and hasattr(v, "dtype") and len(shape) > 0:
        where = f", device={v.device}" if hasattr(v, "device") else ""
        if math.prod(shape) <= SHOW_VALUES_UP_TO and hasattr(v, "tolist"):
            text = f"{type(v).__name__}({v.tolist()!r}, dtype={v.dtype}{where})"
            if len(text) <= limit:
                return text
        return f"{type(v).__name__}(shape={tuple(shape)}, dtype={v.dtype}{where})"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_brief(x, limit) for x in v)
        text = f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    else:
        text = repr(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, math.ceil(q / 100 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def _inputs(plan: Any, input_json: str | None) -> tuple[list[Any], dict[str, Any]]:
    if input_json is not None:
        try:
            args = json.loads(input_json)
        except json.JSONDecodeError as exc:
            raise InputError(f"--input is not valid JSON: {exc}") from None
        if not isinstance(args, list):
            raise InputError("--input must be a JSON list of positional arguments, "
                             "e.g. --input '[1, \"a\"]'")
        return args, {}
    proto = plan.proto
    if not proto.has_example_inputs:
        raise InputError(
            f"plan {plan.name!r} stores no example inputs; pass the positional arguments as "
            "a JSON list: cgc run PLAN --input '[1, \"a\"]' (or define example_inputs() in "
            "the model file and compile again)")
    from cgc.plan_schema.values import decode_value

    args = [decode_value(v, f"example_args[{i}]") for i, v in enumerate(proto.example_args)]
    kwargs = {nv.name: decode_value(nv.value, f"example_kwargs[{nv.name!r}]")
              for nv in proto.example_kwargs}
    return args, kwargs


@click.command("run")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--iters", default=100, show_default=True, type=click.IntRange(min=1),
              help="Timed executions.")
@click.option("--warmup", default=10, show_default=True, type=click.IntRange(min=0),
              help="Untimed executions first.")
@click.option("--address", default=None, help="Ray cluster to join ('auto' or a URL); "
              "default: start a local Ray sized for the plan.")
@click.option("--input", "input_json", default=None, metavar="JSON",
              help="Positional arguments as a JSON list (default: the stored example inputs).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--submit-timeout", type=float, default=None, metavar="S",
              help="Override the plan's submit timeout (0 = none).")
@click.option("--get-timeout", type=float, default=None, metavar="S",
              help="Override the plan's get timeout (0 = none).")
@click.option("--trust", is_flag=True,
              help="Run a plan that embeds code, pickles, a runtime_env or external actors "
              "although no key you trust signed it.")
@click.option("--communicator", type=click.Choice(["auto", "cpu", "nccl"]), default=None,
              help="How NCCL edges and collectives run: auto (NCCL between GPUs, CUDA IPC "
              "on a shared GPU, else the CPU communicator), cpu (everywhere; GPU plans run "
              "without GPUs), nccl (fail unless every member has a GPU of its own).")
@click.option("--capacity", type=click.IntRange(min=1), default=None,
              help="Executions in flight at most (may lower the plan's).")
@click.option("--at-capacity", type=click.Choice(["wait", "raise"]), default=None,
              help="At capacity, execute() waits (up to the submit timeout) or raises.")
@click.option("--trace", "trace_path", default=None, metavar="FILE",
              help="Write a Chrome/Perfetto trace of every op (open it at ui.perfetto.dev).")
@click.option("--torch-profile", default=None, metavar="DIR",
              help="Write one torch profiler trace per actor into DIR.")
@click.option("--nvtx", is_flag=True, default=None,
              help="NVTX ranges around every op, for Nsight Systems (nsys profile cgc run ...).")
@click.option("--dashboard", is_flag=True, default=None,
              help="Start Ray's dashboard with the local Ray (off by default: it slows "
              "start-up; ignored with --address).")
@click.option("--no-cuda-graphs", "no_cuda_graphs", is_flag=True, default=False,
              help="Run the plan's captured calls eagerly instead of replaying CUDA graphs.")
@click.option("--verbose", is_flag=True,
              help="Also show Ray's notices when cgc starts the local Ray (its "
              "token-authentication banner).")
def run_cmd(plan_path: str, iters: int, warmup: int, address: str | None,
            input_json: str | None, as_json: bool, submit_timeout: float | None,
            get_timeout: float | None, trust: bool, communicator: str | None,
            capacity: int | None, at_capacity: str | None, trace_path: str | None,
            torch_profile: str | None, nvtx: bool | None, dashboard: bool | None,
            no_cuda_graphs: bool, verbose: bool) -> None:
    """Run PLAN on Ray and report latency percentiles, throughput and set-up time.

    A plan that would run code from the file runs only when signed by your key or a key
    in your trusted-keys file, or with --trust; otherwise cgc lists what would run and
    exits with code 4.
    """
    # The first line comes before anything slow (imports, Ray): say what is going on.
    click.echo(f"cgc run: loading {plan_path}", err=True)
    import time

    from cgc.cli.ray_output import quiet_ray_output, show_progress
    from cgc.plan_schema.display import escape, unescaped
    from cgc.runtime import load
    from cgc.runtime.driver.interrupts import interrupts_seen

    quiet_ray_output(address, verbose)
    show_progress("cgc run: ")
    plan = load(plan_path, trust=trust)  # refuses (exit 4, with the summary) when untrusted
    args, kwargs = _inputs(plan, input_json)  # may unpickle: only after the decision
    with plan.start(address, submit_timeout=submit_timeout, get_timeout=get_timeout,
                    communicator=communicator, capacity=capacity, at_capacity=at_capacity,
                    trace=trace_path, torch_profile=torch_profile, nvtx=nvtx,
                    dashboard=dashboard, cuda_graphs=not no_cuda_graphs) as graph:
        def once() -> Any:
            if interrupts_seen():  # a Ctrl-C that some library code caught and dropped
                raise KeyboardInterrupt
            r = graph.execute(*args, **kwargs)
            return [x.get() for x in r] if isinstance(r, list) else r.get()

        outputs = once()
        for _ in range(warmup):
            once()
        lat: list[float] = []
        t_all = time.perf_counter()
        # The bar redraws with CR: it writes under the display rule's escaping, its one
        # plan-derived string escaped (click 8.5 deprecates get_text_stream: sys.stderr).
        err = unescaped(sys.stderr)
        interrupted = False
        try:
            with click.progressbar(range(iters), label=f"running {escape(plan.name)}",
                                   file=err) as bar:
                for _ in bar:
                    t0 = time.perf_counter()
                    once()
                    lat.append(time.perf_counter() - t0)
        except KeyboardInterrupt:
            interrupted = True  # the statistics of what ran, then "Aborted." (exit 130)
        total = time.perf_counter() - t_all
        setup, ray_s = graph.setup_seconds, graph.ray_start_seconds
        bound = list(graph.channel_bindings.values())
        comms = {cid: (b.transport, b.reason) for cid, b in sorted(graph.comm_bindings.items())}
        graphs = graph.cuda_graph_stats() if any(
            p.captured_ops for p in plan.proto.lowered.programs) else {}
    channels = {k: bound.count(k) for k in sorted(set(bound))}
    done = len(lat)
    _report(plan, outputs, lat, total, warmup, setup, ray_s, bound, channels, comms, graphs,
             as_json, trace_path, iters if not interrupted else done)
    if interrupted:
        click.echo(f"interrupted after {done} of {iters} executions", err=True)
        raise KeyboardInterrupt


def _report(plan: Any, outputs: Any, lat: list[float], total: float, warmup: int,
            setup: float, ray_s: float, bound: list[str], channels: dict[str, int],
            comms: dict[int, tuple[str, str]], graphs: dict[str, Any], as_json: bool,
            trace_path: str | None, iters: int) -> None:
    """Print the run's statistics (of the executions that ran)."""
    lat.sort()
    us = {f"p{q}": round(_percentile(lat, q) * 1e6, 1) for q in (50, 90, 99)}
    thr = iters / total if total > 0 else float("inf")
    if as_json:
        click.echo(json.dumps({
            "plan": plan.name, "iters": iters, "outputs": _jsonable(outputs), "latency_us": us,
            "throughput_per_s": round(thr, 1), "setup_s": round(setup, 3),
            "ray_start_s": round(ray_s, 3),
            "host_channels": {"shm": bound.count("shm"), "tcp": bound.count("tcp")},
            "device_channels": {k: v for k, v in channels.items() if k not in ("shm", "tcp")},
            "communicators": {str(c): {"transport": t, "reason": r}
                              for c, (t, r) in comms.items()},
            "cuda_graphs": graphs,
        }))
        return
    click.echo(f"plan {plan.name}: {iters} executions (after {warmup} warm-up)")
    click.echo(f"  outputs      {_brief(outputs)}")
    click.echo(f"  latency      p50 {us['p50']:.1f} us   p90 {us['p90']:.1f} us   "
               f"p99 {us['p99']:.1f} us")
    click.echo(f"  throughput   {thr:,.0f} executions/s (one in flight)")
    click.echo(f"  set-up       {setup:.2f} s (starting or joining Ray {ray_s:.2f} s, "
               f"cgc's own {setup - ray_s:.2f} s)")
    names = {"shm": "shared memory", "tcp": "tcp", "nccl": "nccl", "cuda_ipc": "cuda ipc",
             "host_staging": "host staging", "cpu": "cpu communicator"}
    click.echo("  channels     " + (", ".join(f"{n} {names.get(k, k)}" for k, n in channels.items())
                                    or "none") + " (bound from where the actors landed)")
    for cid, (transport, reason) in comms.items():
        click.echo(f"  comm {cid:<7} {transport}: {reason}")
    for name, st in sorted(graphs.items()):
        why = "; ".join(st["fallbacks"].values())
        click.echo(f"  cuda graph   {name}: {st['captures']} captured, {st['replays']} replays, "
                   f"{st['eager']} eager" + (f" ({why})" if why else ""))
    if trace_path:
        click.echo(f"  trace        {trace_path} (open at https://ui.perfetto.dev)")
