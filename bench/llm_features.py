"""What the OpenAI features cost: structured output and n choices, on the bundled tiny LLaMA graphs, in-process (the
engine with its scheduler, sampler and grammar engine; no serving layers), each compared with the same work without
the feature in alternated rounds of the same run.

    .venv/bin/python bench/llm_features.py                  # about 2-4 minutes
    .venv/bin/python bench/llm_features.py --quick          # about a minute
    .venv/bin/python bench/llm_features.py --requests 64 --rounds 3 --out /tmp/features.json

1. Structured output: a saturating run of --requests sampled requests (temperature 0.8, seeded, prompts of
   data/kjv_narrative.txt), all plain, against the same requests where every other one carries a JSON schema
   (compact JSON, bounded lengths). Output tokens/s of the run, and TPOT (mean (last - first token) / (tokens - 1))
   of the plain and the constrained requests.
2. The grammar engine alone: the CPU time of computing the token masks of a batch of matchers for one step and of
   feeding each matcher its token, along valid outputs of the schema, at batches 1, 8 and 16.
3. n=4 against 4 separate requests: --requests / 4 prompts, each asked once with n=4 and, in the other round, as 4
   requests; output tokens/s, prompt tokens computed and the most KV blocks held at once. This part runs on an
   engine without prefix caching, so that it measures what the fork shares (with prefix caching, separate requests
   of one prompt admitted in different steps share its full blocks too).

Prints a table and writes JSON (default bench/results/llm_features.json).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH)

from llm.workload import PromptSource  # noqa: E402  (bench/llm/workload.py)
from llm_engine import bind_like_agent, load_runner  # noqa: E402  (bench/llm_engine.py)
from run_output import write_report  # noqa: E402  (bench/run_output.py)

from mindspore_serving.llm import LLMEngine, SchedulerConfig  # noqa: E402
from mindspore_serving.llm.sampling_params import StructuredOutput  # noqa: E402
from mindspore_serving.llm.structured_output import BitmaskComputer, GrammarCompiler, allowed_tokens  # noqa: E402
from mindspore_serving.models.llama.tokenizer import TextTokenizer  # noqa: E402
from mindspore_serving.spec.llm_config import load_serving_config  # noqa: E402

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "tags"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 6},
    },
}
MAX_NEW_TOKENS = 64
TEMPERATURE = 0.8


def prompts(source: PromptSource, count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [source.prompt(rng, int(rng.integers(8, 64)))[0] for _ in range(count)]


class Run:
    """One engine run to completion: per request its tokens and token times, and the step statistics."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.prefill_tokens = 0
        self.peak_blocks = 0
        usable = engine.core.scheduler.block_manager.num_usable_blocks
        engine.add_step_listener(self._listen)
        self._usable = usable
        self.listening = False

    def _listen(self, stats) -> None:
        if self.listening:
            self.prefill_tokens += stats.num_prefill_tokens
            self.peak_blocks = max(self.peak_blocks, self._usable - stats.num_free_blocks)

    def go(self, requests: list[dict]) -> dict:
        """`requests`: dicts of add_request keyword arguments. Returns the run's figures."""
        self.prefill_tokens = self.peak_blocks = 0
        self.listening = True
        ids = {self.engine.add_request(**r): i for i, r in enumerate(requests)}
        times: dict[tuple, list[float]] = {}
        started = time.perf_counter()
        tokens = 0
        while self.engine.has_unfinished():
            for out in self.engine.step():
                now = time.perf_counter()
                key = (ids[out.request_id], out.index)
                times.setdefault(key, []).extend([now] * len(out.new_token_ids))
                tokens += len(out.new_token_ids)
        elapsed = time.perf_counter() - started
        self.listening = False
        return {
            "seconds": elapsed,
            "output_tokens": tokens,
            "tokens_per_s": tokens / elapsed,
            "prefill_tokens": self.prefill_tokens,
            "peak_kv_blocks": self.peak_blocks,
            "times": times,
        }


def tpot(times: dict[tuple, list[float]], which) -> float:
    values = [(t[-1] - t[0]) / (len(t) - 1) for key, t in times.items() if which(key[0]) and len(t) > 1]
    return float(np.mean(values)) * 1000 if values else float("nan")


def structured_rounds(run: Run, texts: list[str], rounds: int) -> dict:
    schema = {"type": "json", "value": json.dumps(SCHEMA)}
    results = {"plain": [], "schema": []}
    for _ in range(rounds):
        for mode in ("plain", "schema"):
            requests = []
            for i, text in enumerate(texts):
                params = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": TEMPERATURE, "seed": i}
                if mode == "schema" and i % 2:
                    params["structured_output"] = schema
                requests.append({"prompt": text, "params": params})
            figures = run.go(requests)
            times = figures.pop("times")
            figures["tpot_plain_ms"] = tpot(times, lambda i: i % 2 == 0)
            figures["tpot_odd_ms"] = tpot(times, lambda i: i % 2 == 1)  # the constrained half in "schema" rounds
            results[mode].append(figures)
    return results


def grammar_cpu(tokenizer, eos_id: int, batches=(1, 8, 16), seed: int = 0) -> dict:
    """CPU seconds of the grammar engine per step (the bitmasks of a batch, as the engine computes them) and per
    token (feeding it), along random valid outputs of SCHEMA."""
    compiler = GrammarCompiler.for_tokenizer(tokenizer, tokenizer.vocab_size, [eos_id])
    masks = BitmaskComputer(tokenizer.vocab_size)
    spec = StructuredOutput("json", json.dumps(SCHEMA))
    rng = np.random.default_rng(seed)
    result = {}
    try:
        for batch in batches:
            states = [compiler.new_matcher(spec) for _ in range(batch)]
            outputs: list[list[int]] = [[] for _ in states]
            masks_s = feed_s = 0.0
            steps = tokens = 0
            while True:
                live = [i for i, state in enumerate(states) if not state.is_stopped]
                if not live:
                    break
                t0 = time.process_time()
                bitmask = masks.compute([states[i] for i in live])
                t1 = time.process_time()
                for row, i in enumerate(live):
                    outputs[i].append(int(rng.choice(allowed_tokens(bitmask[row], tokenizer.vocab_size))))
                t2 = time.process_time()
                for i in live:
                    states[i].advance(outputs[i])
                t3 = time.process_time()
                masks_s += t1 - t0
                feed_s += t3 - t2
                steps += 1
                tokens += len(live)
            result[batch] = {
                "steps": steps,
                "tokens": tokens,
                "mask_ms_per_step": masks_s / steps * 1000,
                "mask_us_per_token": masks_s / tokens * 1e6,
                "feed_us_per_token": feed_s / tokens * 1e6,
            }
    finally:
        masks.close()
    return result


def choices_rounds(run: Run, texts: list[str], rounds: int, n: int = 4) -> dict:
    results = {"n": [], "separate": []}
    for _ in range(rounds):
        for mode in ("n", "separate"):
            requests = []
            for i, text in enumerate(texts):
                base = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": TEMPERATURE, "ignore_eos": True}
                if mode == "n":
                    requests.append({"prompt": text, "params": {**base, "n": n, "seed": 1000 * i}})
                else:
                    requests += [{"prompt": text, "params": {**base, "seed": 1000 * i + k}} for k in range(n)]
            figures = run.go(requests)
            figures.pop("times")
            results[mode].append(figures)
    return results


def median(rows: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in rows]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.path.join(ROOT, "config", "llama_tiny.yaml"))
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds per comparison")
    parser.add_argument("--quick", action="store_true", help="32 requests, 1 round")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "llm_features.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 32, 1
    started = time.time()
    config = load_serving_config(args.config)
    cpus = bind_like_agent(config)
    tokenizer = TextTokenizer.from_file(config.model.tokenizer)
    runner = load_runner(config)
    engine_config = config.engine  # the served scheduler: engine.max_num_seqs rows at most per step
    engine = LLMEngine(runner, tokenizer, engine_config, eos_token_id=tokenizer.eos_id, seed=0)
    run = Run(engine)
    # NOTE: a second engine on the same runner shares its KV cache; it runs only after the first is done
    choices_engine = LLMEngine(
        runner,
        tokenizer,
        SchedulerConfig(**{**engine_config.__dict__, "enable_prefix_caching": False}),
        eos_token_id=tokenizer.eos_id,
        seed=0,
    )
    source = PromptSource(config.model.tokenizer)
    texts = prompts(source, args.requests, seed=1)
    run.go([{"prompt": t, "params": {"max_new_tokens": 8}} for t in texts[:8]])  # warm-up
    report = {
        "meta": {"started": time.strftime("%Y-%m-%d %H:%M:%S")},
        "cpu_affinity": cpus,
        "requests": args.requests,
        "rounds": args.rounds,
        "schema": SCHEMA,
        "structured": structured_rounds(run, texts, args.rounds),
        "grammar_cpu": grammar_cpu(tokenizer, tokenizer.eos_id),
        "choices": choices_rounds(
            Run(choices_engine), prompts(source, max(1, args.requests // 4), seed=2), args.rounds
        ),
    }

    s = report["structured"]
    print(f"\nStructured output: {args.requests} sampled requests at once, medians of {args.rounds} alternated rounds")
    print(f"{'run':>22} {'tokens/s':>9} {'TPOT even ms':>13} {'TPOT odd ms':>12}")
    for mode, label in (("plain", "all plain"), ("schema", "odd ones with schema")):
        print(
            f"{label:>22} {median(s[mode], 'tokens_per_s'):>9.0f} {median(s[mode], 'tpot_plain_ms'):>13.2f} "
            f"{median(s[mode], 'tpot_odd_ms'):>12.2f}"
        )
    ratio = median(s["schema"], "tokens_per_s") / median(s["plain"], "tokens_per_s")
    report["schema_over_plain_tokens_per_s"] = ratio
    print(f"tokens/s with schemas / without: {ratio:.2f}")
    print("\nGrammar engine CPU (llguidance), along valid outputs of the schema")
    print(f"{'batch':>6} {'mask ms/step':>13} {'mask us/token':>14} {'feed us/token':>14}")
    for batch, row in report["grammar_cpu"].items():
        print(
            f"{batch:>6} {row['mask_ms_per_step']:>13.3f} {row['mask_us_per_token']:>14.1f} "
            f"{row['feed_us_per_token']:>14.1f}"
        )
    c = report["choices"]
    print(
        f"\nn=4 against 4 separate requests ({max(1, args.requests // 4)} prompts, {MAX_NEW_TOKENS} tokens each "
        f"choice, no prefix caching)"
    )
    print(f"{'run':>12} {'tokens/s':>9} {'prompt tokens computed':>23} {'peak KV blocks':>15}")
    for mode in ("n", "separate"):
        print(
            f"{mode:>12} {median(c[mode], 'tokens_per_s'):>9.0f} {median(c[mode], 'prefill_tokens'):>23.0f} "
            f"{median(c[mode], 'peak_kv_blocks'):>15.0f}"
        )
    write_report(report, started, args.out, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
