"""Pipelined greedy decode of a Hugging Face ``transformers`` model (Llama, Qwen2, ...) on
cgc: the decoder split into stages (``hf_stages.HFStage``), each an actor that loads only
its own weights and holds a static KV cache per microbatch; several microbatches in flight.
The tokens are checked against the same model's ``model.generate(do_sample=False)``.

    python examples/hf_decode.py --model llama --stages 2 --tokens 16
    python examples/hf_decode.py --checkpoint DIR --stages 2 --device cuda --cuda-graph
    python examples/hf_decode.py --model qwen2 --size tiny --json   # one JSON object last
    cgc compile examples/hf_decode.py -o hf.cgplan && cgc run hf.cgplan

``--device cuda`` places every stage on this machine's GPU (a share each); ``--cuda-graph``
replays each stage's step as a CUDA graph once it has seen it (eager without CUDA).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import hf_stages
import tinygpt
import transformers

import cgc
from cgc import InputNode

Stage = cgc.actor(hf_stages.HFStage)


def stage_options(device: str, stages: int, num_gpus: float = 0.0,
                  cuda_graph: bool = False) -> dict[str, Any]:
    """Ray options of one stage actor: a share of the GPU with ``device="cuda"``."""
    opts: dict[str, Any] = {"num_cpus": 0.5}
    if device == "cuda":
        opts = {"num_gpus": num_gpus or round(0.9 / stages, 2)}
    if cuda_graph:
        opts["cuda_graph"] = True
    return opts


def build_dag(spec: dict[str, Any] | None = None, stages: int = 2, microbatches: int = 2,
              batch: int = 2, max_seq: int = 64, device: str = "cpu", num_gpus: float = 0.0,
              cuda_graph: bool = False, transport: str = "auto", compile: bool = False):
    """``(mb, tokens, pos) -> next tokens`` through ``stages`` actors of ``spec``'s model
    (the tiny Llama by default); ``compile``: each stage's layers through ``torch.compile``."""
    spec = spec or hf_stages.model_spec("llama", "tiny")
    n = spec["config"]["num_hidden_layers"]
    opts = stage_options(device, stages, num_gpus, cuda_graph)
    actors = [Stage.options(**opts).bind(spec, a, b, microbatches, batch, max_seq, device,
                                         compile)
              for a, b in tinygpt.split_layers(n, stages)]
    with InputNode() as inp:
        mb, x, pos = inp[0], inp[1], inp[2]
        for i, actor in enumerate(actors):
            x = actor.forward.bind(x, mb, pos)
            if i < len(actors) - 1:
                x = x.with_tensor_transport(transport)
        return x.with_tensor_transport(device="cpu")


def example_inputs():
    """One prefill step of microbatch 0 (what `cgc run` repeats)."""
    return (0, hf_stages.prompts(hf_stages.model_spec("llama", "tiny"), 1, 2, 8)[0], 0)


def parse_args(argv: list[str] | None = None, doc: str | None = None,
               transports: Sequence[str] = ()) -> argparse.Namespace:
    """The command line shared with ``ray_hf_decode.py`` and ``rdt_hf_decode.py`` (which add
    ``--cgc``; the latter also ``--transport``, one of ``transports``)."""
    ap = argparse.ArgumentParser(description=(doc or __doc__).splitlines()[0])
    if doc is not None:
        ap.add_argument("--cgc", action="store_true",
                        help="trace the step with cgc" if transports else "run on cgc's drop-in")
    if transports:
        ap.add_argument("--transport", choices=transports,
                        help="RDT hint on the activations (default: gloo, nccl with cuda)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", help="a save_pretrained directory")
    src.add_argument("--model", default="llama", choices=sorted(hf_stages.FAMILIES))
    ap.add_argument("--size", default="tiny", choices=sorted(hf_stages.SIZES))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per sequence")
    ap.add_argument("--seed", type=int, default=0, help="weights (without a checkpoint), prompts")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--attn", default="sdpa", choices=hf_stages.ATTENTION)
    ap.add_argument("--gpus", type=float, default=0.0, help="num_gpus per stage (cuda)")
    ap.add_argument("--cuda-graph", action="store_true", help="replay each step as a CUDA graph")
    ap.add_argument("--compile", action="store_true",
                    help="each stage's layers through torch.compile")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    return ap.parse_args(argv)


def spec_of(args: argparse.Namespace) -> dict[str, Any]:
    """The model the command line names."""
    if args.checkpoint:
        return hf_stages.model_spec(checkpoint=args.checkpoint, dtype=args.dtype,
                                    attn=args.attn)
    return hf_stages.model_spec(args.model, args.size, dtype=args.dtype, attn=args.attn,
                                seed=args.seed)


def report(args: argparse.Namespace, spec: dict[str, Any], ps: list, got: list,
           seconds: float, system: str) -> bool:
    """Check ``got`` against ``model.generate`` in this process and print the result
    (with ``--json``, the JSON object last). Returns whether they are equal."""
    model = hf_stages.load_model(spec, args.device)
    want = hf_stages.generate_reference(model, ps, args.tokens)
    diff = hf_stages.first_difference(got, want)
    n = args.microbatches * args.batch * args.tokens
    print(f"{system} (transformers {transformers.__version__}): {n} tokens in {seconds:.3f} s "
          f"({n / seconds:,.0f} tokens/s); equal to model.generate: "
          f"{diff is None}{'' if diff is None else ' - first difference: ' + diff}")
    if args.json:
        rows = lambda ts: [r for t in ts for r in t.tolist()]  # noqa: E731
        print(json.dumps({"prompts": rows(ps), "tokens": rows(got), "equal": diff is None}))
    return diff is None


def main() -> None:
    args = parse_args()
    spec = spec_of(args)
    max_seq = args.prompt_len + args.tokens
    dag = build_dag(spec, args.stages, args.microbatches, args.batch, max_seq, args.device,
                    args.gpus, args.cuda_graph, compile=args.compile)
    ps = hf_stages.prompts(spec, args.microbatches, args.batch, args.prompt_len, args.seed + 1)
    with cgc.compile(dag, name="hf_decode").start(get_timeout=300) as graph:
        t0 = time.perf_counter()
        got = tinygpt.generate(graph.execute, lambda ref: ref.get(), ps, args.tokens)
        dt = time.perf_counter() - t0
    if not report(args, spec, ps, got, dt, "cgc"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
