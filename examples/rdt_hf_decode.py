"""Pipelined decode of a Hugging Face model written as Ray code is written now: plain actor
calls, one ``.remote()`` per stage, the activations sent with Ray Direct Transport hints.

    python examples/rdt_hf_decode.py --model llama --stages 2        # eager Ray, RDT (gloo)
    python examples/rdt_hf_decode.py --model llama --stages 2 --cgc  # the same step, traced
    python examples/rdt_hf_decode.py --model qwen2 --size tiny --json  # one JSON object last

``--cgc`` adds exactly one line: ``step = cgc.trace(step)``. The stages are
``cgc.hf.HFStage`` (live actors from ``ray.remote(HFStage).remote(...)``), the step is
``rdt_llm_decode.decode_step`` (``HFStage.forward`` keeps ``GPTStage``'s contract), and the
command line and the check against the library's ``generate`` are ``hf_decode.py``'s, plus
``--transport`` (default ``gloo``; ``nccl`` with ``--device cuda``) and without
``--cuda-graph``/``--compile`` (``hf_decode.py``'s). Prefill, then token by token, every
microbatch in flight (``cgc.hf.generate``).
"""

from __future__ import annotations

import time

import hf_decode
import ray
import ray_hf_decode
import rdt_common
import rdt_llm_decode

from cgc import hf


def main() -> None:
    args = hf_decode.parse_args(doc=__doc__, transports=rdt_common.TRANSPORTS)
    transport = args.transport or ("nccl" if args.device == "cuda" else "gloo")
    ray.init()
    spec = hf_decode.spec_of(args)
    settings = hf.generation_settings(spec, seed=args.seed,
                                      **hf_decode.generation_options(args))
    actors = ray_hf_decode.make_stages(spec, args.stages, args.microbatches, args.batch,
                                       args.prompt_len + args.tokens, args.device, args.gpus,
                                       rdt=True, sampling=settings.sampling)
    rdt_common.setup_transport(actors, transport)
    step = rdt_llm_decode.decode_step(actors, transport)
    if args.cgc:
        import cgc

        step = cgc.trace(step)
    ps = hf_decode.prompts_of(args, spec)
    t0 = time.perf_counter()
    got = hf.generate(step, ray.get, ps, args.tokens, settings.eos, settings.pad)
    dt = time.perf_counter() - t0
    system = f"{'cgc trace' if args.cgc else 'eager Ray'} ({transport})"
    if not hf_decode.report(args, spec, ps, got, dt, system):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
