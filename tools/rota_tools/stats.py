"""Order statistics for the benchmarks and the demo, and the order of
their paired runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 <= q <= 1); 0.0 for an empty sample."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def in_turns(pair: tuple[T, T], run: int) -> tuple[T, T]:
    """The pair in run `run`'s order: as given, then the other way round, in
    turns, so that a drift over the runs weighs on both sides alike."""
    return pair if run % 2 == 0 else (pair[1], pair[0])
