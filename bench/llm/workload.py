"""What the LLM serving benchmark sends: text prompts of a chosen token count (windows of data/kjv_narrative.txt cut
at token boundaries) with their output lengths, one fixed-seed workload per run."""

import json
import os
from dataclasses import dataclass

import numpy as np
from llm_engine import OUTPUT_TOKENS  # bench/llm_engine.py
from llm_engine import output_tokens as draw_output_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "data", "kjv_narrative.txt")
PROMPT_TOKENS = (4, 96)
C1_OUTPUT_TOKENS = 64
DESCRIPTION = (
    f"prompts {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens (windows of data/kjv_narrative.txt), outputs "
    f"log-uniform {OUTPUT_TOKENS[0]}-{OUTPUT_TOKENS[1]} tokens; c=1: {C1_OUTPUT_TOKENS} output tokens"
)


@dataclass
class Item:
    prompt: str
    prompt_tokens: int
    max_tokens: int


class PromptSource:
    """Text prompts of a chosen token count: windows of the corpus cut at token boundaries."""

    def __init__(self, tokenizer_path: str):
        from mindspore_serving.models.llama.tokenizer import TextTokenizer

        self.tokenizer = TextTokenizer.from_file(tokenizer_path)
        with open(CORPUS, encoding="utf-8") as stream:
            self.text = stream.read()
        self._cache: dict[int, tuple[list[tuple[int, int]], int]] = {}

    def _window(self, start: int):
        if start not in self._cache:
            piece = self.text[start : start + 4000]
            self._cache[start] = (self.tokenizer.tokenizer.encode(piece, add_special_tokens=False).offsets, start)
        return self._cache[start]

    def prompt(self, rng: np.random.Generator, tokens: int) -> tuple[str, int]:
        start = int(rng.integers(0, len(self.text) - 5000))
        start = self.text.find("\n", start) + 1  # begin at a verse
        offsets, base = self._window(start)
        for count in (tokens, tokens - 1, tokens + 1, tokens - 2, tokens + 2):
            count = max(1, count)
            text = self.text[base + offsets[0][0] : base + offsets[count - 1][1]].strip()
            n = len(self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids)
            if n == tokens:
                break
        return text, n


def workload(
    source: PromptSource, count: int, seed: int, max_model_len: int, output_tokens: int | None = None
) -> list[Item]:
    """Prompts of 4-96 tokens; output lengths as llm_engine.output_tokens draws them, or fixed."""
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(count):
        prompt_len = int(rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1))
        new = draw_output_tokens(rng) if output_tokens is None else output_tokens
        text, n = source.prompt(rng, prompt_len)
        items.append(Item(text, n, int(min(new, max_model_len - n - 2))))
    return items


def workloads(source: PromptSource, args, max_model_len: int, workdir: str) -> dict:
    """Every run's workload: warm-up, c=1, each saturating run (its items and a file of the ids the server makes of
    them, for the in-process engine), the profiled run and each Poisson rate."""
    found = {
        "warm": workload(source, 24, args.seed + 99, max_model_len, output_tokens=8),
        "c1": workload(source, args.c1_requests, args.seed + 1, max_model_len, output_tokens=C1_OUTPUT_TOKENS),
        # each saturating run its own prompts: a repeated prompt would hit the prefix cache
        "saturation": [
            workload(source, args.requests, args.seed + 2 + 30 * k, max_model_len) for k in range(args.saturation_runs)
        ],
        "profile": workload(source, 2 * args.requests, args.seed + 3, max_model_len),
        "poisson": [workload(source, args.requests, args.seed + 10 + k, max_model_len) for k in range(len(args.rates))],
    }
    for k, items in enumerate(found["saturation"]):
        path = os.path.join(workdir, f"saturation_workload_{k}.json")
        with open(path, "w", encoding="utf-8") as stream:
            json.dump([[source.tokenizer.encode(item.prompt), item.max_tokens] for item in items], stream)
        found["saturation"][k] = (items, path)
    return found
