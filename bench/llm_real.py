"""A realistic model served with the one command: a Qwen2.5-0.5B-shaped Hugging Face directory with random weights
(its published dimensions: hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied
embeddings), exported and served by `serving_server.py --model`, beside transformers' `generate` on the same
weights in the same run.

    .venv/bin/python bench/llm_real.py                 # 15-30 minutes on 2 cores (the first export dominates)
    .venv/bin/python bench/llm_real.py --rounds 1 --requests 8 --out /tmp/real.json

transformers is not a dependency of the project: it runs in `.venv-oracle` (`make oracle-fixtures` makes it), in
a subprocess of its own; without it the transformers rows are left out.

What it measures, on 127.0.0.1, every process started (and killed at the end) by this script:
1. the model directory (`--model_dir`, made once with `--seed` when missing): config.json, model.safetensors in
   float16 (the weights, 494 M parameters), the tiny Qwen2 fixture's tokenizer (ids below 512: the prompts' text
   decides nothing about the cost of a step), generation_config.json;
2. the first start (an empty `--model_cache`): the export's wall time until the server is ready; the exported files'
   bytes (weights file and graphs) and the agent's resident memory, against the weights' float32 bytes; then a
   restart from the cache (the server stopped and started again);
3. alternated rounds of (ours, then transformers): batch 1 (`--alone` requests one after another, a
   `--prompt_tokens` prompt and `--output_tokens` output tokens each, greedy, eos ignored) for TTFT and TPOT
   (medians); a saturating run (`--requests` requests at once: the engine's continuous batching; transformers: one
   `generate` over a left-padded batch of the same prompts) for output tokens/s and TTFT; the longer workload
   (`--requests` prompts of 64-320 tokens, `--long_output_tokens` output tokens each, all at once), with the
   requests that failed; and the batch-1 TPOT at a 200- and a 900-token context (ours only, when max_model_len
   holds them), which shows what a decode step costs against its context;
4. prints a table and writes JSON (default bench/results/llm_real.json).
"""

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)

from run_output import log, write_report  # noqa: E402  (bench/run_output.py)

from mindspore_serving.llm.kv_budget import parse_size  # noqa: E402

QWEN_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
    "torch_dtype": "float16",
    "bos_token_id": None,
    "eos_token_id": 1,
    "use_sliding_window": False,
    "sliding_window": 32768,
    "max_window_layers": 24,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
}
FIXTURE_TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "hf", "qwen2")
ORACLE_PYTHON = os.path.join(ROOT, ".venv-oracle", "bin", "python")
CORPUS = os.path.join(ROOT, "data", "kjv_narrative.txt")
NAME = "qwen-bench"
TOKENIZER_VOCAB = 512  # the fixture tokenizer's size


def parameter_shapes(cfg: dict) -> dict:
    hidden, inter, heads, kv = (
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
    )
    head_dim = hidden // heads
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                p + "self_attn.q_proj.bias": (heads * head_dim,),
                p + "self_attn.k_proj.weight": (kv * head_dim, hidden),
                p + "self_attn.k_proj.bias": (kv * head_dim,),
                p + "self_attn.v_proj.weight": (kv * head_dim, hidden),
                p + "self_attn.v_proj.bias": (kv * head_dim,),
                p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
            }
        )
    return shapes


def make_model(model_dir: str, seed: int) -> int:
    """Writes the random-weight model directory; returns its parameter count."""
    from safetensors.numpy import save_file

    shapes = parameter_shapes(QWEN_05B)
    count = sum(int(np.prod(shape)) for shape in shapes.values())
    if os.path.isfile(os.path.join(model_dir, "model.safetensors")):
        return count
    log(f"writing a random-weight Qwen2.5-0.5B-shaped model ({count / 1e6:.0f} M parameters) to {model_dir}")
    os.makedirs(model_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensors[name] = rng.uniform(0.8, 1.2, shape).astype(np.float16)
        else:
            tensors[name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
    # the tokenizer knows ids < TOKENIZER_VOCAB only: shrunk embedding rows (tied: the lm head's too) make the model
    # pick those, so that every generated token is text a stream carries; the cost of a step does not change
    tensors["model.embed_tokens.weight"][TOKENIZER_VOCAB:] *= np.float16(0.01)
    save_file(tensors, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(model_dir, "config.json"), "w") as stream:
        json.dump(QWEN_05B, stream, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "added_tokens.json"):
        if os.path.isfile(os.path.join(FIXTURE_TOKENIZER, name)):
            shutil.copy(os.path.join(FIXTURE_TOKENIZER, name), model_dir)
    with open(os.path.join(model_dir, "generation_config.json"), "w") as stream:
        json.dump({"eos_token_id": 1, "do_sample": False}, stream)
    return count


def prompts(model_dir: str, count: int, tokens: int, seed: int):
    """`count` text prompts of `tokens` tokens each (windows of the corpus cut at token boundaries)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(CORPUS, encoding="utf-8") as stream:
        text = stream.read()
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        start = int(rng.integers(0, len(text) - 20000))
        piece = text[start : start + 20000]
        offsets = tokenizer.encode(piece, add_special_tokens=False).offsets
        if len(offsets) > tokens + 1:
            out.append(piece[offsets[1][0] : offsets[tokens][1]])
    return out


# ---- ours ---------------------------------------------------------------------------------------------------------
class Served:
    """serving_server.py --model on free ports; stop() kills the tree."""

    def __init__(self, model_dir: str, cache: str, workdir: str, args):
        self.model_dir, self.cache, self.workdir, self.args = model_dir, cache, workdir, args
        self.proc = None
        self.url = ""

    def start(self) -> float:
        from serving_process import ServingProcess, free_port  # tests/serving_process.py

        rest = f"127.0.0.1:{free_port()}"
        command = [
            os.path.join(ROOT, "serving_server.py"),
            "--grpc",
            f"127.0.0.1:{free_port()}",
            "--rest",
            rest,
            "--model",
            self.model_dir,
            "--served_model_name",
            NAME,
            "--model_cache",
            self.cache,
            "--max_model_len",
            str(self.args.max_model_len),
            "--kv_cache_memory",
            self.args.kv_cache_memory,
        ]
        for flag in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self.args, flag):  # 0: the one command's defaults
                command += [f"--{flag}", str(getattr(self.args, flag))]
        started = time.monotonic()
        self.proc = ServingProcess(command, self.workdir)
        self.proc.wait_for("RESTful server start success", timeout=self.args.start_timeout)
        self.url = f"http://{rest}"
        return time.monotonic() - started

    def agent(self):
        root = psutil.Process(self.proc.proc.pid)
        agents = [p for p in root.children(recursive=True) if "agent" in " ".join(p.cmdline())]
        return agents[0] if agents else None

    def stop(self):
        if self.proc is not None:
            self.proc.close(grace=8)
            self.proc = None


async def _stream(session, url: str, prompt: str, max_tokens: int) -> dict:
    body = {
        "model": NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    events, tokens = [], 0
    async with session.post(url + "/v1/completions", json=body) as reply:
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {(await reply.read())[:300]!r}")
        async for line in reply.content:
            if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(str(event["error"]))
                if event.get("choices") and event["choices"][0].get("finish_reason") is None:
                    events.append(time.perf_counter())
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    if not events or tokens != max_tokens:
        raise RuntimeError(f"{len(events)} token events and {tokens} tokens for max_tokens {max_tokens}")
    return {"ttft": events[0] - sent, "e2e": time.perf_counter() - sent, "tokens": tokens}


def _tpot(result: dict) -> float:
    return (result["e2e"] - result["ttft"]) / max(1, result["tokens"] - 1)


async def _together(session, url: str, texts, output_tokens: int) -> dict:
    """Every text at once: output tokens/s over the wall time, TTFT p50, and the requests that failed."""
    started = time.perf_counter()
    results = await asyncio.gather(
        *(_stream(session, url, text, output_tokens) for text in texts), return_exceptions=True
    )
    wall = time.perf_counter() - started
    done = [r for r in results if isinstance(r, dict)]
    failed = [str(r) for r in results if not isinstance(r, dict)]
    return {
        "tokens_s": sum(r["tokens"] for r in done) / wall,
        "ttft_p50_s": float(np.median([r["ttft"] for r in done])) if done else float("nan"),
        "failed": len(failed),
        "errors": failed[:3],
    }


async def _ours_round(url: str, texts, output_tokens: int, alone_count: int, long_texts, long_output: int, contexts):
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        await _stream(session, url, texts[0], 4)  # warm
        alone = [await _stream(session, url, text, output_tokens) for text in texts[:alone_count]]
        together = await _together(session, url, texts, output_tokens)
        long = await _together(session, url, long_texts, long_output)
        context_tpot = {}
        for tokens, (first, second) in contexts.items():  # two prompts, each computed cold
            prefill = (await _stream(session, url, first, 1))["e2e"]
            context_tpot[str(tokens)] = ((await _stream(session, url, second, 33))["e2e"] - prefill) / 32
    ttft = float(np.median([r["ttft"] for r in alone]))
    tpot = float(np.median([_tpot(r) for r in alone]))
    return {
        "batch1_ttft_s": ttft,
        "batch1_tpot_s": tpot,
        "batch1_tokens_s": 1.0 / tpot,
        "batch": len(texts),
        "saturation_tokens_s": together["tokens_s"],
        "saturation_ttft_p50_s": together["ttft_p50_s"],
        "saturation_failed": together["failed"],
        "long_tokens_s": long["tokens_s"],
        "long_ttft_p50_s": long["ttft_p50_s"],
        "long_failed": long["failed"],
        "errors": together["errors"] + long["errors"],
        "context_tpot_s": context_tpot,
    }


# ---- transformers -------------------------------------------------------------------------------------------------
_HF_SCRIPT = r"""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir, texts, output_tokens, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
long_texts, long_output = json.loads(sys.argv[6]), int(sys.argv[7])
torch.set_num_threads(threads)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
tokenizer.padding_side = "left"
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token or "<|endoftext|>"
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
def generate(batch, new_tokens):
    inputs = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False)
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return time.perf_counter() - started
batch_ttft = generate(texts, 1)
generate(texts[:1], 4)
alone = texts[:int(sys.argv[5])]
ttft = sorted(generate([t], 1) for t in alone)[len(alone) // 2]
full = sorted(generate([t], output_tokens) for t in alone)[len(alone) // 2]
tpot = (full - ttft) / (output_tokens - 1)
wall = generate(texts, output_tokens)
long_wall = generate(long_texts, long_output)
print(json.dumps({"batch1_ttft_s": ttft, "batch1_tpot_s": tpot, "batch1_tokens_s": 1.0 / tpot,
                  "batch": len(texts), "saturation_tokens_s": len(texts) * output_tokens / wall,
                  "saturation_ttft_p50_s": batch_ttft, "long_tokens_s": len(long_texts) * long_output / long_wall,
                  "long_ttft_p50_s": generate(long_texts, 1)}))
"""


def hf_round(model_dir: str, texts, output_tokens: int, alone: int, long_texts, long_output: int):
    if not os.path.isfile(ORACLE_PYTHON):
        return None
    out = subprocess.run(
        [
            ORACLE_PYTHON,
            "-c",
            _HF_SCRIPT,
            model_dir,
            json.dumps(texts),
            str(output_tokens),
            str(os.cpu_count() or 1),
            str(alone),
            json.dumps(long_texts),
            str(long_output),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        log(f"transformers failed: {out.stderr[-2000:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- main ---------------------------------------------------------------------------------------------------------
def directory_bytes(path: str) -> dict:
    sizes = {"weights": 0, "graphs": 0, "other": 0}
    for base, _, files in os.walk(path):
        for name in files:
            size = os.path.getsize(os.path.join(base, name))
            kind = "weights" if name.endswith(".safetensors") else "graphs" if name.endswith(".mindir") else "other"
            sizes[kind] += size
    return sizes


def table(report: dict) -> str:
    rows = [f"{'':28}{'ours':>12}{'transformers':>14}{'ours / hf':>11}"]
    for key, label in (
        ("batch1_ttft_s", "batch 1 TTFT (ms)"),
        ("batch1_tpot_s", "batch 1 TPOT (ms)"),
        ("batch1_tokens_s", "batch 1 tokens/s"),
        ("saturation_tokens_s", "saturation tokens/s"),
        ("saturation_ttft_p50_s", "saturation TTFT p50 (ms)"),
        ("long_tokens_s", "long workload tokens/s"),
        ("long_ttft_p50_s", "long workload TTFT p50 (ms)"),
    ):
        ours = [r["ours"][key] for r in report["rounds"]]
        hf = [r["transformers"][key] for r in report["rounds"] if r.get("transformers")]
        scale = 1000 if key.endswith("_s") and "tokens" not in key else 1
        o = float(np.median(ours)) * scale
        h = float(np.median(hf)) * scale if hf else float("nan")
        spread = f"  ({min(ours) * scale:.1f}-{max(ours) * scale:.1f})" if len(ours) > 1 else ""
        rows.append(f"{label:28}{o:12.1f}{h:14.1f}{o / h:11.2f}{spread}")
    failed = sum(r["ours"]["saturation_failed"] + r["ours"]["long_failed"] for r in report["rounds"])
    rows.append(f"failed requests (every round): {failed}")
    for tokens in report["rounds"][0]["ours"]["context_tpot_s"]:
        values = [r["ours"]["context_tpot_s"][tokens] * 1000 for r in report["rounds"]]
        rows.append(f"batch 1 TPOT at a {tokens}-token context: {np.median(values):.1f} ms")
    first = report["first_start"]
    weights, kv = report["weight_bytes_fp32"], report["kv_cache_bytes"]
    rows.append(
        f"first start (export + load + warm-up): {first['seconds']:.1f} s; restart from the cache: "
        f"{report['restart_seconds']:.1f} s; files: weights {first['files']['weights'] / 2**20:.0f} MiB, graphs "
        f"{first['files']['graphs'] / 2**20:.1f} MiB"
    )
    for key, when in (("agent_rss", "when ready"), ("agent_rss_after", "after the rounds")):
        rss = first.get(key, 0)
        rows.append(
            f"agent RSS {when} {rss / 2**20:.0f} MiB = float32 weights {weights / 2**20:.0f} + KV cache "
            f"{kv / 2**20:.0f} + {(rss - weights - kv) / 2**20:.0f} MiB of step working memory and MindSpore"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", default=os.path.join(tempfile.gettempdir(), "ms_serving_qwen05b_random"))
    parser.add_argument("--model_cache", default="", help="export cache (default: a fresh directory: a cold start)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=16, help="requests of the saturating run (its batch)")
    parser.add_argument("--alone", type=int, default=3, help="requests of the batch-1 run, one after another")
    parser.add_argument("--prompt_tokens", type=int, default=32)
    parser.add_argument("--output_tokens", type=int, default=16)
    parser.add_argument("--long_output_tokens", type=int, default=64)
    parser.add_argument("--max_model_len", type=int, default=1024)
    parser.add_argument("--kv_cache_memory", default="512MiB")
    parser.add_argument("--max_num_seqs", type=int, default=0, help="0: the one command's default")
    parser.add_argument("--max_num_batched_tokens", type=int, default=0, help="0: the one command's default")
    parser.add_argument("--start_timeout", type=float, default=3600)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "llm_real.json"))
    args = parser.parse_args(argv)
    started = time.time()
    params = make_model(args.model_dir, args.seed)

    def workload(round_index: int):
        """A round's prompts, its own (the server's prefix cache would serve a repeated prompt from its cache):
        the saturating run's, the longer workload's (64-320 tokens) and the two context prompts' pairs."""
        seed = args.seed + 1000 * (round_index + 1)
        rng = np.random.default_rng(seed)
        lengths = rng.integers(64, 321, args.requests)
        long = [prompts(args.model_dir, 1, int(n), seed + i)[0] for i, n in enumerate(lengths)]
        pairs = {
            n: (prompts(args.model_dir, 1, n, seed + 500)[0], prompts(args.model_dir, 1, n, seed + 600)[0])
            for n in (200, 900)
            if n + 40 <= args.max_model_len
        }
        return prompts(args.model_dir, args.requests, args.prompt_tokens, seed), long, pairs

    report = {
        "meta": {"argv": sys.argv[1:], "cores": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "parameters": params,
        "weight_bytes_fp32": 4 * params,
        "rounds": [],
        "kv_cache_bytes": parse_size(args.kv_cache_memory),
    }
    workdir = tempfile.mkdtemp(prefix="llm_real_")
    cache = args.model_cache or os.path.join(workdir, "model_cache")
    served = Served(args.model_dir, cache, workdir, args)
    try:
        log("first start: exporting the graphs and loading them (the server is ready when this returns)")
        seconds = served.start()
        agent = served.agent()
        report["first_start"] = {
            "seconds": seconds,
            "files": directory_bytes(cache),
            "agent_rss": agent.memory_info().rss if agent else 0,
        }
        log(f"ready after {seconds:.1f} s; restarting from the cache")
        served.stop()
        report["restart_seconds"] = served.start()
        agent = served.agent()
        log(f"ready again after {report['restart_seconds']:.1f} s")
        for index in range(args.rounds):
            texts, long_texts, contexts = workload(index)
            log(f"round {index + 1}: ours")
            ours = asyncio.run(
                _ours_round(
                    served.url, texts, args.output_tokens, args.alone, long_texts, args.long_output_tokens, contexts
                )
            )
            log(f"round {index + 1}: transformers")
            hf = hf_round(args.model_dir, texts, args.output_tokens, args.alone, long_texts, args.long_output_tokens)
            report["rounds"].append({"ours": ours, "transformers": hf})
        if agent is not None:
            report["first_start"]["agent_rss_after"] = agent.memory_info().rss
    finally:
        served.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    print(table(report))
    write_report(report, started, args.out, indent=2)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
