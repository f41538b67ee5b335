"""Where a decode step's time goes, per token: the library's ``generate`` loop against
cgc.hf's stage, in one run on one device (issue 45 item 5: the eager path).

    python tools/bench/hf_step_profile.py                                   # tiny, CPU
    python tools/bench/hf_step_profile.py --size 1b --device cuda --dtype bfloat16

Rows (milliseconds per token, batch ``--batch``, median of ``--rounds``):
``generate``: ``model.generate`` eager (dynamic cache), the whole loop.
``library_forward``: the same model's ``forward`` called by hand with a ``DynamicCache``,
synchronised per token: ``generate`` minus its host loop (logits processors, stopping
criteria, ``prepare_inputs_for_generation``).
``stage_forward``: one ``HFStage`` holding every layer, ``forward`` per token, synchronised:
cgc's step without actors. ``stage_host``: the same, the time until ``forward`` returns
(before the device finishes): the Python the step costs; against ``stage_forward`` it tells
whether the step is bound by the host or the device.
``stage_parts``: the host time of the step's parts called alone (embedding, rotary, masks,
each decoder layer, norm and head, the argmax's copy to the host, building the position
tensor): Python per layer, argument packing, synchronisation.
``cgc_1_stage``: the same stage as a cgc actor, the driver's loop (``cgc.hf.generate``):
minus ``stage_forward``, the driver hop. ``ray_cgraph_1_stage``: the same actor in a Ray
Compiled Graph: against ``cgc_1_stage``, cgc's runtime against Ray's on the same step. Prints one JSON object per row, then a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from cgc import hf


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _per_token(fn: Callable[[], Any], n: int, dev: torch.device, rounds: int) -> float:
    """Median milliseconds of ``fn`` (one token), over ``rounds`` runs of ``n`` calls."""
    times = []
    for _ in range(rounds):
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync(dev)
        times.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(times)


def profile(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every row (see the module doc)."""
    spec = hf.model_spec(args.model, args.size, dtype=args.dtype, seed=0)
    dev = torch.device(args.device)
    vocab = spec.config["vocab_size"]
    prompt = hf.prompts(vocab, 1, args.batch, args.prompt_len)[0].to(dev)
    n, rows = args.tokens, []
    model = hf.load_model(spec, args.device)
    full = dict(eos_token_id=None, pad_token_id=0, do_sample=False)

    def gen() -> None:
        model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                       max_new_tokens=n, min_new_tokens=n, **full)

    gen()
    rows.append(dict(row="generate", ms_per_token=_per_token(gen, 1, dev, args.rounds) / n))

    from transformers import DynamicCache

    def by_hand() -> None:
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(n - 1):
                out = model(input_ids=tok, past_key_values=cache, use_cache=True)
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                tok.cpu()  # the token reaches the host each step, as in generate

    by_hand()
    rows.append(dict(row="library_forward",
                     ms_per_token=_per_token(by_hand, 1, dev, args.rounds) / n))
    model.cpu()  # free the device for the stage
    max_seq = args.prompt_len + n + 1
    stage = hf.HFStage(spec, 0, spec.num_layers, 1, args.batch, max_seq, args.device)
    tok = prompt[:, -1:].cpu()
    pos = torch.tensor([args.prompt_len])
    stage.forward(prompt.cpu(), 0, 0)
    host, whole = [], []
    for _ in range(n * args.rounds):  # medians per call: one-off stalls of a busy host out
        _sync(dev)
        t0 = time.perf_counter()
        out = stage.forward(tok, 0, pos)
        t1 = time.perf_counter()
        out.cpu()
        _sync(dev)
        host.append((t1 - t0) * 1e3)
        whole.append((time.perf_counter() - t0) * 1e3)
    rows.append(dict(row="stage_forward", ms_per_token=statistics.median(whole)))
    rows.append(dict(row="stage_host", ms_per_token=statistics.median(host)))
    rows.append(dict(row="stage_parts", **_parts(stage, tok, pos, dev, n)))
    if not args.no_actors:
        import ray

        ray.init(include_dashboard=False, log_to_driver=False)
        try:
            with hf.pipeline(spec=spec, stages=1, batch=args.batch, max_seq=max_seq,
                             device=args.device, eos_token_id=None) as p:
                p.generate([prompt.cpu()], n)
                secs = []
                for _ in range(args.rounds):
                    p.generate([prompt.cpu()], n)
                    secs.append(p.seconds)
            rows.append(dict(row="cgc_1_stage", ms_per_token=statistics.median(secs) / n * 1e3))
            rows.append(dict(row="ray_cgraph_1_stage", ms_per_token=_ray_cgraph(
                spec, args, max_seq, prompt.cpu(), n)))
        finally:
            ray.shutdown()
    return rows


def _ray_cgraph(spec: hf.ModelSpec, args: argparse.Namespace, max_seq: int,
               prompt: torch.Tensor, n: int) -> float:
    """Milliseconds per token of the same stage as one actor of a Ray Compiled Graph."""
    import ray
    from ray.dag import InputNode

    cls = ray.remote(**hf.stage_options(args.device, 1))(hf.HFStage)
    actor = cls.remote(spec, 0, spec.num_layers, 1, args.batch, max_seq, args.device)
    with InputNode() as inp:
        dag = actor.forward.bind(inp[1], inp[0], inp[2])
    compiled = dag.experimental_compile()
    try:
        hf.generate(compiled.execute, ray.get, [prompt], n)
        secs = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            hf.generate(compiled.execute, ray.get, [prompt], n)
            secs.append(time.perf_counter() - t0)
        return statistics.median(secs) / n * 1e3
    finally:
        compiled.teardown()
        ray.kill(actor)


def _parts(stage: hf.HFStage, tok: torch.Tensor, pos: torch.Tensor, dev: torch.device,
           n: int) -> dict[str, float]:
    """Host milliseconds of each part of one decode step, called alone."""
    out: dict[str, float] = {}

    def host(name: str, fn: Callable[[], Any]) -> Any:
        fn()
        times = []
        for _ in range(n):
            _sync(dev)
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = round(statistics.median(times), 4)

    with torch.inference_mode():
        positions = pos.to(dev) + stage._steps[:1]
        ids = tok.to(dev)
        h = stage.embed(ids)
        host("position_tensor", lambda: torch.tensor([5]).to(dev, non_blocking=True))
        host("embed", lambda: stage.embed(ids))
        host("rotary", lambda: stage._rope(h, positions[None]))
        host("masks", lambda: {w: stage._mask(positions, w) for w in set(stage.windows)})
        rope = stage._rope(h, positions[None])
        masks = {w: stage._mask(positions, w) for w in set(stage.windows)}
        cache = stage.caches[0]
        cache.positions = positions
        layer, window, key = stage.layers[0], stage.windows[0], stage.rope_keys[0]
        host("one_layer", lambda: layer(h, attention_mask=masks[window],
                                        position_ids=positions[None],
                                        position_embeddings=rope[key], use_cache=True,
                                        cache_position=positions,
                                        **{stage._cache_kw: cache}))
        out["layers_x_one_layer"] = round(out["one_layer"] * len(stage.layers), 4)
        host("norm_head", lambda: stage.logits(h))
        logits = stage.logits(h)
        host("argmax_to_host", lambda: logits.argmax(-1).cpu())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="llama", choices=sorted(hf.FAMILIES))
    ap.add_argument("--size", default="tiny", choices=sorted(hf.SIZES))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=sorted(hf.DTYPES))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-actors", action="store_true", help="skip the cgc_1_stage row")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch's CPU threads here (1, as Ray gives an actor of num_cpus<=1: "
                         "more make in-process rows spin against the actors on a busy host)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = profile(args)
    for r in rows:
        print(json.dumps(r))
    print("| row | ms/token |\n|---|---:|")
    for r in rows:
        if "ms_per_token" in r:
            print(f"| {r['row']} | {r['ms_per_token']:.3f} |")


if __name__ == "__main__":
    main()
