"""Trains the bundled tiny model: a byte-level BPE tokenizer and a small LLaMA, on CPU in minutes.

    python -m mindspore_serving.models.llama.train --corpus data/kjv_narrative.txt \\
        --out-dir mindspore_serving/models/llama/tiny [--max-seconds 480] [--steps 2000]

The bundled tiny/llama_tiny.ckpt was made with exactly this command and the defaults: 545 steps of 16 x 128
tokens in 489 s on a shared 2-core machine, final loss 3.13 (mean of the last 50 steps).

Writes into --out-dir: tokenizer.json (unless --keep-tokenizer and it exists), llama_tiny.ckpt, and updates the
special-token ids of config.yaml (which must already hold the model and export sections). The training windows
start at a line (verse) boundary with <s>; the tokenizer's post-processor prepends <s> to every encoding made with
special tokens (the default), so a prompt encoded by the serving engine looks like the training data.
"""

import argparse
import dataclasses
import math
import os
import time

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from mindspore_serving.common.ms_device import select_device

from .config import ModelFile, load_config, save_config
from .model import LlamaModel, build_model, save_weights
from .tokenizer import TextTokenizer

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2


def train_tokenizer(corpus: str, out_path: str, vocab_size: int) -> TextTokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # encode() with special tokens (the default of `tokenizers` and of TextTokenizer) starts with <s>, as training
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([corpus], trainer)
    tok.save(out_path)
    return TextTokenizer.from_file(out_path)


def encode_lines(tokenizer: TextTokenizer, corpus: str):
    """The corpus as one token stream, and the offset where each non-empty line starts."""
    with open(corpus, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    encoded = tokenizer.tokenizer.encode_batch([line + "\n" for line in lines], add_special_tokens=False)
    starts, stream = [], []
    for enc in encoded:
        starts.append(len(stream))
        stream.extend(enc.ids)
    return np.array(stream, np.int32), np.array(starts, np.int64)


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to peak/10 as progress goes from 0 to 1."""
    scale = min(1.0, (step + 1) / warmup)
    return peak * scale * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def greedy(model: LlamaModel, ids, new_tokens: int, eos_id=None):
    """Greedy continuation with the cache-free forward (slow but simple; for samples only)."""
    ids = list(ids)
    for _ in range(new_tokens):
        logits = model.forward_full(Tensor(np.array([ids], np.int32))).asnumpy()[0, -1]
        nxt = int(np.argmax(logits))
        ids.append(nxt)
        if nxt == eos_id:
            break
    return ids


def train_model(
    cfg: ModelFile,
    tokenizer: TextTokenizer,
    corpus: str,
    out_ckpt: str,
    steps: int,
    batch: int,
    seq_len: int,
    lr: float,
    max_seconds: float,
    seed: int,
    log=print,
) -> dict:
    rng = np.random.default_rng(seed)
    stream, starts = encode_lines(tokenizer, corpus)
    starts = starts[starts + seq_len < len(stream)]
    log(f"corpus: {len(stream)} tokens, {len(starts)} window starts")
    model = build_model(cfg.model, seed=seed)
    params = model.trainable_params()
    log(f"model: {sum(int(np.prod(p.shape)) for p in params) / 1e6:.2f}M parameters")
    warmup = min(50, steps // 10)
    decay = [p for p in params if len(p.shape) > 1]
    no_decay = [p for p in params if len(p.shape) <= 1]
    opt = nn.AdamWeightDecay(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        learning_rate=Tensor(lr_at(0, 0.0, lr, warmup), ms.float32),
        beta1=0.9,
        beta2=0.98,
    )
    vocab = cfg.model.vocab_size

    def loss_fn(inputs, targets):
        logits = model.forward_full(inputs)
        return ops.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)

    @ms.jit
    def train_step(inputs, targets, learning_rate):
        loss, grads = grad_fn(inputs, targets)
        grads = ops.clip_by_global_norm(grads, 1.0)
        # NOTE: set_data on opt.learning_rate from Python does not reach the compiled step; assigning inside does
        ops.assign(opt.learning_rate, learning_rate)
        opt(grads)
        return loss

    bos = tokenizer.bos_id
    model.set_train(True)
    start, losses, step, compile_seconds = time.perf_counter(), [], 0, 0.0
    for step in range(steps):
        # The schedule follows whichever budget (steps or seconds) runs out first, so that the learning rate
        # has decayed when training stops even on a busy machine.
        progress = max(step / steps, (time.perf_counter() - start - compile_seconds) / max_seconds)
        step_lr = Tensor(lr_at(step, progress, lr, warmup), ms.float32)
        picks = rng.choice(starts, batch)
        window = np.stack([stream[s : s + seq_len] for s in picks])
        inputs = np.concatenate([np.full((batch, 1), bos, np.int32), window[:, :-1]], axis=1)
        loss = float(train_step(Tensor(inputs), Tensor(window), step_lr).asnumpy())
        if step == 0:
            compile_seconds = time.perf_counter() - start
        losses.append(loss)
        elapsed = time.perf_counter() - start
        if step % 50 == 0 or step == steps - 1:
            log(
                f"step {step:5d}  loss {np.mean(losses[-50:]):.3f}  lr {float(opt.learning_rate.asnumpy()):.2e}"
                f"  {elapsed:.0f}s"
            )
        if elapsed - compile_seconds >= max_seconds:
            log(f"stopping at step {step}: time budget of {max_seconds:.0f}s spent")
            break
    model.set_train(False)
    save_weights(model, out_ckpt)
    final = float(np.mean(losses[-50:]))
    log(f"saved {out_ckpt}: {step + 1} steps in {time.perf_counter() - start:.0f}s, final loss {final:.3f}")
    return {"model": model, "steps": step + 1, "seconds": time.perf_counter() - start, "loss": final}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="UTF-8 text file, one passage per line")
    parser.add_argument("--out-dir", required=True, help="folder with config.yaml; receives tokenizer and ckpt")
    parser.add_argument("--keep-tokenizer", action="store_true", help="reuse out-dir/tokenizer.json if present")
    parser.add_argument("--steps", type=int, default=2000, help="at most this many steps")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=4e-3, help="peak learning rate")
    parser.add_argument(
        "--max-seconds", type=float, default=480.0, help="stop training after this much time (compilation excluded)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt", action="append", default=None, help="prompt(s) for the greedy samples")
    parser.add_argument("--device", default="CPU", help="MindSpore device target (CPU, GPU, Ascend)")
    args = parser.parse_args(argv)
    select_device(args.device)
    ms.set_context(mode=ms.GRAPH_MODE)
    config_path = os.path.join(args.out_dir, "config.yaml")
    cfg = load_config(config_path)
    tok_path = os.path.join(args.out_dir, "tokenizer.json")
    if args.keep_tokenizer and os.path.isfile(tok_path):
        tokenizer = TextTokenizer.from_file(tok_path)
    else:
        start = time.perf_counter()
        tokenizer = train_tokenizer(args.corpus, tok_path, cfg.model.vocab_size)
        print(f"trained tokenizer ({tokenizer.vocab_size} ids) in {time.perf_counter() - start:.1f}s")
    if tokenizer.vocab_size != cfg.model.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} ids but config.yaml vocab_size is "
            f"{cfg.model.vocab_size}; make them equal"
        )
    cfg = ModelFile(
        dataclasses.replace(
            cfg.model, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id
        ),
        cfg.export,
    )
    save_config(cfg, config_path)
    result = train_model(
        cfg,
        tokenizer,
        args.corpus,
        os.path.join(args.out_dir, "llama_tiny.ckpt"),
        args.steps,
        args.batch,
        args.seq_len,
        args.lr,
        args.max_seconds,
        args.seed,
    )
    ms.set_context(mode=ms.PYNATIVE_MODE)
    for prompt in args.prompt or ["And God said", "And the king of"]:
        ids = greedy(result["model"], tokenizer.encode(prompt, add_bos=True), 24, tokenizer.eos_id)
        print(f"{prompt!r} -> {tokenizer.decode(ids)!r}")


if __name__ == "__main__":
    main()
