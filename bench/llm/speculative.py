"""N-gram speculative decoding against plain decoding, in one run (bench/llm_engine.py --speculative).

The engine in-process over the graphs of config/llama_tiny_spec.yaml (the tiny model's step graphs, the same as
llama_tiny.yaml's: proposed tokens are verified in the step that computes them, no graphs of their own), bound
like its agent, with that config's engine settings (multi-step rounds of 4 for plain steps, speculation off
from disable_by_batch_size running requests); "plain" is the same engine with `speculative` None. Rounds alternate
plain and speculative so that the machine's drift hits both alike; each figure is the median over rounds, and each
ratio the median of the rounds' ratios.

Two workloads, greedy, ignore_eos:
(a) edit: "rewrite this passage" prompts whose output largely repeats the prompt. The tiny model cannot be asked
    to copy, so each passage is its own text: a verse start from data/kjv_narrative.txt, the model's greedy
    continuation of it (made with the plain engine when the benchmark starts), a newline, and the verse start
    again; the output is asked for as many tokens as the passage's continuation. Where the model agrees with its
    earlier self, the prompt holds the tokens it writes.
(b) mixed: bench/llm_engine.py's workload (random-token prompts of 4-95 tokens, log-uniform 4-160 output tokens).

Per workload: batch 1 (its requests one after another: output tokens/s and TPOT, the mean time between a request's
tokens) and saturation (all requests at once: output tokens/s), with speculation's acceptance rate (accepted of
proposed tokens) and mean accepted length (tokens per verifying row and step: accepted + 1). Targets: >= 1.5x
batch-1 tokens/s on (a); >= 0.97x saturation tokens/s on (b).
"""

import dataclasses
import json
import os
import time

import numpy as np

from mindspore_serving.llm import LLMEngine, SamplingParams
from mindspore_serving.llm.step_report import StepCounters
from mindspore_serving.models.llama.tokenizer import TextTokenizer
from mindspore_serving.spec.llm_config import load_serving_config

Requests = list[tuple[list[int], int]]


def edit_workload(runner, tokenizer, config, corpus: str, count: int, passage_tokens: int = 80) -> Requests:
    """(a): `count` prompts "verse start + the model's continuation + newline + verse start", each asking for as
    many tokens as the continuation (see the module docstring); verses spread over the corpus."""
    with open(corpus, encoding="utf-8") as stream:
        lines = [line for line in stream.read().splitlines() if len(line.split()) >= 6]
    engine = LLMEngine(runner, tokenizer, dataclasses.replace(config, speculative=None))
    requests = []
    for i in range(count):
        seed = " ".join(lines[(i * len(lines)) // count].split()[:6])
        passage = engine.generate(
            seed, SamplingParams(max_new_tokens=passage_tokens, temperature=0.0, ignore_eos=True)
        )[0]
        prompt = tokenizer.encode(seed + passage.text + "\n" + seed)
        requests.append((prompt, len(passage.token_ids)))
    return requests


def run(runner, config, requests: Requests, concurrent: bool) -> dict[str, float]:
    """The requests through the engine, all at once or one after another: output tokens/s, mean TPOT and
    speculation's counts."""
    engine = LLMEngine(runner, scheduler_config=config)
    counters = StepCounters()
    engine.add_step_listener(counters.add)
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for _, n in requests]
    started = time.perf_counter()
    if concurrent:
        outputs = engine.generate([prompt for prompt, _ in requests], params)
    else:
        outputs = [engine.generate([prompt], p)[0] for (prompt, _), p in zip(requests, params)]
    elapsed = time.perf_counter() - started
    tokens = sum(len(o.token_ids) for o in outputs)
    tpots = [
        (o.metrics.last_token_time - o.metrics.first_token_time) / (len(o.token_ids) - 1)
        for o in outputs
        if len(o.token_ids) > 1
    ]
    return {
        "seconds": elapsed,
        "output_tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "tpot_ms": float(np.mean(tpots)) * 1000 if tpots else 0.0,
        "drafts": counters.drafts,
        "draft_tokens": counters.draft_tokens,
        "accepted_tokens": counters.accepted_tokens,
        "acceptance_rate": counters.acceptance_rate,
        "mean_accepted_length": counters.mean_accepted_length,
    }


def main_speculative(args, load_runner, bind_like_agent, mixed_workload) -> dict:
    config = load_serving_config(args.config)
    if config.engine.speculative is None:
        raise SystemExit(
            f"{args.config} has no engine.speculative: use a config with speculative decoding "
            f"(config/llama_tiny_spec.yaml)"
        )
    cpus = None if args.no_bind else bind_like_agent(config)
    runner = load_runner(config)
    tokenizer = TextTokenizer.from_file(config.model.tokenizer)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    workloads = {
        "edit": edit_workload(
            runner, tokenizer, config.engine, os.path.join(root, "data", "kjv_narrative.txt"), args.edit_requests
        ),
        "mixed": mixed_workload(args.requests, runner.vocab_size, config.engine.max_model_len),
    }
    setups = {"speculative": config.engine, "plain": dataclasses.replace(config.engine, speculative=None)}
    # batch 1 on the mixed workload: its first requests (one after another takes long)
    cases = [
        ("edit", "batch1", workloads["edit"], False),
        ("edit", "saturation", workloads["edit"], True),
        ("mixed", "batch1", workloads["mixed"][: args.edit_requests], False),
        ("mixed", "saturation", workloads["mixed"], True),
    ]
    rounds: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        order = list(setups) if r % 2 == 0 else list(setups)[::-1]
        for workload, mode, requests, concurrent in cases:
            for name in order:
                rounds.setdefault(f"{workload}/{mode}/{name}", []).append(
                    run(runner, setups[name], requests, concurrent)
                )
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    results = {
        "config": args.config,
        "cpu_affinity": cpus,
        "rounds": args.rounds,
        "speculative": dataclasses.asdict(config.engine.speculative),
        "workloads": {
            name: {
                "requests": len(reqs),
                "prompt_tokens": sum(len(p) for p, _ in reqs),
                "output_tokens": sum(n for _, n in reqs),
            }
            for name, reqs in workloads.items()
        },
        "runs": rounds,
        "cases": {},
    }
    print(
        f"\nN-gram speculative decoding vs plain decoding, {args.rounds} alternated rounds (medians); "
        f"k={config.engine.speculative.num_speculative_tokens}, disable_by_batch_size="
        f"{config.engine.speculative.disable_by_batch_size}"
    )
    print(
        f"{'workload':>9} {'mode':>10} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} {'plain TPOT':>10} "
        f"{'spec TPOT':>9} {'accept':>7} {'mean len':>8}"
    )
    for workload, mode, _, _ in cases:
        plain, spec = rounds[f"{workload}/{mode}/plain"], rounds[f"{workload}/{mode}/speculative"]
        ratios = [s["tokens_per_s"] / p["tokens_per_s"] for s, p in zip(spec, plain)]
        case = {
            "plain_tokens_per_s": _median(plain, "tokens_per_s"),
            "spec_tokens_per_s": _median(spec, "tokens_per_s"),
            "ratio": float(np.median(ratios)),
            "ratios": ratios,
            "plain_tpot_ms": _median(plain, "tpot_ms"),
            "spec_tpot_ms": _median(spec, "tpot_ms"),
            "acceptance_rate": _median(spec, "acceptance_rate"),
            "mean_accepted_length": _median(spec, "mean_accepted_length"),
            "drafts": _median(spec, "drafts"),
        }
        results["cases"][f"{workload}/{mode}"] = case
        print(
            f"{workload:>9} {mode:>10} {case['plain_tokens_per_s']:>11.1f} {case['spec_tokens_per_s']:>10.1f} "
            f"{case['ratio']:>5.2f}x {case['plain_tpot_ms']:>8.2f}ms {case['spec_tpot_ms']:>7.2f}ms "
            f"{case['acceptance_rate']:>7.1%} {case['mean_accepted_length']:>8.2f}"
        )
    targets = {"edit/batch1": 1.5, "mixed/saturation": 0.97}
    results["targets"] = {
        case: {"target": want, "ratio": results["cases"][case]["ratio"], "met": results["cases"][case]["ratio"] >= want}
        for case, want in targets.items()
    }
    for case, row in results["targets"].items():
        print(f"target {case}: >= {row['target']}x, measured {row['ratio']:.2f}x: {'met' if row['met'] else 'MISSED'}")
    print(
        "accept: proposed tokens the model kept; mean len: tokens per verifying row and step (accepted + 1);\n"
        "TPOT: mean time between a request's tokens; saturation runs speculate only below disable_by_batch_size"
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as stream:
        json.dump(results, stream, indent=1)
    print(f"wrote {args.out}")
    return results


def _median(runs: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in runs]))
