"""Durations that environment variables set (MS_SERVING_BATCH_WAIT_MS, MS_SERVING_WORKER_SPIN_US, ...)."""

import os

_PER_SECOND = {"seconds": 1.0, "milliseconds": 1e3, "microseconds": 1e6}


def duration_seconds(variable: str, default_s: float, unit: str) -> float:
    """Seconds from `variable`, written in `unit` ("seconds", "milliseconds" or "microseconds"); `default_s` when it
    is unset, 0 for a negative value. Raises ValueError naming the variable for a value that is not a number."""
    text = os.environ.get(variable)
    if text is None:
        return default_s
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{variable} should be a number of {unit}, but got '{text}'") from None
    return max(0.0, value) / _PER_SECOND[unit]
