"""LLM engine benchmark on the bundled tiny LLaMA graphs, in-process (no serving layers).

(a) Engine limit: decode steps of B one-token rows, the graphs called back to back, for B in `limit_batches`
    (the powers of two below the config's engine.max_num_seqs, and max_num_seqs); tokens/s = B / step time.
(b) The engine with its scheduler on a workload of 64 requests with mixed prompt and output lengths
    (ignore_eos, fixed seed), continuous against static batching: output tokens/s, mean decode batch
    occupancy, and served throughput as a fraction of the engine limit at the same occupancy (the step time
    interpolated linearly between the two measured batches around it: the graphs take any batch, unpadded).

    python bench/llm_engine.py [--requests 64] [--steps 30] [--out bench/results/llm_engine.json]

With --tensor_parallel N (bench/llm/tensor_parallel.py) it measures instead, in one run, TP=1 against TP=N: decode
step time at batch 1, 8 and 16 through agents for both (and in-process TP=1 for reference), the AllReduce share of a
TP=N step (microbenchmark estimate), KV-cache bytes and agent RSS per rank:

    python bench/llm_engine.py --tensor_parallel 2 [--rounds 5] [--steps 20] [--out bench/results/llm_engine_tp.json]

With --speculative (bench/llm/speculative.py) it measures n-gram speculative decoding against plain decoding on the
graphs of config/llama_tiny_spec.yaml, alternated rounds: an "edit this passage" workload and the mixed one above, at
batch 1 (tokens/s, TPOT) and at saturation (tokens/s), with the acceptance rate and mean accepted length:

    python bench/llm_engine.py --speculative [--rounds 3] [--edit_requests 8] [--out bench/results/llm_engine_spec.json]

With --detokenize (bench/llm/detokenize.py) it measures, without the graphs, the detokenizer's CPU time per token:
DecodeStream (a `tokenizers.Tokenizer`) against the window decode (any other tokenizer), with and without stop strings:

    python bench/llm_engine.py --detokenize [--rounds 5] [--requests 64] [--detok_tokens 128] \
        [--out bench/results/llm_engine_detok.json]
"""

import argparse
import bisect
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, ROOT)

from mindspore_serving.common.cpu_affinity import bind_process  # noqa: E402
from mindspore_serving.llm import LLMEngine, SchedulerConfig  # noqa: E402
from mindspore_serving.llm.model_io import SeqStep  # noqa: E402
from mindspore_serving.llm.step_report import StepCounters  # noqa: E402
from mindspore_serving.spec.llm_config import load_serving_config  # noqa: E402

OUTPUT_TOKENS = (4, 160)
DEFAULT_CONFIG = os.path.join(ROOT, "config", "llama_tiny.yaml")


def bind_like_agent(config):
    """Binds this process to the cores the config's rank-0 agent binds to (agents.cpu_affinity; before MindSpore
    starts its threads), so that in-process figures compare with served ones; returns the cores or None."""
    return bind_process(config.agents.cpus_of(0, "CPU"))


def load_runner(config):
    """The config's first graphs on CPU in GRAPH_MODE, with the served number of cache blocks and, as the agent,
    at most engine.max_num_batched_tokens tokens per graph call."""
    from mindspore_serving.agent.graph_runner import GraphRunner
    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    return GraphRunner(
        config.model.graphs[0],
        num_blocks=config.engine.num_blocks,
        max_num_tokens=config.engine.max_num_batched_tokens,
    )


def limit_batches(max_num_seqs: int) -> list[int]:
    """The decode batches the engine limit is measured at: the powers of two below `max_num_seqs`, and
    `max_num_seqs` (the most rows a decode step has)."""
    batches, batch = [], 1
    while batch < max_num_seqs:
        batches.append(batch)
        batch *= 2
    return batches + [max_num_seqs]


def limit_seqs(batch: int, blocks_per_seq: int = 4):
    """The decode rows the engine limit times: `batch` one-token rows at position 40, each with its own blocks."""
    return [SeqStep([5], 40, list(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq))) for i in range(batch)]


def step_seconds(runner, seqs, steps: int) -> float:
    """The mean wall time of `steps` calls of the graphs on `seqs`, back to back."""
    started = time.perf_counter()
    for _ in range(steps):
        runner.run(seqs)
    return (time.perf_counter() - started) / steps


def engine_limit(runner, steps: int, batches: list[int]):
    """The time of a decode step of B one-token rows for each B of `batches` (limit_batches)."""
    limit = {}
    for batch in batches:
        seqs = limit_seqs(batch)
        runner.run(seqs)  # warm
        # the best of three rounds: the machine is shared, noise only adds time
        rounds = [step_seconds(runner, seqs, steps) for _ in range(3)]
        step = min(rounds)
        limit[batch] = {
            "step_ms": step * 1000,
            "tokens_per_s": batch / step,
            "median_step_ms": float(np.median(rounds)) * 1000,
        }
    return limit


def output_tokens(rng: np.random.Generator) -> int:
    """An output length, log-uniform in OUTPUT_TOKENS (a long tail, as in chat traffic)."""
    return int(np.exp(rng.uniform(np.log(OUTPUT_TOKENS[0]), np.log(OUTPUT_TOKENS[1]))))


def workload(count: int, vocab: int, max_model_len: int, seed: int = 0):
    """Prompts of 4-95 tokens of random ids; output lengths from output_tokens."""
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(count):
        prompt_len = int(rng.integers(4, 96))
        new_tokens = min(output_tokens(rng), max_model_len - prompt_len)
        requests.append(([int(t) for t in rng.integers(3, vocab, prompt_len)], new_tokens))
    return requests


def run_engine(runner, config, requests):
    engine = LLMEngine(runner, scheduler_config=config)
    counters, decode_only = StepCounters(), []  # occupancy counted as the worker's statistics lines count it

    def listen(stats):
        counters.add(stats)
        if stats.num_decode_seqs and not stats.num_prefill_seqs:
            decode_only.append(
                (stats.num_new_tokens, stats.schedule_s + stats.execute_s + stats.update_s, stats.num_model_steps)
            )

    engine.add_step_listener(listen)
    for prompt, n in requests:
        engine.add_request(
            prompt_token_ids=prompt, params={"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}
        )
    started = time.perf_counter()
    tokens = steps = 0
    while engine.has_unfinished():
        steps += 1
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    elapsed = time.perf_counter() - started
    decode_tokens = sum(t for t, _, _ in decode_only)
    decode_seconds = sum(s for _, s, _ in decode_only)
    decode_steps = sum(n for _, _, n in decode_only)
    return {
        "seconds": elapsed,
        "output_tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "steps": steps,
        "mean_decode_batch": counters.mean_decode_batch,
        "decode_only_steps": decode_steps,
        "decode_only_mean_batch": decode_tokens / max(1, decode_steps),
        "decode_only_tokens_per_s": decode_tokens / decode_seconds if decode_seconds else 0.0,
    }


def step_ms_at(step_ms: dict, occupancy: float) -> tuple[float, list[int]]:
    """The decode step time at a mean decode batch of `occupancy`, from `step_ms` (measured batch -> ms; the
    batches as ints or, read back from JSON, as strings): linear between the two measured batches around it (a
    step computes its rows unpadded, and its time grows about linearly between them), held at the smallest and
    largest. Returns it and the measured batches it comes from (one when `occupancy` is one of them or outside)."""
    points = sorted((int(batch), float(ms)) for batch, ms in step_ms.items())
    batches = [batch for batch, _ in points]
    i = bisect.bisect_left(batches, occupancy)
    if i == len(points):
        return points[-1][1], [batches[-1]]
    if i == 0 or batches[i] == occupancy:
        return points[i][1], [batches[i]]
    (b0, ms0), (b1, ms1) = points[i - 1], points[i]
    return ms0 + (ms1 - ms0) * (occupancy - b0) / (b1 - b0), [b0, b1]


def limit_at(limit: dict, occupancy: float) -> float:
    """Engine-limit tokens/s at a mean decode batch of `occupancy`: occupancy / its step time (step_ms_at)."""
    ms, _ = step_ms_at({batch: row["step_ms"] for batch, row in limit.items()}, occupancy)
    return occupancy / (ms / 1000)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="timed decode steps per round and batch for the limit")
    parser.add_argument(
        "--out", default=None, help="default bench/results/llm_engine.json, with --tensor_parallel llm_engine_tp.json"
    )
    parser.add_argument(
        "--no-bind",
        action="store_true",
        help="do not bind to the cores of the config's agents.cpu_affinity (default: bind, as the agent)",
    )
    tp = parser.add_argument_group("tensor parallelism (--tensor_parallel N)")
    tp.add_argument(
        "--tensor_parallel",
        type=int,
        default=1,
        metavar="N",
        help="compare TP=1 (--config) with TP=N (--tp_config) through agents instead of the engine run",
    )
    tp.add_argument(
        "--tp_config", default=None, help="config of the TP=N servable (default for N=2: config/llama_tiny_tp2.yaml)"
    )
    tp.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of --steps decode steps per setup and batch (default 5); with --speculative, "
        "alternated rounds of both setups (default 3)",
    )
    tp.add_argument("--context", type=int, default=64, help="prompt tokens prefilled before the decode steps")
    tp.add_argument("--allreduce_calls", type=int, default=200, help="timed calls per round of the AllReduce graph")
    spec = parser.add_argument_group("speculative decoding (--speculative)")
    spec.add_argument(
        "--speculative",
        action="store_true",
        help="compare n-gram speculative decoding with plain decoding (--config default: config/llama_tiny_spec.yaml)",
    )
    spec.add_argument(
        "--edit_requests",
        type=int,
        default=8,
        help="requests of the edit workload (and of the mixed workload's batch-1 runs)",
    )
    detok = parser.add_argument_group("detokenization CPU per token (--detokenize)")
    detok.add_argument(
        "--detokenize",
        action="store_true",
        help="measure the detokenizer's CPU per token, DecodeStream against the window decode (no graphs)",
    )
    detok.add_argument("--detok_tokens", type=int, default=128, help="output tokens per request")
    args = parser.parse_args()
    if args.detokenize:
        return main_detokenize(args)
    if args.speculative:
        sys.path.insert(0, BENCH)
        from llm.speculative import main_speculative  # bench/llm/speculative.py; loaded only for this mode

        if args.config == DEFAULT_CONFIG:
            args.config = os.path.join(ROOT, "config", "llama_tiny_spec.yaml")
        args.rounds = args.rounds or 3
        args.out = args.out or os.path.join(ROOT, "bench", "results", "llm_engine_spec.json")
        return main_speculative(args, load_runner, bind_like_agent, workload)
    args.rounds = args.rounds or 5
    if args.tensor_parallel != 1:
        return main_tensor_parallel(args)
    args.out = args.out or os.path.join(ROOT, "bench", "results", "llm_engine.json")
    config = load_serving_config(args.config)
    cpus = None if args.no_bind else bind_like_agent(config)

    runner = load_runner(config)
    limit = engine_limit(runner, args.steps, limit_batches(config.engine.max_num_seqs))
    requests = workload(args.requests, runner.vocab_size, config.engine.max_model_len)
    results = {
        "cpu_affinity": cpus,
        "engine_limit": limit,
        "workload": {"requests": args.requests, "output_tokens": sum(n for _, n in requests)},
    }
    # each strategy with one decode step per scheduling round, and with the config's multi-step rounds
    step_counts = sorted({1, config.engine.num_scheduler_steps})
    names = []
    for steps in step_counts:
        for strategy in ("continuous", "static"):
            sched = SchedulerConfig(**{**config.engine.__dict__, "batching": strategy, "num_scheduler_steps": steps})
            run = run_engine(runner, sched, requests)
            run["num_scheduler_steps"] = steps
            run["limit_at_occupancy"] = limit_at(limit, run["mean_decode_batch"])
            run["fraction_of_limit"] = run["tokens_per_s"] / run["limit_at_occupancy"]
            decode_limit = limit_at(limit, run["decode_only_mean_batch"]) if run["decode_only_steps"] else 0.0
            run["decode_fraction_of_limit"] = run["decode_only_tokens_per_s"] / decode_limit if decode_limit else 0.0
            name = strategy if steps == 1 else f"{strategy} x{steps}"
            results[name] = run
            names.append(name)
        suffix = "" if steps == 1 else f" x{steps}"
        results["continuous_over_static" + suffix.replace(" ", "_")] = (
            results["continuous" + suffix]["tokens_per_s"] / results["static" + suffix]["tokens_per_s"]
        )

    print("\nEngine limit (decode steps of `batch` one-token rows, graphs back to back)")
    print(f"{'batch':>6} {'step ms':>9} {'tokens/s':>10}")
    for batch, row in limit.items():
        print(f"{batch:>6} {row['step_ms']:>9.2f} {row['tokens_per_s']:>10.0f}")
    print(f"\nEngine with scheduler, {args.requests} requests, {results['workload']['output_tokens']} output tokens")
    print(
        f"{'strategy':>14} {'seconds':>8} {'tokens/s':>9} {'mean batch':>10} {'limit@batch':>11} {'fraction':>8} "
        f"{'decode-step fraction':>20}"
    )
    for name in names:
        r = results[name]
        print(
            f"{name:>14} {r['seconds']:>8.2f} {r['tokens_per_s']:>9.0f} {r['mean_decode_batch']:>10.1f} "
            f"{r['limit_at_occupancy']:>11.0f} {r['fraction_of_limit']:>8.2f} {r['decode_fraction_of_limit']:>20.2f}"
        )
    print(
        "fraction: served tokens/s over the engine limit at the same mean decode batch (step time interpolated "
        "between the measured batches; prefill time included);\n"
        "decode-step fraction: the same over decode-only steps (what the scheduler and sampler cost per step);\n"
        "xN: N decode steps per scheduling round when the batch allows (engine.num_scheduler_steps)"
    )
    for key in (k for k in results if k.startswith("continuous_over_static")):
        label = key[len("continuous_over_static") :].replace("_", " ")
        print(f"continuous / static throughput{label}: {results[key]:.2f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as stream:
        json.dump(results, stream, indent=1)
    print(f"wrote {args.out}")


def main_detokenize(args):
    sys.path.insert(0, BENCH)
    from llm import detokenize  # bench/llm/detokenize.py; loaded only for this mode

    results = detokenize.run(args.requests, args.detok_tokens, args.rounds or 5)
    detokenize.report(results)
    out = args.out or os.path.join(ROOT, "bench", "results", "llm_engine_detok.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as stream:
        json.dump(results, stream, indent=1)
    print(f"wrote {out}")


def main_tensor_parallel(args):
    sys.path.insert(0, BENCH)
    from llm import tensor_parallel  # bench/llm/tensor_parallel.py; loaded only for this mode

    tp_config = args.tp_config
    if tp_config is None:
        if args.tensor_parallel != 2:
            sys.exit("--tp_config is needed for --tensor_parallel other than 2")
        tp_config = os.path.join(ROOT, "config", "llama_tiny_tp2.yaml")
    declared = load_serving_config(tp_config).model.tensor_parallel
    if declared != args.tensor_parallel:
        sys.exit(f"{tp_config} has tensor_parallel {declared}, not {args.tensor_parallel}")
    results = tensor_parallel.run(args.config, tp_config, args.rounds, args.steps, args.context, args.allreduce_calls)
    tensor_parallel.report(results)
    out = args.out or os.path.join(ROOT, "bench", "results", "llm_engine_tp.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as stream:
        json.dump(results, stream, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
