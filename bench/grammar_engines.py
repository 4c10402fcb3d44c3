"""The two grammar engines that run on a CPU without torch, side by side: llguidance (the one the engine uses) and
outlines-core. For JSON schemas of three sizes, on byte-level BPE tokenizers trained here on data/kjv_narrative.txt
at 2048 and 32000 tokens: the time to compile a schema for the tokenizer (what a request with a new schema waits
for), and the time to get the allowed tokens of one row at one step, along a random valid output.

outlines-core is not a dependency of the server; run this in a virtualenv of its own:

    python3 -m venv /tmp/grammar-env
    /tmp/grammar-env/bin/pip install llguidance==1.9.1 outlines-core==0.2.14 tokenizers==0.23.3 numpy==2.4.6
    /tmp/grammar-env/bin/python bench/grammar_engines.py [--vocab 2048,32000] [--out bench/results/grammar_engines.json]

Walks are capped at --max-steps tokens (a random walk in an unbounded string or a recursive schema may not end).
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from run_output import write_report  # noqa: E402  (bench/run_output.py: json, os and time only)

CORPUS = os.path.join(ROOT, "data", "kjv_narrative.txt")
EOS = 0
SCHEMAS = {
    "small": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "age", "tags"],
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 6},
        },
    },
    "order": {
        "type": "object",
        "additionalProperties": False,
        "required": ["id", "user", "items", "status"],
        "properties": {
            "id": {"type": "string", "pattern": "^[a-f0-9]{8}$"},
            "user": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "email", "age"],
                "properties": {
                    "name": {"type": "string", "maxLength": 40},
                    "email": {"type": "string", "maxLength": 60},
                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                },
            },
            "items": {
                "type": "array",
                "maxItems": 20,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["sku", "qty", "price"],
                    "properties": {
                        "sku": {"type": "string", "maxLength": 16},
                        "qty": {"type": "integer"},
                        "price": {"type": "number"},
                        "note": {"type": "string"},
                    },
                },
            },
            "status": {"enum": ["new", "paid", "shipped", "cancelled"]},
        },
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "required": ["v"],
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    },
}


def train_tokenizer(vocab: int, directory: str) -> Tokenizer:
    path = os.path.join(directory, f"bpe_{vocab}.json")
    if not os.path.exists(path):
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.train(
            [CORPUS],
            trainers.BpeTrainer(
                vocab_size=vocab, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
            ),
        )
        tokenizer.save(path)
    return Tokenizer.from_file(path)


def walk(allowed_tokens, consume, finished, max_steps: int, seed: int = 0):
    """Mean seconds of `allowed_tokens()` over a random walk of valid tokens; (seconds, steps)."""
    rng = np.random.default_rng(seed)
    spent, steps = 0.0, 0
    while not finished() and steps < max_steps:
        started = time.perf_counter()
        allowed = allowed_tokens()
        spent += time.perf_counter() - started
        consume(int(rng.choice(allowed)))
        steps += 1
    return spent / max(steps, 1), steps


def run_llguidance(tokenizer: Tokenizer, schema: dict, max_steps: int) -> dict:
    import llguidance  # pylint: disable=import-outside-toplevel  (each engine is imported where it is measured)
    import llguidance.numpy as lnp  # pylint: disable=import-outside-toplevel

    vocab = tokenizer.get_vocab_size()
    started = time.perf_counter()
    llt = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=vocab, eos_token=EOS)
    built = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults={"whitespace_flexible": False})
    matcher = llguidance.LLMatcher(llt, grammar, log_level=0)
    compiled = time.perf_counter()
    bitmask = lnp.allocate_token_bitmask(1, vocab)

    def allowed():
        lnp.fill_next_token_bitmask(matcher, bitmask, 0)
        return np.flatnonzero(np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:vocab])

    mask_s, steps = walk(allowed, matcher.consume_token, matcher.is_stopped, max_steps)
    return {
        "tokenizer_ms": (built - started) * 1e3,
        "compile_ms": (compiled - built) * 1e3,
        "mask_us": mask_s * 1e6,
        "steps": steps,
        "error": matcher.get_error() or None,
    }


def run_outlines(tokenizer: Tokenizer, schema: dict, max_steps: int) -> dict:
    # pylint: disable=import-outside-toplevel  (each engine is imported where it is measured)
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    started = time.perf_counter()
    tokens = {}
    for text, token_id in tokenizer.get_vocab().items():
        if token_id != EOS:
            tokens.setdefault(text, []).append(token_id)
    vocabulary = Vocabulary(EOS, tokens)
    built = time.perf_counter()
    try:
        guide = Guide(Index(build_regex_from_schema(json.dumps(schema), None), vocabulary))
    except Exception as err:  # pylint: disable=broad-except  (reported, not fatal)
        return {"error": f"{type(err).__name__}: {str(err)[:160]}"}
    compiled = time.perf_counter()

    def allowed():
        return [t for t in guide.get_tokens() if t != EOS] or [EOS]

    mask_s, steps = walk(allowed, guide.advance, guide.is_finished, max_steps)
    return {
        "tokenizer_ms": (built - started) * 1e3,
        "compile_ms": (compiled - built) * 1e3,
        "mask_us": mask_s * 1e6,
        "steps": steps,
        "error": None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", default="2048,32000")
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "grammar_engines.json"))
    args = parser.parse_args()
    started = time.time()
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for vocab in [int(v) for v in args.vocab.split(",")]:
            tokenizer = train_tokenizer(vocab, directory)
            for name, schema in SCHEMAS.items():
                for engine, run in (("llguidance", run_llguidance), ("outlines-core", run_outlines)):
                    results.append(
                        {"vocab": vocab, "schema": name, "engine": engine, **run(tokenizer, schema, args.max_steps)}
                    )
    print(
        f"{'vocab':>6} {'schema':>10} {'engine':>14} {'tokenizer ms':>13} {'compile ms':>11} {'mask us/step':>13} "
        f"{'steps':>6}"
    )
    for row in results:
        if row.get("compile_ms") is None:
            print(f"{row['vocab']:>6} {row['schema']:>10} {row['engine']:>14}  {row['error']}")
            continue
        print(
            f"{row['vocab']:>6} {row['schema']:>10} {row['engine']:>14} {row['tokenizer_ms']:>13.1f} "
            f"{row['compile_ms']:>11.2f} {row['mask_us']:>13.1f} {row['steps']:>6}"
        )
    write_report({"meta": {}, "results": results}, started, args.out, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
