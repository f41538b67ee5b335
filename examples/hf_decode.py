"""Pipelined decode of a Hugging Face ``transformers`` model on cgc (``cgc.hf``): the
decoder split into stage actors, each loading only its own weights, several microbatches in
flight; the tokens checked against the library itself, ``AutoModelForCausalLM
.from_pretrained(DIR)`` + ``generate`` with the checkpoint's ``generation_config.json``.

    python examples/hf_decode.py --model llama --stages 2 --tokens 16
    python examples/hf_decode.py --checkpoint DIR --stages 2 --device cuda --cuda-graph
    python examples/hf_decode.py --checkpoint DIR --sample --temperature 0.7 --top-p 0.9
    python examples/hf_decode.py --model qwen2 --size tiny --json   # one JSON object last
    cgc compile examples/hf_decode.py -o hf.cgplan && cgc run hf.cgplan

The whole of it, as a user writes it::

    from cgc import hf
    with hf.pipeline(DIR, stages=2, batch=2) as gen:
        tokens = gen.generate(prompt_ids, new_tokens=16)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
import transformers

from cgc import hf


def build_dag(spec: hf.ModelSpec | None = None, *args: Any, **kwargs: Any) -> Any:
    """``cgc.hf.build_dag`` (the tiny Llama by default): what ``cgc compile`` reads."""
    return hf.build_dag(spec or hf.model_spec("llama", "tiny"), *args, **kwargs)


def example_inputs() -> tuple:
    """One prefill step of microbatch 0 (what `cgc run` repeats)."""
    return (0, hf.prompts(512, 1, 2, 8)[0], 0)


def parse_args(argv: list[str] | None = None, doc: str | None = None,
               transports: Sequence[str] = ()) -> argparse.Namespace:
    """The command line shared with ``ray_hf_decode.py`` and ``rdt_hf_decode.py`` (which add
    ``--cgc``; the latter also ``--transport``, one of ``transports``)."""
    ap = argparse.ArgumentParser(description=(doc or __doc__ or "").splitlines()[0])
    if doc is not None:
        ap.add_argument("--cgc", action="store_true",
                        help="trace the step with cgc" if transports else "run on cgc's drop-in")
    if transports:
        ap.add_argument("--transport", choices=transports,
                        help="RDT hint on the activations (default: gloo, nccl with cuda)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", help="a save_pretrained directory")
    src.add_argument("--model", default="llama", choices=sorted(hf.FAMILIES))
    ap.add_argument("--size", default="tiny", choices=sorted(hf.SIZES))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per sequence")
    ap.add_argument("--seed", type=int, default=0,
                    help="weights (without a checkpoint), prompts, sampling")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=sorted(hf.DTYPES))
    ap.add_argument("--attn", choices=hf.ATTENTION, help="default: the architecture's")
    ap.add_argument("--gpus", type=float, default=0.0, help="num_gpus per stage (cuda)")
    ap.add_argument("--cuda-graph", action="store_true", help="replay each step as a CUDA graph")
    ap.add_argument("--compile", action="store_true",
                    help="each stage's layers through torch.compile")
    ap.add_argument("--sample", action="store_true", help="sample (do_sample=True)")
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    return ap.parse_args(argv)


def spec_of(args: argparse.Namespace) -> hf.ModelSpec:
    """The model the command line names."""
    if args.checkpoint:
        return hf.model_spec(checkpoint=args.checkpoint, dtype=args.dtype, attn=args.attn)
    return hf.model_spec(args.model, args.size, dtype=args.dtype, attn=args.attn,
                         seed=args.seed)


def generation_options(args: argparse.Namespace) -> dict[str, Any]:
    """The generation-config overrides the command line asks for."""
    opts: dict[str, Any] = {"do_sample": True} if getattr(args, "sample", False) else {}
    for name in ("temperature", "top_k", "top_p"):
        if getattr(args, name, None) is not None:
            opts[name] = getattr(args, name)
    return opts


def prompts_of(args: argparse.Namespace, spec: hf.ModelSpec) -> list:
    """The random prompts (from ``--seed + 1``)."""
    return hf.prompts(spec.config["vocab_size"], args.microbatches, args.batch,
                      args.prompt_len, args.seed + 1)


def report(args: argparse.Namespace, spec: hf.ModelSpec, ps: list, got: list,
           seconds: float, system: str) -> bool:
    """Check ``got`` against the library's ``from_pretrained`` + ``generate`` on the
    checkpoint (a seeded model is written out with ``save_pretrained`` first) and print the
    result (with ``--json``, the JSON object last). Returns whether they are equal."""
    opts = generation_options(args)
    with tempfile.TemporaryDirectory() as tmp:
        path = spec.checkpoint
        if path is None:
            hf.load_model(spec, "cpu").save_pretrained(tmp)
            path = tmp
        model = hf.reference_model(path, spec, args.device)
        if opts.get("do_sample"):  # the library draws a batch from one generator
            per_seq = [p[i:i + 1] for p in ps for i in range(p.shape[0])]
            flat = hf.generate_reference(model, per_seq, args.tokens, seed=args.seed, **opts)
            pad = hf.generation_settings(spec, **opts).pad or 0
            want = [_join(flat[m * args.batch:(m + 1) * args.batch], pad)
                    for m in range(len(ps))]
        else:
            want = hf.generate_reference(model, ps, args.tokens, **opts)
    diff = hf.first_difference(got, want)
    n = sum(t.numel() for t in got)
    print(f"{system} (transformers {transformers.__version__}): {n} tokens in {seconds:.3f} s "
          f"({n / seconds:,.0f} tokens/s); equal to from_pretrained + generate: "
          f"{diff is None}{'' if diff is None else ' - first difference: ' + diff}")
    if args.json:
        rows = lambda ts: [r for t in ts for r in t.tolist()]  # noqa: E731
        print(json.dumps({"prompts": rows(ps), "tokens": rows(got), "equal": diff is None}))
    return diff is None


def _join(rows: list, pad: int) -> Any:
    """One sequence's tokens per row, as one batch (padded as generate pads)."""
    n = max(r.shape[1] for r in rows)
    return torch.cat([torch.nn.functional.pad(r, (0, n - r.shape[1]), value=pad)
                      for r in rows])


def main() -> None:
    args = parse_args()
    spec = spec_of(args)
    ps = prompts_of(args, spec)
    with hf.pipeline(spec=spec, stages=args.stages, microbatches=args.microbatches,
                     batch=args.batch, max_seq=args.prompt_len + args.tokens,
                     device=args.device, cuda_graph=args.cuda_graph, compile=args.compile,
                     seed=args.seed, **generation_options(args)) as gen:
        got = gen.generate(ps, args.tokens)
    if not report(args, spec, ps, got, gen.seconds, "cgc"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
