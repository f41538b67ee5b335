"""A Hugging Face decoder split into stages, side by side in one run: what a user runs today
against cgc, every system's tokens checked against ``model.generate`` (issue 35).

    python tools/bench/bench_hf.py                                  # tiny Llama, CPU
    python tools/bench/bench_hf.py --size 1b --device cuda --dtype bfloat16 --batches 1,8

Systems (``--systems``): ``generate`` (``model.generate`` in this process, eager, dynamic
cache); ``generate_compiled`` (the static cache, compiled: on CUDA by ``generate`` itself
where transformers does that (5.x: the decode step, ``mode="reduce-overhead"``), else
``torch.compile(model.forward, mode="reduce-overhead")`` as transformers' docs say; on the
CPU without ``reduce-overhead``'s CUDA graphs; the row says which): the floor a user has;
``cgc`` / ``cgc_graph`` (``cgc.hf.build_dag``, eager / each stage's step replayed as a
CUDA graph; ``1`` and ``2`` stages); ``ray_cgraph`` (``examples/ray_hf_decode.py``'s program on Ray
Compiled Graph, 2 stages); ``ray_actors`` (the same actors called with ``.remote()``,
references passed along, 2 stages); ``floor_graph`` (one ``HFStage`` holding every layer,
in this process, its step replayed by cgc's ``CapturedCall``: what the pipeline rows would
reach without actors; eager on the CPU).
By name only: ``cgc_graph_compiled`` (``cgc_graph`` with each stage's layers through
``torch.compile``).

Each row: one untimed warm-up decode (``--warm-tokens``; the ``generate`` rows every
token, as the static cache's length is part of what is compiled), then ``--rounds`` timed
ones (prefill included: ``microbatches x batch x tokens`` new tokens over the wall time,
median). The pipeline rows
keep ``--microbatches`` in flight; the ``generate`` rows decode the same microbatches one
after another. ``equal``: the row's tokens against ``generate``'s (in bf16 a kernel may make
them differ: the first difference is shown). Prints a markdown table, and the JSON rows
with ``--json FILE``; also each stage's measured memory (from the ``ray_actors`` row).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import torch
import transformers
from ray.dag import InputNode

import cgc
from cgc import hf

# generate's rows decode every token (no end-of-sequence stop), as the pipeline rows do.
FULL_LENGTH = dict(eos_token_id=None, pad_token_id=0)

SYSTEMS = ("generate", "generate_compiled", "floor_graph", "cgc", "cgc_graph", "ray_cgraph",
           "ray_actors")
ORDER = ("generate", "generate_compiled", "cgc_graph", "floor_graph", "cgc_graph_compiled",
         "cgc", "ray_cgraph", "ray_actors")
# Asked for by name only (compiling every stage's layers takes a while per row).
EXTRA_SYSTEMS = ("cgc_graph_compiled",)


def _timed(decode: Callable[[int], list], rounds: int, tokens: int,
           warm: int) -> tuple[list, list[float]]:
    """``decode(k)`` decodes ``k`` tokens: once with ``warm`` (compiles, captures,
    first-touch allocations), then ``rounds`` timed times with ``tokens``."""
    decode(warm)
    times, out = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = decode(tokens)
        times.append(time.perf_counter() - t0)
    return out, times


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Bench:
    """One size and batch: the rows of every system, checked against ``generate``."""

    def __init__(self, args: argparse.Namespace, batch: int) -> None:
        self.args, self.batch = args, batch
        self.spec = hf.model_spec(args.model, args.size, dtype=args.dtype, attn=args.attn,
                                  seed=args.seed)
        self.layers = self.spec.num_layers
        self.max_seq = args.prompt_len + args.tokens
        self.ps = hf.prompts(self.spec.config["vocab_size"], args.microbatches, batch,
                             args.prompt_len, args.seed + 1)
        self.warm = min(args.warm_tokens, args.tokens)
        self.how = ""  # how generate_compiled compiled
        self.want: list | None = None
        self.memory: list[dict[str, int]] = []

    def floor(self, compiled: bool) -> tuple[list, list[float]]:
        a = self.args
        model = hf.load_model(self.spec, a.device)
        kwargs: dict[str, Any] = dict(FULL_LENGTH)
        if compiled:
            kwargs["cache_implementation"] = "static"
            # transformers with a compile_config compiles the decode step itself on CUDA for a
            # static cache (mode "reduce-overhead"): what its users get, and compiling
            # model.forward as well would nest two compilations. Elsewhere, the recipe of its
            # docs (without "reduce-overhead"'s CUDA graphs on the CPU).
            if a.device == "cuda" and hasattr(model.generation_config, "compile_config"):
                self.how = "generate's own compile of the decode step (reduce-overhead)"
            else:
                mode = "reduce-overhead" if a.device == "cuda" else None
                model.forward = torch.compile(model.forward, mode=mode, fullgraph=True)
                self.how = f"torch.compile(model.forward, mode={mode!r}, fullgraph=True)"
            print(f"  generate_compiled: {self.how}", file=sys.stderr, flush=True)

        def decode(k: int) -> list:
            out = hf.generate_reference(model, self.ps, k, **kwargs)
            _sync(a.device)
            return out

        # Warmed with every token: the static cache's length is the prompt's plus the new
        # tokens', and another length would be another compilation.
        return _timed(decode, a.rounds, a.tokens, a.tokens)  # the model goes with this frame

    def floor_graph(self) -> tuple[list, list[float]]:
        a = self.args
        stage = hf.HFStage(self.spec, 0, self.layers, a.microbatches, self.batch,
                           self.max_seq, a.device)
        step = stage.forward
        if stage.device.type == "cuda":
            from cgc.runtime.gpu.cuda_graphs import CapturedCall

            step = CapturedCall(stage.forward, "floor")
        return _timed(lambda k: hf.generate(lambda m, t, p: step(t, m, p), lambda r: r,
                                            self.ps, k), a.rounds, a.tokens, self.warm)

    def cgc_rows(self, stages: int, graphs: bool,
                 compiled: bool = False) -> tuple[list, list[float]]:
        a = self.args
        dag = hf.build_dag(self.spec, stages, a.microbatches, self.batch, self.max_seq,
                                  a.device, a.gpus, cuda_graph=graphs, compile=compiled)
        with cgc.compile(dag, name=f"hf{stages}").start(get_timeout=600) as g:
            out = _timed(lambda k: hf.generate(g.execute, lambda r: r.get(), self.ps, k),
                         a.rounds, a.tokens, self.warm)
            if graphs and hasattr(g, "cuda_graph_stats"):
                print(f"  cuda graphs: {g.cuda_graph_stats()}", file=sys.stderr)
            return out

    def _actors(self, stages: int) -> list:
        a = self.args
        cls = ray.remote(**hf.stage_options(a.device, stages, a.gpus))(hf.HFStage)
        return [cls.remote(self.spec, x, y, a.microbatches, self.batch, self.max_seq, a.device)
                for x, y in hf.split_layers(self.layers, stages)]

    def ray_cgraph(self) -> tuple[list, list[float]]:
        actors = self._actors(2)
        with InputNode() as inp:  # Ray Compiled Graph, as examples/ray_hf_decode.py builds it
            x = inp[1]
            for i, actor in enumerate(actors):
                x = actor.forward.bind(x, inp[0], inp[2])
                if i < len(actors) - 1:
                    x = x.with_tensor_transport("auto")
        compiled = x.experimental_compile()
        try:
            return _timed(lambda k: hf.generate(compiled.execute, ray.get, self.ps, k),
                          self.args.rounds, self.args.tokens, self.warm)
        finally:
            compiled.teardown()
            for actor in actors:
                ray.kill(actor)

    def ray_actors(self) -> tuple[list, list[float]]:
        actors = self._actors(2)

        def submit(mb: int, tokens: Any, pos: Any) -> Any:
            x = tokens
            for actor in actors:
                x = actor.forward.remote(x, mb, pos)
            return x

        try:
            out = _timed(lambda k: hf.generate(submit, ray.get, self.ps, k),
                         self.args.rounds, self.args.tokens, self.warm)
            self.memory = ray.get([actor.memory.remote() for actor in actors])
            return out
        finally:
            for actor in actors:
                ray.kill(actor)

    def run(self, system: str, stages: int) -> dict[str, Any]:
        """One row: tokens/s (median of the rounds) and whether its tokens equal
        ``generate``'s."""
        t0 = time.perf_counter()
        row: dict[str, Any] = dict(system=system, stages=stages, batch=self.batch)
        try:
            if system in ("generate", "generate_compiled"):
                got, times = self.floor(system == "generate_compiled")
                if self.args.device == "cuda":
                    torch.cuda.empty_cache()
            elif system.startswith("cgc"):
                got, times = self.cgc_rows(stages, system != "cgc", system.endswith("compiled"))
            else:
                got, times = getattr(self, system)()
        except Exception as e:  # a row that fails is reported; the others go on
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {e}"[:200]
            return row
        if system == "generate":
            self.want = got
        if system == "generate_compiled":
            row["compiled"] = self.how
        n = self.args.microbatches * self.batch * self.args.tokens
        # Without generate's tokens (its row failed) nothing is checked: equal is None.
        diff = None if self.want is None else hf.first_difference(got, self.want)
        row.update(tokens_per_s=n / statistics.median(times),
                   equal=None if self.want is None else diff is None,
                   first_difference=diff, seconds=round(time.perf_counter() - t0, 1))
        print(f"  {row}", file=sys.stderr, flush=True)
        return row


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as markdown, with each row's ratio to the compiled ``generate`` floor."""
    floor = {r["batch"]: r.get("tokens_per_s") for r in rows
             if r["system"] == "generate_compiled"}
    lines = ["| batch | system | stages | tokens/s | vs generate_compiled | equal |",
             "|---:|---|---:|---:|---:|---|"]
    for r in rows:
        tps, f = r.get("tokens_per_s"), floor.get(r["batch"])
        ratio = f"{tps / f:.2f}x" if tps and f else "-"
        equal = r.get("error") or {True: "yes", None: "unchecked"}.get(
            r.get("equal"), r.get("first_difference"))
        lines.append(f"| {r['batch']} | {r['system']} | {r['stages']} | "
                     f"{f'{tps:,.0f}' if tps else '-'} | {ratio} | {equal} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama", choices=sorted(hf.FAMILIES))
    ap.add_argument("--size", default="tiny", choices=sorted(hf.SIZES))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=sorted(hf.DTYPES))
    ap.add_argument("--attn", default="sdpa", choices=hf.ATTENTION)
    ap.add_argument("--batches", default="2", help="comma-separated batch sizes")
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm-tokens", type=int, default=8,
                    help="tokens of the warm-up decode (generate rows: all of them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpus", type=float, default=0.0, help="num_gpus per stage (cuda)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--stages", default="1,2", help="stage counts of the cgc rows")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    systems = args.systems.split(",")
    if unknown := set(systems) - set(SYSTEMS) - set(EXTRA_SYSTEMS):
        raise SystemExit(f"unknown systems {sorted(unknown)}: choose from "
                         f"{SYSTEMS + EXTRA_SYSTEMS}")
    print(f"transformers {transformers.__version__} | torch {torch.__version__} | ray "
          f"{ray.__version__} | {args.model} {args.size} {args.dtype} {args.attn} on "
          f"{args.device} | microbatches {args.microbatches} prompt {args.prompt_len} "
          f"tokens {args.tokens}", flush=True)
    ray.init(include_dashboard=False, log_to_driver=False)
    rows: list[dict[str, Any]] = []
    for batch in (int(b) for b in args.batches.split(",")):
        bench = Bench(args, batch)
        # generate first (the reference), then the floor the ratios are against and cgc's
        # rows, the slowest baselines last: a run cut short by a timeout keeps what matters.
        order = ["generate"] + [s for s in ORDER if s in systems and s != "generate"]
        for system in order:
            for stages in ([int(s) for s in args.stages.split(",")]
                           if system.startswith("cgc") else [2 if "ray" in system else 0]):
                print(f"batch {batch}: {system} {stages or ''}", file=sys.stderr, flush=True)
                rows.append(bench.run(system, stages))
                if args.json:  # after every row: a run stopped by a timeout keeps its rows
                    Path(args.json).write_text(json.dumps(rows, indent=1))
        skeleton, _ = hf.skeleton(bench.spec)  # on meta: sizes only
        size = torch.finfo(getattr(torch, args.dtype)).bits // 8
        whole = sum(t.numel() * size for t in skeleton.state_dict().values())
        for i, m in enumerate(bench.memory):
            print(f"batch {batch} stage {i} memory: {m}; weights "
                  f"{m['weights'] / whole * len(bench.memory):.2f}x its share of the model's "
                  f"{whole:,} bytes", flush=True)
    print(table(rows))
    ray.shutdown()


if __name__ == "__main__":
    import ray_leftovers  # Ray CG's named semaphores of our Ray go at exit

    ray_leftovers.install()
    main()
