"""gc_tuning.settle: what is alive leaves the collector's sight, young passes come less often, an off switch stays."""

import gc

import pytest

from mindspore_serving.common import gc_tuning


@pytest.fixture()
def collector_state():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_settle_freezes_what_is_alive_and_raises_the_young_threshold(collector_state):
    gc.set_threshold(700, 10, 10)
    kept = [{"loaded": i} for i in range(100)]
    gc_tuning.settle()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, 10, 10)


def test_settle_keeps_a_higher_threshold_and_a_switched_off_collector(collector_state):
    gc.set_threshold(50000, 10, 10)
    gc_tuning.settle()
    assert gc.get_threshold()[0] == 50000
    gc.set_threshold(0, 10, 10)
    gc_tuning.settle()
    assert gc.get_threshold()[0] == 0
