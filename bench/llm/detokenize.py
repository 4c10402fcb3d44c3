"""Detokenization CPU per token (bench/llm_engine.py --detokenize): `IncrementalDetokenizer`'s two ways of decoding,
on the same token streams, in one run.

- decode_stream: the tokenizer is a `tokenizers.Tokenizer` (as the engine gets it, through TextTokenizer):
  `tokenizers.decoders.DecodeStream`, one native call per token;
- window: the same tokenizer behind an object that only decodes: two Python-side decodes of a window per token (the
  only way before DecodeStream was used).

Streams: `requests` passages of data/kjv_narrative.txt, each `tokens` tokens fed one at a time after a 16-token
prompt, as the engine feeds them; without stop strings, and with two stop strings that never occur (the stop-string
search and the hold-back run on every token). The figure is the thread's CPU time per token (time.thread_time), the
best of `rounds` rounds (the machine is shared: noise only adds time); the rounds alternate the two paths.
"""

import os
import time

from tokenizers import Tokenizer

from mindspore_serving.llm.detokenizer import IncrementalDetokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZERS = {
    "tiny (bundled, byte-level BPE)": os.path.join(ROOT, "mindspore_serving", "models", "llama", "tiny"),
    "qwen2 fixture (NFC byte-level BPE)": os.path.join(ROOT, "tests", "fixtures", "hf", "qwen2"),
    "llama2 fixture (byte fallback)": os.path.join(ROOT, "tests", "fixtures", "hf", "llama2_linear"),
}
TEXT = os.path.join(ROOT, "data", "kjv_narrative.txt")
PROMPT_TOKENS = 16
STOPS = {"no stop strings": (), "2 stop strings": ("<|never seen|>", "\n\n\n\n")}


class _DecodeOnly:
    """A tokenizer that only decodes: the detokenizer cannot see a `tokenizers.Tokenizer` and takes its window path."""

    def __init__(self, tokenizer: Tokenizer):
        self.decode = tokenizer.decode


def _streams(tokenizer: Tokenizer, requests: int, tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, output ids) of `requests` consecutive passages of the text."""
    with open(TEXT, encoding="utf-8") as f:
        text = f.read(200_000)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    size = PROMPT_TOKENS + tokens
    if len(ids) < requests * size:
        raise SystemExit(f"{TEXT} is too short for {requests} requests of {tokens} tokens")
    return [
        (ids[i * size : i * size + PROMPT_TOKENS], ids[i * size + PROMPT_TOKENS : (i + 1) * size])
        for i in range(requests)
    ]


def _cpu_per_token(tokenizer, streams, stop) -> float:
    """CPU microseconds per token to detokenize every stream, token by token, then flush."""
    count = 0
    started = time.thread_time()
    for prompt, output in streams:
        detok = IncrementalDetokenizer(tokenizer, prompt, stop)
        for token in output:
            detok.update([token])
        detok.flush()
        count += len(output)
    return (time.thread_time() - started) / count * 1e6


def run(requests: int, tokens: int, rounds: int) -> dict:
    results = {"requests": requests, "tokens_per_request": tokens, "rounds": rounds, "cpu_us_per_token": {}}
    for name, path in TOKENIZERS.items():
        tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        streams = _streams(tokenizer, requests, tokens)
        paths = {"window": _DecodeOnly(tokenizer), "decode_stream": tokenizer}
        for case, stop in STOPS.items():
            best = {label: float("inf") for label in paths}
            for _ in range(rounds):
                for label, face in paths.items():
                    best[label] = min(best[label], _cpu_per_token(face, streams, stop))
            results["cpu_us_per_token"][f"{name}, {case}"] = {**best, "speedup": best["window"] / best["decode_stream"]}
    return results


def report(results: dict) -> None:
    print(
        f"\nDetokenization CPU per token ({results['requests']} requests x {results['tokens_per_request']} tokens, "
        f"best of {results['rounds']} rounds)"
    )
    print(f"{'tokenizer, stop strings':<58} {'window us':>10} {'DecodeStream us':>16} {'speedup':>8}")
    for case, row in results["cpu_us_per_token"].items():
        print(f"{case:<58} {row['window']:>10.2f} {row['decode_stream']:>16.2f} {row['speedup']:>7.2f}x")
    print("window: two Python-side decodes of a window per token (before); DecodeStream: one native call (after)")
