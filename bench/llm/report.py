"""The benchmark's report: its skeleton with what was run ("meta"), and the tables printed at the end (the engine
limit, every run's latencies and CPU, the saturation and batch-1 figures against the limit)."""

import datetime
import os

from .workload import DESCRIPTION

ENGINE_FIELDS = (
    "batching",
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_blocks",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "max_model_len",
    "num_scheduler_steps",
    "async_scheduling",
    "max_prefills_per_decode_step",
)


def new_report(args, config) -> dict:
    """The report before any run: what is measured and how; the runs and the engine limit's measurements to come."""
    return {
        "meta": {
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "quick": args.quick,
            "cpu_count": os.cpu_count(),
            "loadavg_start": os.getloadavg(),
            "seed": args.seed,
            "requests": args.requests,
            "cpu_affinity": args.cpu_affinity,
            "c1_requests": args.c1_requests,
            "poisson_seconds": args.poisson_seconds,
            "saturation_runs": args.saturation_runs,
            "rates": [f"{v:g}x" if k == "x" else f"{v:g}/s" for k, v in args.rates],
            "api": "OpenAI POST /v1/completions, stream, ignore_eos, temperature 0, include_usage",
            "client": "asyncio (uvloop) + aiohttp, one connection per stream",
            "workload": DESCRIPTION,
            "engine": {k: getattr(config.engine, k) for k in ENGINE_FIELDS},
        },
        "engine_limit": {"measurements": []},
        "runs": [],
    }


def fmt(value, spec=".1f") -> str:
    return "-" if value is None else format(value, spec)


def at_batches(batches: list[int]) -> str:
    """Where a limit's step time comes from (summary.limit_at): a measured batch, or two it interpolates between."""
    return f"batch {batches[0]}" if len(batches) == 1 else f"interpolated between batches {batches[0]} and {batches[1]}"


def table(report: dict) -> str:
    lines = []
    limit = report["engine_limit"]["best"]
    ms = report["engine_limit"]["measurements"]
    unbound = report["engine_limit"].get("best_unbound")
    lines.append(
        f"Engine limit (bench/llm_engine.py engine_limit: decode steps of `batch` one-token rows, graphs back to "
        f"back; best of {len(ms)} measurement(s); on the agent's cores {ms[0].get('cpus') or 'all'}"
        f"{'; unbound: every core' if unbound else ''})"
    )
    lines.append(
        f"{'batch':>6} {'step ms':>8} {'tokens/s':>9}   {'each measurement, step ms':<26}"
        f"{'unbound step ms' if unbound else ''}"
    )
    for batch, row in sorted(limit.items(), key=lambda kv: int(kv[0])):
        each = " ".join(f"{m['limit'][batch]['step_ms']:.2f}" for m in ms)
        free = f"{unbound[batch]['step_ms']:.2f}" if unbound else ""
        lines.append(f"{batch:>6} {row['step_ms']:>8.2f} {row['tokens_per_s']:>9.0f}   {each:<26}{free}")
    lines.append("")
    head = (
        f"{'run':<19} {'ok':>4} {'req/s':>6} {'tok/s':>6} {'occ':>5} {'TTFT mean/p50/p90/p99':>24} "
        f"{'TPOT mean/p50/p90/p99':>23} {'ITL mean/p50/p90/p99':>23} {'E2E mean/p50/p90/p99':>24} "
        f"{'CPU m/w/a/c':>19} {'other':>5}"
    )
    lines.append(head)

    def q(st):
        """mean/p50/p90/p99 of one latency's stats."""
        return "/".join(fmt(st[k], ".0f" if (st[k] or 0) >= 100 else ".1f") for k in ("mean", "p50", "p90", "p99"))

    for row in report["runs"]:
        c = row["cpu_cores"]
        lines.append(
            f"{row['run']:<19} {row['ok']:>4} {row['req_per_s']:>6.2f} {row['output_tokens_per_s']:>6.0f} "
            f"{row['mean_occupancy']:>5.1f} {q(row['ttft_ms']):>24} {q(row['tpot_ms']):>23} {q(row['itl_ms']):>23} "
            f"{q(row['e2e_ms']):>24} {c['master']:.2f}/{c['worker']:.2f}/{c['agent']:.2f}/{c['client']:.2f} "
            f"{row['other_cores']:>5.2f}"
        )
    lines.append("")
    lines.append(
        f"{'run':<19} {'engine TTFT mean/p50':>21} {'engine ITL mean':>16} {'client-engine TTFT mean/p90':>28} "
        f"{'CPU ms/1k tok m/w/a/c':>25}"
    )
    for row in report["runs"]:
        e = row["engine_log"]
        out = e["ttft_outside_engine_ms"]
        c = row["cpu_ms_per_1k_tokens"]
        lines.append(
            f"{row['run']:<19} {fmt(e['ttft_ms']['mean'], '.0f') + '/' + fmt(e['ttft_ms']['p50'], '.0f'):>21} "
            f"{fmt(e['itl_ms']['mean'], '.1f'):>16} "
            f"{fmt(out['mean'], '.1f') + '/' + fmt(out['p90'], '.1f'):>28} "
            f"{c['master']:.0f}/{c['worker']:.0f}/{c['agent']:.0f}/{c['client']:.0f}".rjust(0)
        )
    lines.append(
        "times in ms; occ: mean decode batch occupancy (client side: time-average of the requests between "
        "their first and last token);\nCPU: cores used by master/worker/agent/client during the run; other: "
        "cores used by other processes on the machine;\nengine TTFT/ITL: the engine's own figures (master's "
        "log); client-engine TTFT: getting into the engine and the first token back out"
    )
    s = report["summary"]
    lines.append("")
    pair = s.get("paired") or {}
    if pair.get("runs"):
        lines.append(
            "Saturation against the engine limit probed right before and right after each run (the same decode "
            "steps back to back, mean of the two probes; the in-process engine runs right after the served run "
            "and is probed after it too; batch: the engine's mean decode batch per model step, from its "
            "statistics lines):"
        )
        lines.append(
            f"  {'run':<15} {'tok/s':>6} {'batch':>6} {'probe ms':>13} {'limit':>6} {'fraction':>8}   "
            f"{'in-process tok/s':>16} {'batch':>6} {'fraction':>8}   {'served/in-process':>17}"
        )
        for row in pair["runs"]:
            eng = row.get("engine") or {}
            probes = "/".join(f"{x:.1f}" for x in row["probe_step_ms"])
            lines.append(
                f"  {row['run']:<15} {row['output_tokens_per_s']:>6.0f} {row['decode_batch']:>6.2f} "
                f"{probes:>13} {row['limit_tokens_per_s']:>6.0f} {row['fraction_of_limit']:>8.3f}   "
                f"{fmt(eng.get('output_tokens_per_s'), '.0f'):>16} "
                f"{fmt(eng.get('mean_decode_batch'), '.2f'):>6} {fmt(eng.get('fraction_of_limit'), '.3f'):>8}"
                f"   {fmt(row.get('served_over_in_process'), '.3f'):>17}"
            )
        lines.append(
            f"  median over {len(pair['runs'])} run(s): served {fmt(pair['fraction_of_limit'], '.3f')} of the "
            f"limit (target >= {pair['target']}), in-process engine "
            f"{fmt(pair['engine_fraction_of_limit'], '.3f')}, served / in-process "
            f"{fmt(pair['served_over_in_process'], '.3f')}"
        )
    sat = s["saturation"]
    lines.append(
        f"Best saturating run ({sat['run']}): {sat['output_tokens_per_s']:.0f} output tokens/s at mean "
        f"decode batch {sat['decode_batch']:.2f} (step time {at_batches(sat['limit_batches'])}); against the "
        f"engine limit's best round of the whole benchmark (the machine's quietest moment) "
        f"{sat['limit_tokens_per_s']:.0f} tokens/s there -> fraction {sat['fraction_of_limit']:.3f}"
    )
    if sat.get("median_limit_tokens_per_s"):
        lines.append(
            f"  against the limit's median round instead of its best (the machine's usual speed, not its "
            f"quietest moment): {sat['median_limit_tokens_per_s']:.0f} tokens/s -> fraction "
            f"{sat['fraction_of_median_limit']:.3f}"
        )
    if sat.get("unbound_limit_tokens_per_s"):
        lines.append(
            f"  the limit was measured on the agent's cores {sat['cpus']} (agents.cpu_affinity); with every "
            f"core to itself it is {sat['unbound_limit_tokens_per_s']:.0f} tokens/s there -> fraction "
            f"{sat['fraction_of_unbound_limit']:.3f}"
        )
    win = sat["full_window"]
    lines.append(
        f"  while requests queued ({win['seconds']:.1f} s): {win['output_tokens_per_s']:.0f} tokens/s at "
        f"occupancy {win['mean_occupancy']:.2f} -> fraction {win['fraction_of_limit']:.3f} of "
        f"{win['limit_tokens_per_s']:.0f}"
    )
    eng = s.get("engine_in_process")
    if eng:
        lines.append(
            f"  the same requests through the engine in-process (llm_engine.run_engine, best of "
            f"{eng['runs']}): {eng['output_tokens_per_s']:.0f} tokens/s at mean decode batch "
            f"{eng['mean_decode_batch']:.2f} -> {eng['fraction_of_limit']:.3f} of the limit (decode-only "
            f"steps {eng['decode_fraction_of_limit']:.3f}); served / in-process = "
            f"{eng['served_over_in_process']:.3f}"
        )
    out = sat.get("ttft_outside_engine_ms") or {}
    if out.get("mean") is not None:
        lines.append(
            f"  client TTFT - engine TTFT (getting into the engine and the first token out): mean "
            f"{out['mean']:.0f} ms, p90 {out['p90']:.0f} ms; engine ITL mean {fmt(sat['engine_itl_ms'], '.1f')}"
            f" ms vs client TPOT {fmt(sat['served_tpot_ms'], '.1f')} ms"
        )
    cpu = sat["cpu_ms_per_1k_tokens"]
    line = (
        f"  CPU per 1000 output tokens: master {cpu['master']:.0f} + worker {cpu['worker']:.0f} + agent "
        f"{cpu['agent']:.0f} = {cpu['server']:.0f} ms (client {cpu['client']:.0f} ms)"
    )
    if eng:
        line += (
            f"; in-process engine {eng['cpu_ms_per_1k_tokens']:.0f} ms -> served/in-process CPU "
            f"{sat['server_cpu_over_in_process_cpu']:.2f}x"
        )
    lines.append(line)
    b1 = s["batch1"]
    for warning in s.get("warnings", []):
        lines.append(f"  WARNING: {warning}")
    lines.append(
        f"Batch 1: served TPOT {b1['served_tpot_ms']:.2f} ms (p50 {b1['served_tpot_p50_ms']:.2f}) vs engine "
        f"step {b1['engine_step_ms']:.2f} ms -> {b1['fraction_of_limit']:.3f} of the engine limit: "
        f"{b1['overhead_fraction']:.1%} of each token's time is serving overhead "
        f"(the engine loop's own ITL, from the master's log: {fmt(b1['engine_itl_ms'], '.2f')} ms; the "
        f"limit's median batch-1 round: {fmt(b1.get('engine_step_median_ms'), '.2f')} ms)"
    )
    if b1.get("paired"):
        lines.append(
            f"  against batch-1 steps probed right before and after the run "
            f"({'/'.join(f'{x:.2f}' for x in b1['paired']['probe_step_ms'])} ms): "
            f"{b1['paired']['fraction_of_limit']:.3f} of the engine limit"
        )
    cpu = b1["cpu_ms_per_1k_tokens"]
    if b1.get("engine_step_cpu_ms"):
        lines.append(
            f"  CPU per token: master {cpu['master'] / 1000:.2f} + worker {cpu['worker'] / 1000:.2f} + agent "
            f"{cpu['agent'] / 1000:.2f} = {cpu['server'] / 1000:.2f} ms vs {b1['engine_step_cpu_ms']:.2f} ms "
            f"per batch-1 step in-process ({b1['server_cpu_over_engine_cpu']:.2f}x)"
        )
    return "\n".join(lines)
