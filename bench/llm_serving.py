"""LLM serving benchmark: the bundled tiny LLaMA served over HTTP (OpenAI `/v1/completions`, SSE streams), driven by
a Poisson-arrival client, against the engine limit of its own graphs measured in the same run.

    .venv/bin/python bench/llm_serving.py              # 3-5 minutes (longer when the machine is busy)
    .venv/bin/python bench/llm_serving.py --quick      # about 70-85 s
    .venv/bin/python bench/llm_serving.py --requests 96 --rates 0.5x,4 --out /tmp/x.json
    .venv/bin/python bench/llm_serving.py --quick --rates "" --profile /tmp/llm_profile   # + py-spy profiles

What it does, all on 127.0.0.1, every process started (and killed at the end, even on error) by this script:
1. starts `serving_server.py` with the tiny LLM (config/llama_tiny.yaml with absolute paths, agents started by the
   worker on free ports, GLOG_v=1) and warms it up;
2. runs, each on its own fixed-seed workload of mixed prompt lengths (text windows of data/kjv_narrative.txt cut at
   token boundaries to 4-96 tokens) and output lengths (log-uniform 4-160 tokens; `ignore_eos`, `temperature` 0):
   - `c=1`: requests one after another with 64 output tokens each: the per-token overhead at batch 1;
   - `saturation`: every request sent at once (the engine runs max_num_seqs, the rest queue); repeated
     (--saturation-runs), each time with other prompts (a repeated prompt would hit the prefix cache), each run
     bracketed by engine-limit probes and followed by the same requests through the engine in-process;
   - `poisson`: open-loop Poisson arrivals at --rates (`0.5x` = half the saturated request rate, or req/s), at most
     rate x --poisson-seconds requests each;
   before each run it waits (at most --quiet-wait s) for the other processes on the machine to calm down;
3. the engine, in one subprocess started once (its own MindSpore process, bound like the agent, the same graphs,
   num_blocks and tokens per graph call), idle while the server is measured:
   - the engine limit, `bench/llm_engine.py`'s `engine_limit(runner, steps, batches)`: decode steps of B one-token
     rows for B in `limit_batches(max_num_seqs)` (1, 2, 4, ... and max_num_seqs), best of 3 rounds per batch,
     after the c=1 run and, in a full run, again after the Poisson runs: the best step time per batch over the
     whole benchmark, the machine's quietest moment;
   - probes: the mean step time of `steps` decode steps back to back per batch, right before and right after
     the c=1 run and each saturating run: the limit at the moment of that run (on a shared machine the same
     graph's step time moves by a third between minutes, so a run is compared with its own moment);
   - the saturating run's requests through the engine in-process (`llm_engine.run_engine`, no serving layers)
     right after each saturating run, probed after it as well;
4. per run: request throughput, output tokens/s, TTFT, TPOT (per request (e2e - ttft) / (n - 1)), ITL (every gap
   between two SSE token events), e2e latency (mean, p50, p90, p99), the mean decode batch occupancy (client side:
   time-average of the requests between their first and last token; the engine logs no step statistics), the
   engine's own TTFT/ITL per request (the master's INFO line of each request), and the CPU time of the master, the
   worker, the agent and this client per 1000 output tokens, also per thread (Python thread names from py-spy dump);
5. the saturated output tokens/s as a fraction of the engine limit at the same mean occupancy (occupancy / step time
   at that occupancy, interpolated between the two measured batches around it, as llm_engine.limit_at: the graphs
   compute any batch unpadded): per saturating run against its probes (the median over the runs is the figure
   the target applies to), and the best run against the best round; the same for the in-process engine, and
   served over in-process run by run; at batch 1 the engine's batch-1 step time over the served TPOT;
6. prints a table and writes JSON (default bench/results/llm_serving.json; --quick: llm_serving_quick.json);
   with --profile DIR, one more saturating run and c=1 run under py-spy: the wall-time states of the worker's
   engine thread and of the agent (py-spy record --idle) and the master's on-CPU profile, in DIR/summary.txt.

The machine's cores are shared by the client, the master, the worker and the agent (and whatever else runs): the
JSON records the CPU used by other processes during each run ("other_cores", "top_other_processes").
"""

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, BENCH)

from llm.cpu import Cpu  # noqa: E402  (bench/llm/)
from llm.engine_child import EngineMeasures, EngineProcess, engine_child, kill_children, raise_exit  # noqa: E402
from llm.report import new_report, table  # noqa: E402
from llm.runs import serve_runs  # noqa: E402
from llm.server import LlmServer  # noqa: E402
from llm.summary import summary  # noqa: E402
from llm.workload import PromptSource  # noqa: E402
from llm.workload import workloads as make_workloads  # noqa: E402  (bench/llm/)
from run_output import log, write_report  # noqa: E402  (bench/run_output.py)

DEFAULT_OUT = os.path.join(BENCH, "results", "llm_serving.json")
QUICK_OUT = os.path.join(BENCH, "results", "llm_serving_quick.json")


def parse_rates(text: str) -> list[tuple[str, float]]:
    rates = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        rates.append(("x", float(part[:-1])) if part.endswith("x") else ("abs", float(part)))
    return rates


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and rates: about 70-85 s")
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per saturation/Poisson run (default 96; --quick 32)"
    )
    parser.add_argument(
        "--rates",
        default=None,
        help="Poisson rates, comma-separated: '0.5x' = a fraction of the saturated request rate, "
        "a plain number = req/s (default 0.3x,0.6x,0.9x; --quick 0.6x)",
    )
    parser.add_argument(
        "--poisson-seconds",
        type=float,
        default=None,
        help="a Poisson run sends at most rate x this many requests (at least 16), which bounds its "
        "time when the machine is slow (default 40; --quick 12)",
    )
    parser.add_argument(
        "--saturation-runs",
        type=int,
        default=None,
        help="saturating runs, each probed before and after and followed by an in-process engine "
        "run; the median of their fractions counts (default 3; --quick 1)",
    )
    parser.add_argument("--c1-requests", type=int, default=None, help="requests of the c=1 run (default 8; --quick 4)")
    parser.add_argument(
        "--limit-steps",
        type=int,
        default=None,
        help="timed decode steps per round and batch for the engine limit and per batch for a probe "
        "(default 20; --quick 10)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override an engine field of the served config (a YAML value), e.g. "
        "--engine async_scheduling=false; repeatable. --engine "
        "speculative='{num_speculative_tokens: 4}' serves config/llama_tiny_spec.yaml with it (the same "
        "step graphs as llama_tiny.yaml: speculation needs no graphs of its own)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help=f"JSON path (default {os.path.relpath(DEFAULT_OUT, ROOT)}; --quick: {os.path.relpath(QUICK_OUT, ROOT)})",
    )
    parser.add_argument(
        "--profile",
        default="",
        metavar="DIR",
        help="after the measured runs, one more saturating run under py-spy (master, worker, agent); "
        "raw files and summary.txt go to DIR",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the server's working directory")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="before each run, wait up to this many seconds for other processes to use < 0.3 cores "
        "(default 8; --quick 3)",
    )
    parser.add_argument(
        "--cpu-affinity",
        choices=("config", "auto", "none"),
        default="config",
        help="agents.cpu_affinity of the served config (and of the engine limit's process): as in "
        "config/llama_tiny.yaml, auto, or none (unbound)",
    )
    parser.add_argument("--engine-child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.requests = args.requests or (32 if args.quick else 96)
    args.rates = parse_rates(args.rates if args.rates is not None else ("0.6x" if args.quick else "0.3x,0.6x,0.9x"))
    args.poisson_seconds = args.poisson_seconds or (12.0 if args.quick else 40.0)
    args.saturation_runs = max(1, args.saturation_runs or (1 if args.quick else 3))
    args.c1_requests = args.c1_requests if args.c1_requests is not None else (4 if args.quick else 8)
    args.limit_steps = args.limit_steps or (10 if args.quick else 20)
    args.out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    args.quiet_wait = args.quiet_wait if args.quiet_wait is not None else (3.0 if args.quick else 8.0)
    return args


def engine_overrides(items: list[str]) -> dict[str, object]:
    """--engine FIELD=VALUE items as {field: YAML value}."""
    import yaml

    overrides = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--engine takes FIELD=VALUE, got {item!r}")
        overrides[name.strip()] = yaml.safe_load(value)
    return overrides


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.engine_child:
        engine_child(args.engine_child)
        return 0
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, raise_exit)
    started = time.time()
    workdir = tempfile.mkdtemp(prefix="ms_bench_llm_")
    agents = {} if args.cpu_affinity == "config" else {"cpu_affinity": None if args.cpu_affinity == "none" else "auto"}
    server = LlmServer(workdir, engine_overrides(args.engine), agents)
    from mindspore_serving.spec.llm_config import load_serving_config

    config = load_serving_config(server.config)
    report = new_report(args, config)
    source = PromptSource(config.model.tokenizer)
    workloads = make_workloads(source, args, config.engine.max_model_len, workdir)
    report["meta"]["saturation_output_tokens"] = [
        sum(item.max_tokens for item in items) for items, _ in workloads["saturation"]
    ]

    try:
        log("starting the server")
        t0 = time.time()
        server.start()
        log(f"server ready in {time.time() - t0:.1f} s at {server.rest}")
        cpu = Cpu(server.processes[0])
        with contextlib.suppress(ImportError):
            import uvloop  # the client's own CPU use matters on a 2-core machine

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        log("starting the engine subprocess (the served graphs, bound like the agent)")
        process = EngineProcess(server.config)
        engine = EngineMeasures(process, report, args.limit_steps)
        asyncio.run(serve_runs(args, server, workloads, cpu, report, engine))
        process.close()
    finally:
        kill_children()
        try:
            server.stop()
        except Exception as err:
            log(f"stopping the server failed: {err}")
        if args.keep_logs:
            log(f"server logs: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    report["summary"] = summary(report)
    write_report(report, started, args.out, indent=1)
    print()
    print(table(report))
    if report.get("profile"):
        print("\nProfile of a saturated run\n" + report["profile"]["summary"])
    log(f"wrote {args.out} in {report['meta']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
