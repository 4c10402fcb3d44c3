"""Chooses the next token of each request from the model's logits (numpy, on the host).

Per row, in this order:
  1. repetition penalty over every token of the prompt and the output so far: a positive logit is
     divided by the penalty, a negative one multiplied by it (the CTRL / Hugging Face rule);
  2. greedy rows take the argmax (ties go to the lowest token id);
  3. sampled rows divide by the temperature, keep the top_k most likely tokens (ties by lowest id),
     keep the smallest head of that list whose probability reaches top_p, renormalise, and draw one
     uniform number from the request's own generator (seeded requests) or the sampler's shared one.
     One draw per token, so a seeded request gets the same tokens whatever else is in the batch.

The returned log-probability of the chosen token (and the optional top alternatives) is taken from
the model's own distribution, log_softmax(logits), before penalty, temperature and truncation.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from mindspore_serving.llm.sampling_params import SamplingParams


@dataclass
class SamplerOutput:
    token_ids: List[int]
    logprobs: List[float]
    """log P(chosen token) under the model's distribution."""
    top_logprobs: List[List[Tuple[int, float]]] = field(default_factory=list)
    """Per row, the `top_logprobs` most likely (token id, logprob) pairs, most likely first (empty if not asked)."""


def greedy_with_logprobs(logits: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per row of logits [n, vocab]: the argmax (ties go to the lowest id) and its log-probability, exactly
    as `Sampler.sample` computes them for a greedy row (model runners use it for multi-step decoding)."""
    logits = np.asarray(logits, dtype=np.float32)
    tokens = np.argmax(logits, axis=1)
    return tokens, logits[np.arange(len(tokens)), tokens] - _log_normaliser(logits)


def _log_normaliser(logits: np.ndarray) -> np.ndarray:
    """Per row of float32 logits [n, vocab]: log(sum(exp(row))), computed stably."""
    peak = logits.max(axis=1)
    return peak + np.log(np.exp(logits - peak[:, None]).sum(axis=1))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    peak = np.max(x, axis=-1, keepdims=True)
    shifted = x - peak
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def apply_repetition_penalty(logits: np.ndarray, token_ids: Sequence[int], penalty: float) -> np.ndarray:
    """In place on a 1-D float row: divide positive logits of seen tokens by `penalty`, multiply negative ones."""
    if penalty == 1.0 or len(token_ids) == 0:
        return logits
    seen = np.unique(np.asarray(token_ids, dtype=np.int64))
    values = logits[seen]
    logits[seen] = np.where(values > 0, values / penalty, values * penalty)
    return logits


def _top_candidates(row: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries of `row`, ranked by value descending, ties by lowest id."""
    vocab = row.shape[0]
    if k >= vocab:
        candidates = np.arange(vocab)
    else:
        head = np.argpartition(row, vocab - k)[vocab - k:]
        # argpartition breaks ties at the k-th value arbitrarily: widen to every tie (in id order), then cut.
        candidates = np.flatnonzero(row >= row[head].min())
    return candidates[np.argsort(-row[candidates], kind="stable")][:k]


class Sampler:
    """Samples one token per row; `seed` seeds the generator shared by requests without their own seed."""

    # NOTE: top-p alone first looks at this many candidates and widens only if their mass falls short,
    # so peaked distributions never sort the whole vocabulary.
    TOP_P_FIRST_CANDIDATES = 64

    def __init__(self, seed: Optional[int] = None):
        self._rng = np.random.default_rng(seed)

    def sample(self, logits: np.ndarray, params: Sequence[SamplingParams],
               token_histories: Sequence[Sequence[int]],
               generators: Optional[Sequence[Optional[np.random.Generator]]] = None) -> SamplerOutput:
        """`logits` [n, vocab]; per row its params, its prompt + output tokens (for the repetition
        penalty) and its own generator (None: the shared one)."""
        logits = np.asarray(logits, dtype=np.float32)
        n = len(params)
        if logits.ndim != 2 or logits.shape[0] != n:
            raise ValueError(f"sampler expects logits [{n}, vocab], got shape {logits.shape}")
        if len(token_histories) != n or (generators is not None and len(generators) != n):
            raise ValueError("sampler needs one params, one token history and one generator per row")
        tokens = np.argmax(logits, axis=1)  # greedy for every row; the others are redone below
        for i, p in enumerate(params):
            if p.greedy and p.repetition_penalty == 1.0:
                continue
            row = logits[i].astype(np.float64)
            apply_repetition_penalty(row, token_histories[i], p.repetition_penalty)
            if p.greedy:
                tokens[i] = np.argmax(row)
            else:
                generator = generators[i] if generators is not None and generators[i] is not None else self._rng
                tokens[i] = self._sample_row(row, p, generator)
        log_normaliser = _log_normaliser(logits)
        chosen = logits[np.arange(n), tokens] - log_normaliser
        top = [self._top(logits[i] - log_normaliser[i], p.top_logprobs) if p.top_logprobs else []
               for i, p in enumerate(params)]
        return SamplerOutput([int(t) for t in tokens], [float(v) for v in chosen], top)

    def sample_requests(self, logits: np.ndarray, requests: Sequence) -> SamplerOutput:
        """Convenience over `sample` for objects with sampling_params, all_token_ids and generator (Request)."""
        return self.sample(logits, [r.sampling_params for r in requests], [r.all_token_ids for r in requests],
                           [r.generator for r in requests])

    @classmethod
    def _sample_row(cls, row: np.ndarray, params: SamplingParams, generator: np.random.Generator) -> int:
        row /= params.temperature
        vocab = row.shape[0]
        peak = row.max()
        if params.top_k_enabled and params.top_k < vocab:
            candidates = _top_candidates(row, params.top_k)
            weights = np.exp(row[candidates] - peak)
            mass = weights.sum()  # top-p then applies to the distribution renormalised over the top k
        elif params.top_p < 1.0:
            all_weights = np.exp(row - peak)
            mass = all_weights.sum()
            k = cls.TOP_P_FIRST_CANDIDATES
            while True:
                candidates = _top_candidates(row, k)
                weights = all_weights[candidates]
                if k >= vocab or weights.sum() >= params.top_p * mass:
                    break
                k *= 4
        else:
            candidates = None  # no truncation: sample over the ids in order, no sort needed
            weights = np.exp(row - peak)
            mass = weights.sum()
        if params.top_p < 1.0:
            # candidates are ranked: keep the shortest head whose mass reaches top_p (at least one).
            keep = int(np.searchsorted(np.cumsum(weights), params.top_p * mass, side="left")) + 1
            weights = weights[:keep]
            candidates = candidates[:keep]
        cumulative = np.cumsum(weights)
        index = int(np.searchsorted(cumulative, generator.random() * cumulative[-1], side="right"))
        index = min(index, len(cumulative) - 1)
        return index if candidates is None else int(candidates[index])

    @staticmethod
    def _top(logprobs_row: np.ndarray, count: int) -> List[Tuple[int, float]]:
        return [(int(t), float(logprobs_row[t])) for t in _top_candidates(logprobs_row, count)]
