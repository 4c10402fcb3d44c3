"""Durations read from environment variables: the batch wait (milliseconds) and the Predict polling (microseconds)."""

import pytest

from mindspore_serving.common.env_durations import duration_seconds
from mindspore_serving.worker.servable_runtime import DEFAULT_BATCH_WAIT_MS, batch_wait_seconds


def test_a_duration_is_read_in_its_unit_with_a_default_and_no_negative(monkeypatch):
    monkeypatch.delenv("MS_SERVING_TEST_WAIT", raising=False)
    assert duration_seconds("MS_SERVING_TEST_WAIT", 0.25, "milliseconds") == 0.25
    for text, unit, seconds in (
        ("3", "milliseconds", 0.003),
        ("250", "microseconds", 0.00025),
        ("-1", "milliseconds", 0.0),
    ):
        monkeypatch.setenv("MS_SERVING_TEST_WAIT", text)
        assert duration_seconds("MS_SERVING_TEST_WAIT", 0.25, unit) == seconds
    monkeypatch.setenv("MS_SERVING_TEST_WAIT", "soon")
    with pytest.raises(ValueError, match="^MS_SERVING_TEST_WAIT should be a number of milliseconds, but got 'soon'$"):
        duration_seconds("MS_SERVING_TEST_WAIT", 0.25, "milliseconds")


def test_the_batch_wait_is_in_milliseconds(monkeypatch):
    monkeypatch.delenv("MS_SERVING_BATCH_WAIT_MS", raising=False)
    assert batch_wait_seconds() == DEFAULT_BATCH_WAIT_MS / 1000.0
    monkeypatch.setenv("MS_SERVING_BATCH_WAIT_MS", "5")
    assert batch_wait_seconds() == 0.005
    monkeypatch.setenv("MS_SERVING_BATCH_WAIT_MS", "x")
    with pytest.raises(ValueError, match="MS_SERVING_BATCH_WAIT_MS should be a number of milliseconds, but got 'x'"):
        batch_wait_seconds()
