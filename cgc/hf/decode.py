"""Decoding through a pipeline of stages: the layer split, the token loop (every microbatch
in flight, stopping sequences at an end-of-sequence token as ``generate`` does), and helpers
to compare two decodes."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch


def split_layers(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """``[first, last)`` layer spans of ``n_stages`` stages, as even as possible.

    Example:

    >>> split_layers(12, 2)
    [(0, 6), (6, 12)]

    Raises:
        ValueError: fewer layers than stages, or no stage.
    """
    if not 1 <= n_stages <= n_layers:
        raise ValueError(f"{n_stages} stages for {n_layers} layers: need 1 <= stages <= layers")
    bounds = [round(i * n_layers / n_stages) for i in range(n_stages + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def prompts(vocab_size: int, microbatches: int, batch: int, length: int,
            seed: int = 1) -> list[torch.Tensor]:
    """Random prompts from ``seed``: one ``(batch, length)`` tensor of ids per microbatch.

    Example:

    >>> prompts(512, 2, 4, 16)[1].shape
    torch.Size([4, 16])

    Raises:
        ValueError: a vocabulary or length below 1.
    """
    if vocab_size < 1 or length < 1:
        raise ValueError(f"vocab {vocab_size}, length {length}: both must be at least 1")
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (batch, length), generator=gen)
            for _ in range(microbatches)]


def generate(submit: Callable[[int, torch.Tensor, torch.Tensor], Any],
             fetch: Callable[[Any], Any], prompt_list: Sequence[torch.Tensor], new_tokens: int,
             eos: Sequence[int] = (), pad: int | None = None,
             on_token: Callable[[int, int], None] | None = None) -> list[torch.Tensor]:
    """Decode every microbatch through a pipeline, all of them in flight.

    ``submit(mb, tokens, pos)`` starts one step (prefill when ``pos == 0``; ``pos`` a
    one-element int64 tensor) and returns a handle; ``fetch(handle)`` waits for its next
    tokens. With ``eos``, as ``generate`` does: a sequence that produced one of them gets
    ``pad`` from then on, and a microbatch stops when all its sequences have. Returns one
    ``(batch, n)`` tensor per microbatch, ``n <= new_tokens``. ``on_token(mb, step)`` is
    called as each token arrives (for timing).

    Example:

    >>> generate(lambda m, t, p: t[:, -1] + 1, lambda r: r, [torch.tensor([[5]])], 3)
    [tensor([[6, 7, 8]])]

    Raises:
        ValueError: ``eos`` without ``pad``.
    """
    if eos and pad is None:
        raise ValueError(f"end-of-sequence tokens {list(eos)} without a pad token")
    stops = torch.tensor(list(eos), dtype=torch.int64)
    out: list[list[torch.Tensor]] = [[] for _ in prompt_list]
    live = [torch.ones(p.shape[0], dtype=torch.bool) for p in prompt_list]
    pos = [p.shape[1] for p in prompt_list]
    zero = torch.zeros(1, dtype=torch.int64)
    pending = deque((mb, submit(mb, p, zero)) for mb, p in enumerate(prompt_list))
    while pending:
        mb, handle = pending.popleft()
        tok = fetch(handle).cpu()
        if len(stops):
            tok = torch.where(live[mb], tok, torch.full_like(tok, pad or 0))
            live[mb] &= ~torch.isin(tok, stops)
        out[mb].append(tok)
        if on_token is not None:
            on_token(mb, len(out[mb]))
        if len(out[mb]) < new_tokens and bool(live[mb].any()):
            pending.append((mb, submit(mb, tok[:, None], torch.tensor([pos[mb]]))))
            pos[mb] += 1
    return [torch.stack(toks, dim=1) for toks in out]


def run_stages(stages: Sequence[Any], tokens: torch.Tensor, mb: int, pos: Any) -> Any:
    """One step through every stage in this process (no actors).

    Example: ``run_stages(stages, prompt, 0, 0)``: microbatch 0's prefill, its next tokens.
    """
    x = tokens
    for s in stages:
        x = s.forward(x, mb, pos)
    return x


def first_difference(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> str | None:
    """Where two decodes first differ (``"microbatch m, sequence s, token t: a != b"``), or
    None when they are equal token for token.

    Example:

    >>> first_difference([torch.tensor([[1, 2]])], [torch.tensor([[1, 3]])])
    'microbatch 0, sequence 0, token 1: 2 != 3'

    Raises:
        ValueError: different numbers of microbatches.
    """
    if len(got) != len(want):
        raise ValueError(f"{len(got)} microbatches against {len(want)}")
    for m, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            return f"microbatch {m}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        bad = (g != w).nonzero()
        if len(bad):
            s, t = bad[0].tolist()
            return f"microbatch {m}, sequence {s}, token {t}: {int(g[s, t])} != {int(w[s, t])}"
    return None


def divergence(model: Any, prompt_list: Sequence[torch.Tensor], got: Sequence[torch.Tensor],
               want: Sequence[torch.Tensor]) -> dict[str, Any] | None:
    """Where ``got`` first leaves ``want`` (``model.generate``'s tokens) and by how much: the
    model's logits for the token it chose and the one ``got`` has, and the rank of the
    latter (1: the runner-up, a near tie). None where they are equal.

    Example: ``divergence(model, ps, staged, generated)["gap"]``.
    """
    for m, (g, w) in enumerate(zip(got, want, strict=True)):
        n = min(g.shape[1], w.shape[1])
        bad = (g[:, :n] != w[:, :n]).nonzero()
        if not len(bad):
            continue
        s, t = bad[0].tolist()
        dev = next(model.parameters()).device
        ids = torch.cat([prompt_list[m][s], w[s, :t]])[None].to(dev)
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, -1].float().cpu()
        a, b = int(w[s, t]), int(g[s, t])
        return dict(microbatch=m, sequence=s, token=t, want=a, got=b,
                    logit_want=float(logits[a]), logit_got=float(logits[b]),
                    gap=float(logits[a] - logits[b]),
                    rank_got=int((logits > logits[b]).sum()))
    return None
