"""Process set-up for rota's own long-running processes."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from rota.runtime.process import tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tune_gc_freezes_start_up_objects_and_collects_young_ones_less_often(
    restored_gc: None,
) -> None:
    tune_gc()
    assert gc.get_threshold() == (50_000, 20, 100)
    assert gc.get_freeze_count() > 0
