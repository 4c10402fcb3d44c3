"""In-process latency of GraphRunner steps over an export directory, and a greedy sample.

    python bench/llama_graphs.py --graphs <export dir> [--tokenizer tiny/tokenizer.json]
        [--prompt "And God said"] [--batches 1 16] [--steps 50] [--prefill 100] [--max-num-tokens 2048]

The export holds the three dynamic-shape step graphs (prepare, layer, head; models/llama/step_graphs.py): one
`GraphRunner.run` computes any step in one graph call per --max-num-tokens tokens. Prints the mean and p50/p90 wall
time of one decode step per batch size (every sequence at a context of --context tokens), the time and graph calls
of one prompt of --prefill tokens, and, with --tokenizer, the greedy continuation of --prompt computed through the
graphs.
"""

import argparse
import time

import numpy as np

from mindspore_serving.agent.graph_runner import DEFAULT_MAX_NUM_TOKENS, GraphRunner
from mindspore_serving.common.ms_device import select_device
from mindspore_serving.llm.model_io import SeqStep
from mindspore_serving.models.llama.tokenizer import TextTokenizer


def blocks_for(runner: GraphRunner, tokens: int) -> int:
    return -(-tokens // runner.block_size)


def greedy_generate(runner: GraphRunner, prompt_ids, max_new_tokens: int, eos_id=None, first_block: int = 1):
    """Greedy decoding of one sequence through the runner, on blocks first_block, first_block + 1, ..."""
    need = blocks_for(runner, min(runner.max_seq_len, len(prompt_ids) + max_new_tokens))
    table = list(range(first_block, first_block + need))
    ids = list(prompt_ids)
    logits = runner.run([SeqStep(ids, 0, table)])[0]
    out = []
    while len(out) < max_new_tokens and len(ids) < runner.max_seq_len:
        nxt = int(np.argmax(logits))
        out.append(nxt)
        if nxt == eos_id:
            break
        logits = runner.run([SeqStep([nxt], len(ids), table)])[0]
        ids.append(nxt)
    return out


def time_decode(runner: GraphRunner, batch: int, context: int, steps: int):
    if context + steps > runner.max_seq_len:
        raise ValueError(f"--context {context} + --steps {steps} exceeds the graphs' max_seq_len {runner.max_seq_len}")
    per_seq = blocks_for(runner, context + steps)
    if 1 + batch * per_seq > runner.num_blocks:
        raise ValueError(f"--num-blocks too small for batch {batch} at context {context}")
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
    rng = np.random.default_rng(0)
    # fill each cache up to `context` with a prompt (all in one step, in several graph calls if it needs)
    runner.run([SeqStep(rng.integers(3, runner.vocab_size, context).tolist(), 0, table) for table in tables])
    times = []
    for step in range(steps):
        seqs = [SeqStep([5], context + step, t) for t in tables]
        start = time.perf_counter()
        runner.run(seqs)
        times.append(time.perf_counter() - start)
    return np.array(times) * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", required=True, help="export directory (manifest.json)")
    parser.add_argument("--num-blocks", type=int, default=512)
    parser.add_argument(
        "--max-num-tokens",
        type=int,
        default=DEFAULT_MAX_NUM_TOKENS,
        help="most tokens per graph call (a served agent uses engine.max_num_batched_tokens)",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--prefill", type=int, default=100, help="tokens of the timed prompt")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--prompt", default="And God said")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    select_device("CPU")
    start = time.perf_counter()
    runner = GraphRunner(args.graphs, num_blocks=args.num_blocks, max_num_tokens=args.max_num_tokens)
    graphs = ", ".join(runner.manifest["graphs"])
    print(f"loaded and warmed the step graphs ({graphs}) in {time.perf_counter() - start:.1f}s")
    for batch in args.batches:
        t = time_decode(runner, batch, args.context, args.steps)
        p50, p90 = np.percentile(t, 50), np.percentile(t, 90)
        print(
            f"decode batch {batch:3d} @ context {args.context}: mean {t.mean():.2f} ms  p50 {p50:.2f}  "
            f"p90 {p90:.2f} ms  ({batch / t.mean() * 1e3:.0f} tokens/s)"
        )
    length = min(args.prefill, runner.max_seq_len)
    prompt = list(range(3, 3 + length))
    calls = runner.calls
    start = time.perf_counter()
    runner.run([SeqStep(prompt, 0, list(range(1, 1 + blocks_for(runner, length))))])
    print(
        f"prefill of {length} tokens: {(time.perf_counter() - start) * 1e3:.1f} ms "
        f"({runner.calls - calls} graph call(s) of at most {runner.max_num_tokens} tokens)"
    )
    if args.tokenizer:
        tok = TextTokenizer.from_file(args.tokenizer)
        out = greedy_generate(runner, tok.encode(args.prompt, add_bos=True), args.max_new_tokens, tok.eos_id)
        print(f"{args.prompt!r} -> {args.prompt + tok.decode(out)!r}")


if __name__ == "__main__":
    main()
