"""`routegate serve` settles the garbage collector once the app is built."""

from __future__ import annotations

import gc

from gateway.server.serve import GC_THRESHOLDS, settle_garbage_collector


def test_long_lived_objects_are_frozen_and_young_collections_are_rarer() -> None:
    before = gc.get_threshold()
    try:
        settle_garbage_collector()
        assert gc.get_freeze_count() > 0  # the app's objects: out of every later collection
        assert gc.get_threshold() == GC_THRESHOLDS
        assert GC_THRESHOLDS[0] > before[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
