"""Pipelined LLM decode: a GPT-2-shaped decoder split into stages, each an actor holding its
layers and its KV caches; greedy decoding of several microbatches at once, so the stages
work on different sequences at the same time.

One execution is one step of one microbatch through every stage: ``execute(mb, tokens,
pos)`` (a prompt at ``pos`` 0, then one token at a time) returns the next token of each
sequence. The tokens equal a single-process run exactly (``tinygpt.reference``).

    cgc compile examples/llm_decode.py -o decode.cgplan && cgc run decode.cgplan
    python examples/llm_decode.py                  # prefill + 16 tokens, checked
    python examples/llm_decode.py --size gpt2-small --stages 2 --gpus 0.5
    python examples/llm_decode.py --size gpt2-small --gpus 0.5 --cuda-graph   # replayed

With ``num_gpus`` per stage the hidden states travel over NCCL between distinct GPUs, CUDA
IPC on a shared one, and the CPU communicator where there are no GPUs
(``cgc run --communicator cpu``).
"""

from __future__ import annotations

import argparse
import time

import tinygpt

import cgc
from cgc import InputNode

Stage = cgc.actor(tinygpt.GPTStage)


def build_dag(size: str = "tiny", stages: int = 2, microbatches: int = 2, batch: int = 2,
              num_gpus: float = 0.0, transport: str = "auto", cuda_graph: bool = False):
    """The decode pipeline: ``stages`` actors over ``tinygpt.SIZES[size]``.

    ``cuda_graph=True``: each stage replays its step as a CUDA graph once it has seen it
    (``@cgc.method(cuda_graph=True)`` semantics; eager without CUDA, and with
    ``start(cuda_graphs=False)`` / ``cgc run --no-cuda-graphs``).
    """
    cfg = tinygpt.SIZES[size]
    opts: dict = {"num_gpus": num_gpus} if num_gpus else {"num_cpus": 0.5}
    if cuda_graph:
        opts["cuda_graph"] = True
    actors = [Stage.options(**opts).bind(cfg, a, b, microbatches, batch)
              for a, b in tinygpt.split_layers(cfg["n_layers"], stages)]
    with InputNode() as inp:
        mb, x, pos = inp[0], inp[1], inp[2]
        for i, actor in enumerate(actors):
            x = actor.forward.bind(x, mb, pos)
            if i < len(actors) - 1:
                x = x.with_tensor_transport(transport)
        # The next tokens reach the driver as host tensors (sent so by the last stage: the
        # driver never touches the GPU the stages share).
        return x.with_tensor_transport(device="cpu")


def build_graphed_dag():
    """The tiny pipeline, one GPU per stage, each stage's step replayed as a CUDA graph
    (eager on machines without CUDA)."""
    return build_dag(num_gpus=1, transport="nccl", cuda_graph=True)


def build_nccl_dag():
    """The tiny pipeline with one GPU per stage: hidden states over NCCL (or the CPU
    communicator without GPUs)."""
    return build_dag(num_gpus=1, transport="nccl")


def example_inputs():
    """One prefill step of microbatch 0 (what `cgc run` repeats)."""
    return (0, tinygpt.prompts(tinygpt.SIZES["tiny"], 1, 2, 8)[0], 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=sorted(tinygpt.SIZES))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=8, help="prompt length")
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per sequence")
    ap.add_argument("--gpus", type=float, default=0.0, help="num_gpus per stage")
    ap.add_argument("--cuda-graph", action="store_true", help="replay each step as a CUDA graph")
    args = ap.parse_args()
    cfg = tinygpt.SIZES[args.size]
    dag = build_dag(args.size, args.stages, args.microbatches, args.batch, args.gpus,
                    cuda_graph=args.cuda_graph)
    ps = tinygpt.prompts(cfg, args.microbatches, args.batch, args.prompt)
    with cgc.compile(dag, name="llm_decode").start() as graph:
        t0 = time.perf_counter()
        got = tinygpt.generate(graph.execute, lambda ref: ref.get(), ps, args.tokens)
        dt = time.perf_counter() - t0
    want = tinygpt.reference(cfg, ps, args.tokens)
    same = all((g == w).all() for g, w in zip(got, want, strict=True))
    n = args.microbatches * args.batch * args.tokens
    print(f"{n} tokens in {dt:.3f} s ({n / dt:,.0f} tokens/s); equal to the single-process "
          f"reference: {same}")
    print("first sequence:", got[0][0].tolist())


if __name__ == "__main__":
    main()
