"""The report's summary: the served runs against the engine limit (its best rounds over the benchmark, and the
probes right around each saturating run), the in-process engine against the same, batch 1, CPU per token, and the
warnings about a busy machine."""

import numpy as np
from llm_engine import step_ms_at  # bench/llm_engine.py

TARGET = 0.85  # served tokens/s over the engine limit at the same occupancy


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def best_limit(measurements: list[dict], key: str = "limit") -> dict:
    """The best step time (and, separately, the least CPU per step) per measured batch over several measurements (the
    machine is shared: noise only adds time)."""
    best = {}
    for batch in measurements[0][key]:
        rows = [m[key][batch] for m in measurements]
        best[batch] = dict(min(rows, key=lambda row: row["step_ms"]))
        if "cpu_ms" in rows[0]:
            best[batch]["cpu_ms"] = min(row["cpu_ms"] for row in rows)
        if all("median_step_ms" in row for row in rows):
            best[batch]["median_step_ms"] = float(np.median([row["median_step_ms"] for row in rows]))
    return best


def limit_at(limit: dict, occupancy: float, key: str = "step_ms") -> tuple[list[int], float]:
    """(the measured batches it comes from, engine-limit tokens/s at a mean decode batch of `occupancy`), as
    llm_engine.limit_at (the step time interpolated between the measured batches around it), on a limit read back
    from JSON (batches as strings); `key`: the rows' step time to use."""
    ms, batches = step_ms_at({batch: row[key] for batch, row in limit.items()}, occupancy)
    return batches, occupancy / (ms / 1000)


def decode_batch(run: dict) -> float:
    """A served run's occupancy for the limit: the engine's mean decode batch per model step (its statistics
    lines), as the in-process engine counts it; the client-side occupancy when the server reported none."""
    steps = run.get("engine_steps") or {}
    return steps.get("mean_decode_batch") or run["mean_occupancy"]


def paired(tokens_per_s: float, occupancy: float, probes: list[dict]) -> dict:
    """Throughput against the engine limit measured right before and right after it (the mean of the two probes'
    step times at the occupancy, each interpolated between its measured batches): the machine's speed at that
    moment, not at its quietest."""
    at_occupancy = [step_ms_at(probe["step_ms"], occupancy) for probe in probes]
    steps = [ms for ms, _ in at_occupancy]
    at = occupancy / (float(np.mean(steps)) / 1000)
    return {
        "limit_batches": at_occupancy[0][1],
        "probe_step_ms": [round(x, 3) for x in steps],
        "limit_tokens_per_s": round(at, 1),
        "fraction_of_limit": _ratio(tokens_per_s, at),
    }


def paired_summary(report: dict) -> dict:
    """Per saturating run: served, and the in-process engine right after it, each against the limit probed around
    it; the medians over the runs."""
    rows = []
    for run in (r for r in report["runs"] if r.get("saturation") and r.get("probes")):
        row = {
            "run": run["run"],
            "output_tokens_per_s": run["output_tokens_per_s"],
            "mean_occupancy": run["mean_occupancy"],
            "decode_batch": decode_batch(run),
            **paired(run["output_tokens_per_s"], decode_batch(run), run["probes"]),
        }
        eng = run.get("engine_run")
        if eng:
            row["engine"] = {
                "output_tokens_per_s": round(eng["tokens_per_s"], 1),
                "mean_decode_batch": round(eng["mean_decode_batch"], 3),
                **paired(eng["tokens_per_s"], eng["mean_decode_batch"], eng["probes"]),
            }
            row["served_over_in_process"] = _ratio(run["output_tokens_per_s"], eng["tokens_per_s"])
        rows.append(row)

    def median(values):
        values = [v for v in values if v is not None]
        return round(float(np.median(values)), 4) if values else None

    return {
        "runs": rows,
        "target": TARGET,
        "fraction_of_limit": median(r["fraction_of_limit"] for r in rows),
        "engine_fraction_of_limit": median(r.get("engine", {}).get("fraction_of_limit") for r in rows),
        "served_over_in_process": median(r.get("served_over_in_process") for r in rows),
    }


def served_cpu(row: dict) -> dict:
    per = row["cpu_ms_per_1k_tokens"]
    return {**per, "server": round(per["master"] + per["worker"] + per["agent"], 1)}


def summary(report: dict) -> dict:
    measurements = report["engine_limit"]["measurements"]
    limit = report["engine_limit"]["best"] = best_limit(measurements)
    batches = measurements[0]["limit_batches"]  # from 1: the batch-1 figures below are measured ones
    runs = {row["run"]: row for row in report["runs"]}
    # the best saturating run counts, as the best round counts for the limit (noise only takes throughput away)
    sat = max((r for r in report["runs"] if r.get("saturation")), key=lambda r: r["output_tokens_per_s"])
    occ = decode_batch(sat)
    at_batches, at = limit_at(limit, occ)
    win = sat["full_window"]
    win_batches, wat = limit_at(limit, win["mean_occupancy"])
    win.update(
        {
            "limit_batches": win_batches,
            "limit_tokens_per_s": round(wat, 1),
            "fraction_of_limit": _ratio(win["output_tokens_per_s"], wat),
        }
    )
    c1 = runs["c=1"]
    step1 = limit[str(batches[0])]["step_ms"]
    unbound = None
    if all("limit_unbound" in m for m in measurements):
        unbound = report["engine_limit"]["best_unbound"] = best_limit(measurements, "limit_unbound")
    uat = limit_at(unbound, occ)[1] if unbound else None
    mat = limit_at(limit, occ, "median_step_ms")[1] if all("median_step_ms" in r for r in limit.values()) else None
    result = {
        "saturation": {
            "run": sat["run"],
            "output_tokens_per_s": sat["output_tokens_per_s"],
            "mean_occupancy": sat["mean_occupancy"],
            "decode_batch": occ,
            "limit_batches": at_batches,
            "limit_tokens_per_s": round(at, 1),
            "fraction_of_limit": _ratio(sat["output_tokens_per_s"], at),
            "target": TARGET,
            "cpus": measurements[0].get("cpus"),
            "unbound_limit_tokens_per_s": round(uat, 1) if uat else None,
            "median_limit_tokens_per_s": round(mat, 1) if mat else None,
            "fraction_of_median_limit": _ratio(sat["output_tokens_per_s"], mat) if mat else None,
            "fraction_of_unbound_limit": _ratio(sat["output_tokens_per_s"], uat) if uat else None,
            "served_tpot_ms": sat["tpot_ms"]["mean"],
            "engine_itl_ms": sat["engine_log"]["itl_ms"]["mean"],
            "ttft_outside_engine_ms": sat["engine_log"]["ttft_outside_engine_ms"],
            "full_window": win,
        },
        "batch1": {
            "served_tpot_ms": c1["tpot_ms"]["mean"],
            "served_tpot_p50_ms": c1["tpot_ms"]["p50"],
            "engine_step_ms": round(step1, 3),
            "fraction_of_limit": round(step1 / c1["tpot_ms"]["mean"], 4),
            "overhead_fraction": round(1 - step1 / c1["tpot_ms"]["mean"], 4),
            "engine_itl_ms": c1["engine_log"]["itl_ms"]["mean"],
            "ttft_outside_engine_ms": c1["engine_log"]["ttft_outside_engine_ms"],
            "engine_step_median_ms": limit[str(batches[0])].get("median_step_ms"),
        },
    }
    result["saturation"]["cpu_ms_per_1k_tokens"] = served_cpu(sat)
    result["batch1"]["cpu_ms_per_1k_tokens"] = served_cpu(c1)
    cpu1 = limit[str(batches[0])].get("cpu_ms")
    if cpu1:
        result["batch1"]["engine_step_cpu_ms"] = round(cpu1, 3)
        result["batch1"]["server_cpu_over_engine_cpu"] = round(served_cpu(c1)["server"] / 1000 / cpu1, 3)
    warnings = []
    steps = [limit[str(b)]["step_ms"] for b in batches]
    if any(later < earlier * 0.9 for earlier, later in zip(steps, steps[1:])):
        warnings.append(
            "the engine limit's step times do not grow with the batch: the machine was busy while it "
            "was measured (rerun, or compare with bench/llm_engine.py)"
        )
    busy = [r["run"] for r in report["runs"] if r["other_cores"] > 0.3 and not r["run"].startswith("profiled")]
    if busy:
        warnings.append(f"other processes used > 0.3 cores during: {', '.join(busy)} (see other_cores)")
    result["warnings"] = warnings
    result["paired"] = paired_summary(report)
    if c1.get("probes"):
        steps = [probe["step_ms"][str(batches[0])] for probe in c1["probes"]]
        result["batch1"]["paired"] = {
            "probe_step_ms": [round(x, 3) for x in steps],
            "fraction_of_limit": _ratio(float(np.mean(steps)), c1["tpot_ms"]["mean"]),
        }
    engine_runs = [r["engine_run"] for r in report["runs"] if r.get("engine_run")]
    if engine_runs:
        best = max(engine_runs, key=lambda r: r["tokens_per_s"])
        eng_batches, eat = limit_at(limit, best["mean_decode_batch"])
        decode_at = limit_at(limit, best["decode_only_mean_batch"])[1] if best["decode_only_steps"] else 0.0
        result["engine_in_process"] = {
            "runs": len(engine_runs),
            "output_tokens_per_s": round(best["tokens_per_s"], 1),
            "each_tokens_per_s": [round(r["tokens_per_s"], 1) for r in engine_runs],
            "mean_decode_batch": round(best["mean_decode_batch"], 3),
            "limit_batches": eng_batches,
            "fraction_of_limit": round(best["tokens_per_s"] / eat, 4),
            "decode_fraction_of_limit": round(best["decode_only_tokens_per_s"] / decode_at, 4) if decode_at else 0.0,
            "served_over_in_process": round(sat["output_tokens_per_s"] / best["tokens_per_s"], 4),
            "cpu_ms_per_1k_tokens": round(min(r["cpu_ms_per_1k_tokens"] for r in engine_runs), 1),
        }
        result["saturation"]["server_cpu_over_in_process_cpu"] = round(
            served_cpu(sat)["server"] / result["engine_in_process"]["cpu_ms_per_1k_tokens"], 3
        )
    return result
