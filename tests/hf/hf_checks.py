"""Checks shared by the Hugging Face workload tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def token_rows(tokens: Iterable[Any]) -> list[list[int]]:
    """One list of ids per sequence, from per-microbatch tensors (batch x tokens)."""
    return [row for t in tokens for row in t.tolist()]


def assert_varied(rows: Iterable[Sequence[int]]) -> None:
    """Tokens that repeat one id would make equality prove little."""
    for seq in rows:
        assert len(set(seq)) >= len(seq) // 2, seq
