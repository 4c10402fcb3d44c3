"""The served runs in order, on one HTTP session: warm-up, c=1, the engine limit, the saturating runs (each followed
by its requests through the in-process engine), the Poisson rates, and the profiled runs; each run measured (CPU,
threads, other processes, engine logs, probes) into a row of the report."""

import asyncio
import math

import numpy as np
from run_output import log  # bench/run_output.py

from .client import new_session, run_closed, run_poisson
from .cpu import Cpu
from .engine_child import EngineMeasures
from .engine_log import engine_steps, engine_timings, engine_totals
from .metrics import saturated_window, summarise
from .profiling import profiled_runs
from .report import fmt
from .server import LlmServer


async def serve_runs(args, server: LlmServer, workloads: dict, cpu: Cpu, report: dict, engine: EngineMeasures):
    url = f"http://{server.rest}/v1/completions"
    runs = report["runs"]

    async with new_session() as session:

        async def measure(name, coro_factory, extra=None, wait_quiet=True, bracket=False):
            quiet = cpu.wait_quiet(args.quiet_wait) if wait_quiet else -1.0
            probe_before = await asyncio.to_thread(engine.probe) if bracket else None
            before = cpu.processes()
            threads0 = cpu.thread_cpu()
            totals0 = engine_totals(server.worker_logs())
            c0 = cpu.snapshot()
            records, started = await coro_factory()
            c1 = cpu.snapshot()
            threads1 = cpu.thread_cpu()
            probe_after = await asyncio.to_thread(engine.probe) if bracket else None
            cpu.learn_thread_names()  # threads started during the run (gRPC handlers) get their names too
            threads0 = {k: (cpu.names.get(k[1], v[0]), v[1]) for k, v in threads0.items()}
            threads1 = {k: (cpu.names.get(k[1], v[0]), v[1]) for k, v in threads1.items()}
            others = cpu.top_others(before, c1["t"] - c0["t"])
            await asyncio.sleep(0.3)  # the master logs each request when its stream is closed
            row = summarise(name, records, started, c0, c1, engine_timings(server.output()), extra)
            row["thread_cpu_ms_per_1k_tokens"] = cpu.thread_use(threads0, threads1, row["output_tokens"])
            row["other_cores_before"] = round(quiet, 3)
            row["engine_steps"] = engine_steps(totals0, engine_totals(server.worker_logs()))
            if bracket:
                row["probes"] = [probe_before, probe_after]
            row["top_other_processes"] = others
            runs.append(row)
            log(
                f"{name}: {row['ok']}/{row['requests']} ok, {row['req_per_s']:.2f} req/s, "
                f"{row['output_tokens_per_s']:.0f} tok/s, occupancy {row['mean_occupancy']:.2f}, TTFT p50 "
                f"{fmt(row['ttft_ms']['p50'])} ms, TPOT mean {fmt(row['tpot_ms']['mean'], '.2f')} ms, "
                f"CPU m/w/a/c {row['cpu_cores']}, other {row['other_cores']}"
            )
            if row["failed"]:
                log(f"  errors: {row['errors']}")
            return row, records, started

        log("warm-up")
        warm = workloads["warm"]
        await run_closed(session, url, warm, len(warm))
        await run_closed(session, url, warm[:2], 1)
        cpu.learn_thread_names()

        c1_items = workloads["c1"]
        await measure("c=1", lambda: run_closed(session, url, c1_items, 1), bracket=True)

        await asyncio.to_thread(engine.limit)  # the server is idle meanwhile

        rates = []
        for k, (sat_items, workload_path) in enumerate(workloads["saturation"]):
            name = "saturation" if args.saturation_runs == 1 else f"saturation #{k + 1}"
            sat, sat_records, sat_started = await measure(
                name,
                lambda sat_items=sat_items: run_closed(session, url, sat_items, len(sat_items)),
                {"mode": f"all {len(sat_items)} requests at once", "saturation": True},
                bracket=True,
            )
            sat["full_window"] = saturated_window(sat_records, sat_started)
            # right after it, the same requests through the engine in-process, bracketed the same way
            sat["engine_run"] = await asyncio.to_thread(engine.run, workload_path, sat["probes"][1])
            rates.append(sat["req_per_s"])
        saturated_rate = float(np.median(rates))

        for k, (kind, value) in enumerate(args.rates):
            rate = value * saturated_rate if kind == "x" else value
            items = workloads["poisson"][k]
            items = items[: max(16, min(len(items), int(math.ceil(rate * args.poisson_seconds))))]
            label = f"poisson {value:g}x" if kind == "x" else f"poisson {value:g}/s"
            await measure(
                label,
                lambda items=items, rate=rate, seed=args.seed + 100 + k: run_poisson(session, url, items, rate, seed),
                {"mode": "poisson", "rate_req_per_s": round(rate, 3)},
            )

        if not args.quick:
            await asyncio.to_thread(engine.limit)

        if args.profile:
            report["profile"] = await profiled_runs(measure, session, url, cpu, workloads, args, runs)
