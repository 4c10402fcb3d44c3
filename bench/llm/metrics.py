"""A served run's figures from the client's records: throughput, TTFT, TPOT, ITL and e2e latency, the decode batch
occupancy, the engine's own timings matched by request id, and the CPU used by role."""

import math

import numpy as np

from .client import Record
from .cpu import ROLES

SERVED = (*ROLES, "client")


def stats(values) -> dict:
    values = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ms = values * 1000
    return {
        "mean": round(float(ms.mean()), 2),
        "p50": round(float(np.percentile(ms, 50)), 2),
        "p90": round(float(np.percentile(ms, 90)), 2),
        "p99": round(float(np.percentile(ms, 99)), 2),
    }


def occupancy(records: list[Record], start: float, end: float) -> float:
    """Time-average over [start, end] of the requests between their first and last token (in the decode batch)."""
    if end <= start:
        return 0.0
    busy = 0.0
    for r in records:
        if r.ok and len(r.events) > 1:
            busy += max(0.0, min(r.events[-1], end) - max(r.events[0], start))
    return busy / (end - start)


def summarise(
    name: str,
    records: list[Record],
    started: float,
    cpu0: dict,
    cpu1: dict,
    engine: dict[str, tuple[float, float, float]],
    extra: dict | None = None,
) -> dict:
    """One run's row; the run lasts from `started` until its last request ended."""
    good = [r for r in records if r.ok]
    duration = max(r.ended for r in records) - started if records else 0.0
    tokens = sum(r.tokens for r in good)
    tpot = [(r.e2e - r.ttft) / (r.tokens - 1) for r in good if r.tokens > 1]
    itl = [b - a for r in good for a, b in zip(r.events, r.events[1:])]
    row = {
        "run": name,
        "requests": len(records),
        "ok": len(good),
        "failed": len(records) - len(good),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "seconds": round(duration, 3),
        "req_per_s": round(len(good) / duration, 3) if duration else 0.0,
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / duration, 1) if duration else 0.0,
        "prompt_tokens_mean": round(float(np.mean([r.prompt_tokens for r in good])), 1) if good else 0.0,
        "ttft_ms": stats(r.ttft for r in good),
        "tpot_ms": stats(tpot),
        "itl_ms": stats(itl),
        "e2e_ms": stats(r.e2e for r in good),
        "mean_occupancy": round(occupancy(good, started, started + duration), 3),
        "mean_in_flight": round(sum(r.ended - r.sent for r in records) / duration, 3) if duration else 0.0,
        "token_events_short": sum(1 for r in good if len(r.events) != r.tokens),
    }
    pairs = [(r, engine[r.request_id[5:]]) for r in good if r.request_id[5:] in engine]
    matched = [m for _, m in pairs]
    row["engine_log"] = {
        "matched": len(matched),
        "ttft_ms": stats(m[0] for m in matched),
        "itl_ms": stats(m[1] for m in matched),
        "e2e_ms": stats(m[2] for m in matched),
        # client TTFT - engine TTFT: from the client's send until the request is in the engine, plus
        # the first token's way back (the engine counts from its own arrival)
        "ttft_outside_engine_ms": stats(r.ttft - m[0] for r, m in pairs),
        "e2e_outside_engine_ms": stats(r.e2e - m[2] for r, m in pairs),
    }
    if matched:  # engine-side decode time of the requests / the run's duration: occupancy seen by the engine
        decode_s = sum(m[2] - m[0] for m in matched)
        row["engine_log"]["occupancy"] = round(decode_s / duration, 3) if duration else 0.0
    wall = cpu1["t"] - cpu0["t"]
    used = {role: cpu1[role] - cpu0[role] for role in SERVED}
    row["cpu_cores"] = {role: round(v / wall, 3) for role, v in used.items()}
    row["cpu_ms_per_1k_tokens"] = {role: round(v / max(1, tokens) * 1e6, 1) for role, v in used.items()}
    row["other_cores"] = round(max(0.0, (cpu1["machine"] - cpu0["machine"]) - sum(used.values())) / wall, 3)
    if extra:
        row.update(extra)
    return row


def saturated_window(records: list[Record], started: float) -> dict:
    """The part of a saturating run while requests still queued: from the start until the last request's first
    token. Output tokens/s and occupancy there (a full engine, no ramp-down)."""
    good = [r for r in records if r.ok]
    if not good:
        return {"seconds": 0.0, "token_events": 0, "output_tokens_per_s": 0.0, "mean_occupancy": 0.0}
    end = max(r.events[0] for r in good)
    tokens = sum(1 for r in good for t in r.events if t <= end)
    seconds = end - started
    return {
        "seconds": round(seconds, 3),
        "token_events": tokens,
        "output_tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else 0.0,
        "mean_occupancy": round(occupancy(good, started, end), 3),
    }
