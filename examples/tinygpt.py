"""A decoder-only transformer (GPT-2's layout) in plain torch, cut into pipeline stages.

Shared by `llm_decode.py` (cgc), `ray_llm_decode.py` (Ray Compiled Graph) and their
single-process reference. Weights come from fixed seeds, per tensor, so every process that
builds a layer gets the same bits without loading anything: a stage on another actor and
the reference agree exactly.

A stage holds layers ``[first, last)`` and, for each microbatch it serves, a KV cache of
``max_seq`` positions. ``forward(x, mb, pos)`` takes token ids (first stage) or hidden
states, writes positions ``pos .. pos+T-1`` of microbatch ``mb``'s cache and returns hidden
states, or (last stage) the greedy next token of each sequence.

    cfg = SIZES["tiny"]
    stages = [GPTStage(cfg, *span) for span in split_layers(cfg["n_layers"], 2)]
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.attention as attention
import torch.nn.functional as F


def _attention_backends() -> list:
    # Why not cuDNN's attention: it builds a new execution plan for every key length, 3.6 ms
    # of CPU per call on an H200 (measured with tools/bench/profile_floor.py). (Looked up
    # per call: the enum values cannot be pickled when Ray ships this module by value.)
    b = attention.SDPBackend  # looked up here: the module travels by reference
    return [b.FLASH_ATTENTION, b.EFFICIENT_ATTENTION, b.MATH]

# Sizes as plain dicts: they travel in a plan as constructor arguments.
SIZES: dict[str, dict[str, Any]] = {
    # CI on two CPU cores: a few milliseconds per step.
    "tiny": dict(vocab=256, d_model=64, n_layers=4, n_heads=4, max_seq=64, dtype="float32",
                 seed=0),
    # GPT-2 small's shape (the workloads issue's GPU size).
    "gpt2-small": dict(vocab=50257, d_model=768, n_layers=12, n_heads=12, max_seq=512,
                       dtype="float16", seed=0),
}


def pick_device(device: str = "auto") -> torch.device:
    """``"auto"``: this process's GPU when it has one, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def split_layers(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """``[first, last)`` layer spans of ``n_stages`` stages, as even as possible.

    Example: ``split_layers(12, 2) == [(0, 6), (6, 12)]``.
    """
    if not 1 <= n_stages <= n_layers:
        raise ValueError(f"{n_stages} stages for {n_layers} layers: need 1 <= stages <= layers")
    bounds = [round(i * n_layers / n_stages) for i in range(n_stages + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _param(seed: int, tag: int, shape: Sequence[int], std: float) -> torch.Tensor:
    # One generator per tensor: the same tensor wherever and in whatever order it is built.
    gen = torch.Generator().manual_seed(seed * 1_000_003 + tag)
    return torch.randn(*shape, generator=gen) * std


class _Layer:
    """One transformer block's weights (pre-norm attention + MLP)."""

    def __init__(self, cfg: dict[str, Any], index: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        d, seed = cfg["d_model"], cfg["seed"]
        base = 100 * (index + 1)
        std, proj_std = 0.02, 0.02 / math.sqrt(2 * cfg["n_layers"])

        def p(tag: int, shape: Sequence[int], s: float) -> torch.Tensor:
            return _param(seed, base + tag, shape, s).to(device=device, dtype=dtype)

        self.ln1_w, self.ln1_b = torch.ones(d, device=device, dtype=dtype), p(1, (d,), 0.0)
        self.w_qkv, self.b_qkv = p(2, (d, 3 * d), std), p(3, (3 * d,), 0.0)
        self.w_o, self.b_o = p(4, (d, d), proj_std), p(5, (d,), 0.0)
        self.ln2_w, self.ln2_b = torch.ones(d, device=device, dtype=dtype), p(6, (d,), 0.0)
        self.w_fc, self.b_fc = p(7, (d, 4 * d), std), p(8, (4 * d,), 0.0)
        self.w_proj, self.b_proj = p(9, (4 * d, d), proj_std), p(10, (d,), 0.0)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                positions: torch.Tensor, mask: torch.Tensor, n_heads: int) -> torch.Tensor:
        b, t, d = x.shape
        h = F.layer_norm(x, (d,), self.ln1_w, self.ln1_b)
        q, k, v = (h @ self.w_qkv + self.b_qkv).split(d, dim=2)
        q, k, v = (z.view(b, t, n_heads, d // n_heads).transpose(1, 2) for z in (q, k, v))
        k_cache.index_copy_(2, positions, k)
        v_cache.index_copy_(2, positions, v)
        with attention.sdpa_kernel(_attention_backends()):
            att = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        x = x + att.transpose(1, 2).reshape(b, t, d) @ self.w_o + self.b_o
        h = F.layer_norm(x, (d,), self.ln2_w, self.ln2_b)
        return x + F.gelu(h @ self.w_fc + self.b_fc, approximate="tanh") @ self.w_proj \
            + self.b_proj


class GPTStage:
    """Layers ``[first, last)`` of the model and their KV caches (see the module doc).

    The first stage also embeds tokens and positions; the last applies the final norm and
    the output projection and returns each sequence's greedy next token (on its device).
    """

    def __init__(self, cfg: dict[str, Any], first: int, last: int, microbatches: int = 1,
                 batch: int = 1, device: str = "auto") -> None:
        self.cfg = dict(cfg)
        self.device = pick_device(device)
        self.dtype = getattr(torch, cfg["dtype"])
        self.first, self.last = first, last
        self.is_first, self.is_last = first == 0, last == cfg["n_layers"]
        d, seed, dev, dt = cfg["d_model"], cfg["seed"], self.device, self.dtype
        if self.is_first:
            self.wte = _param(seed, 1, (cfg["vocab"], d), 0.02).to(device=dev, dtype=dt)
            self.wpe = _param(seed, 2, (cfg["max_seq"], d), 0.01).to(device=dev, dtype=dt)
        if self.is_last:
            self.lnf_w = torch.ones(d, device=dev, dtype=dt)
            self.lnf_b = torch.zeros(d, device=dev, dtype=dt)
            # Untied (unlike GPT-2): with random weights a tied head mostly repeats the
            # input token, which would make the exactness check weak.
            self.w_head = _param(seed, 3, (d, cfg["vocab"]), 0.02).to(device=dev, dtype=dt)
        self.layers = [_Layer(cfg, i, dev, dt) for i in range(first, last)]
        self.batch = batch
        self.caches = [self._cache(batch) for _ in range(microbatches)]
        self._steps = torch.arange(cfg["max_seq"], device=dev)

    def _cache(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        c = self.cfg
        shape = (batch, c["n_heads"], c["max_seq"], c["d_model"] // c["n_heads"])
        return [(torch.zeros(shape, device=self.device, dtype=self.dtype),
                 torch.zeros(shape, device=self.device, dtype=self.dtype))
                for _ in self.layers]

    def forward(self, x: torch.Tensor, mb: int, pos: Any) -> torch.Tensor:
        """Run this stage on microbatch ``mb`` at positions ``pos ..``; see the class doc.

        ``pos`` is an int or a one-element int64 tensor. Every shape inside is fixed by
        ``x``'s (the cache is attended in full, masked past the last written position), so
        a step is the same kernels for every position: it can be captured and replayed as
        a CUDA graph (``@cgc.method(cuda_graph=True)``), and eager and replayed runs give
        the same bits.

        Raises:
            ValueError: ``mb`` or the batch do not fit the caches.
        """
        if not 0 <= mb < len(self.caches):
            raise ValueError(f"microbatch {mb}: this stage holds caches for "
                             f"{len(self.caches)} microbatches")
        if x.shape[0] != self.batch:
            raise ValueError(f"batch {x.shape[0]}: the caches hold batch {self.batch}")
        t = x.shape[1]
        # Checked where the position is on the host (an eager step; a replayed step runs no
        # Python: out of range there is a device-side error, never a wrong token).
        first = int(pos) if not torch.is_tensor(pos) or pos.device.type == "cpu" else 0
        if first < 0 or first + t > self.cfg["max_seq"]:
            raise ValueError(f"positions {first}..{first + t - 1}: everything must fit in "
                             f"max_seq={self.cfg['max_seq']}")
        if not torch.is_tensor(pos):
            pos = torch.tensor([pos])
        dev = self.device
        with torch.inference_mode():
            positions = pos.to(dev, non_blocking=True).reshape(1) + self._steps[:t]
            # Query i (at positions[i]) sees every key up to its own position.
            mask = self._steps[None, :] <= positions[:, None]
            x = x.to(dev, non_blocking=True)
            if self.is_first:
                x = self.wte[x] + self.wpe.index_select(0, positions)
            for layer, (k, v) in zip(self.layers, self.caches[mb], strict=True):
                x = layer.forward(x, k, v, positions, mask, self.cfg["n_heads"])
            if not self.is_last:
                return x
            h = F.layer_norm(x[:, -1], (x.shape[-1],), self.lnf_w, self.lnf_b)
            return (h @ self.w_head).argmax(dim=-1)


def prompts(cfg: dict[str, Any], microbatches: int, batch: int, length: int,
            seed: int = 1) -> list[torch.Tensor]:
    """Fixed prompts: one ``(batch, length)`` tensor of token ids per microbatch."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, cfg["vocab"], (batch, length), generator=gen)
            for _ in range(microbatches)]


def generate(submit: Callable[[int, torch.Tensor, int], Any], fetch: Callable[[Any], Any],
             prompt_list: Sequence[torch.Tensor], new_tokens: int,
             on_token: Callable[[int, int], None] | None = None) -> list[torch.Tensor]:
    """Greedy decoding of every microbatch through a pipeline, all of them in flight.

    ``submit(mb, tokens, pos)`` starts one step (prefill when ``pos == 0``; ``pos`` a
    one-element int64 tensor, so a captured step's inputs keep their shapes) and returns a
    handle; ``fetch(handle)`` waits for its next tokens (moved to the CPU here). Steps of one microbatch run in
    order; microbatches interleave, so a pipeline of stages is kept busy. Returns one
    ``(batch, new_tokens)`` tensor per microbatch. ``on_token(mb, step)`` is called as each
    token arrives (for timing).

    Example: ``generate(lambda m, t, p: stage.forward(t, m, p), lambda r: r, ps, 8)``.
    """
    out: list[list[torch.Tensor]] = [[] for _ in prompt_list]
    pos = [p.shape[1] for p in prompt_list]
    zero = torch.zeros(1, dtype=torch.int64)
    pending = deque((mb, submit(mb, p, zero)) for mb, p in enumerate(prompt_list))
    while pending:
        mb, handle = pending.popleft()
        tok = fetch(handle).cpu()
        out[mb].append(tok)
        if on_token is not None:
            on_token(mb, len(out[mb]))
        if len(out[mb]) < new_tokens:
            pending.append((mb, submit(mb, tok[:, None], torch.tensor([pos[mb]]))))
            pos[mb] += 1
    return [torch.stack(toks, dim=1) for toks in out]


def reference(cfg: dict[str, Any], prompt_list: Sequence[torch.Tensor], new_tokens: int,
              device: str = "auto", n_stages: int = 1) -> list[torch.Tensor]:
    """The same decode in this process: the stages called one after another, no actors.

    The tokens a pipeline must reproduce exactly (the layers, shapes and order of every
    operation are the same; only the processes differ).
    """
    batch = prompt_list[0].shape[0]
    stages = [GPTStage(cfg, a, b, len(prompt_list), batch, device)
              for a, b in split_layers(cfg["n_layers"], n_stages)]

    def run(mb: int, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        x = tokens
        for s in stages:
            x = s.forward(x, mb, pos)
        return x

    return generate(run, lambda t: t, prompt_list, new_tokens)
