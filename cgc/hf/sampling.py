"""Choosing the next token from the last stage's logits: greedy, or sampled with
temperature, top-k and top-p (the library's own logits warpers, in ``generate``'s order) and
one ``torch.Generator`` per sequence, seeded at each prefill.

Equal to ``generate(do_sample=True)`` for one sequence per call seeded alike
(``torch.manual_seed(seed)`` before ``generate``): the warpers are the library's and both
draw ``torch.multinomial`` from a generator in the same state. With several sequences in a
batch the library draws every row from the one global generator, in turn; here each
sequence has its own (so a sequence's tokens do not depend on its neighbours): there the
two differ by design.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


@dataclass(frozen=True)
class Sampling:
    """Sampling settings: ``temperature``, ``top_k`` (None or 0: off), ``top_p`` (1.0:
    off), and ``seed``: sequence ``s`` of microbatch ``m`` (batch ``b``) draws from a
    generator seeded ``seed + m * b + s`` at its prefill.

    Example:

    >>> Sampling(temperature=0.7, top_k=20, seed=3).seed_of(1, 2, 4)
    9

    Raises:
        ValueError: a temperature not above 0, a negative top-k, a top-p outside (0, 1].
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature {self.temperature}: must be above 0")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k {self.top_k}: must be 0 or more")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p}: must be in (0, 1]")

    def seed_of(self, mb: int, batch: int, row: int) -> int:
        """The seed of sequence ``row`` of microbatch ``mb``."""
        return self.seed + mb * batch + row

    def warpers(self) -> LogitsProcessorList:
        """The library's warpers for these settings, as ``generate`` builds them."""
        out = LogitsProcessorList()
        if self.temperature != 1.0:
            out.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            out.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
        if self.top_p < 1.0:
            out.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
        return out


class Sampler:
    """Draws next tokens for one stage's microbatches (a generator per sequence).

    Example: ``Sampler(Sampling(seed=1), 2, 4, device).draw(logits, mb=0, prefill=True)``.
    """

    def __init__(self, sampling: Sampling, microbatches: int, batch: int,
                 device: torch.device) -> None:
        self.sampling, self.batch = sampling, batch
        self._warpers = sampling.warpers()
        self._gens = [[torch.Generator(device=device) for _ in range(batch)]
                      for _ in range(microbatches)]

    def draw(self, logits: torch.Tensor, mb: int, prefill: bool) -> torch.Tensor:
        """One token per row of ``logits`` (float32, ``(batch, vocab)``); ``prefill``
        reseeds microbatch ``mb``'s generators first.

        Raises:
            ValueError: ``logits`` has another batch.
        """
        if logits.shape[0] != self.batch:
            raise ValueError(f"logits of batch {logits.shape[0]}: the sampler holds "
                             f"{self.batch}")
        gens = self._gens[mb]
        if prefill:
            for row, g in enumerate(gens):
                g.manual_seed(self.sampling.seed_of(mb, self.batch, row))
        scores = self._warpers(None, logits)  # the warpers never read the ids
        probs = torch.softmax(scores, dim=-1)
        return torch.cat([torch.multinomial(probs[row:row + 1], 1, generator=g)[:, 0]
                          for row, g in enumerate(gens)])
