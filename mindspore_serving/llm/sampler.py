"""Chooses the next token of each request from the model's logits (numpy, on the host).

Per row, in this order:
  1. the logits are processed (llm/logits_processors.py, vectorised over the rows that need it): repetition
     penalty (prompt + output), presence and frequency penalties (output only, OpenAI's formula), logit bias,
     allowed_token_ids, bad words, min_tokens (end-of-sequence and stop ids banned while the output is
     shorter), then the grammar bitmask when one is given;
  2. greedy rows take the argmax (ties go to the lowest token id);
  3. sampled rows divide by the temperature, keep the top_k most likely tokens (ties by lowest id),
     keep the smallest head of that list whose probability reaches top_p, drop the tokens whose probability
     is below min_p times the most likely one's, renormalise, and draw one uniform number from the request's
     own generator (seeded requests) or the sampler's shared one. One draw per token, so a seeded request gets
     the same tokens whatever else is in the batch.
Rows with nothing to process skip step 1: a plain greedy row costs one argmax over the batch.

A row whose processed logits allow no token at all (a grammar bitmask, or masks that exclude each other) gets
token -1, logprob -inf and no top logprobs: nothing can be generated, and the caller ends the request (with
FinishReason.GRAMMAR for a structured output).

The returned log-probability of the chosen token (and the optional top alternatives) follows the request's
logprobs_mode: "raw", the model's own distribution, log_softmax(logits); "processed", log_softmax of the logits
after step 1, before temperature and truncation (a token step 1 banned has logprob -inf there).
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from mindspore_serving.llm.logits_processors import TokenSequences, needs_processing, process_logits, restricted_rows
from mindspore_serving.llm.request import Request
from mindspore_serving.llm.sampling_params import SamplingParams

NO_TOKEN = -1
"""The token of a row whose logits allow none."""


@dataclass
class SamplerOutput:
    token_ids: list[int]
    """The chosen token per row; NO_TOKEN (-1) where no token is allowed."""
    logprobs: list[float]
    """log P(chosen token), under the distribution the row's logprobs_mode names."""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per row, the `top_logprobs` most likely (token id, logprob) pairs, most likely first (empty if not asked)."""


def greedy_with_logprobs(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of logits [n, vocab]: the argmax (ties go to the lowest id) and its log-probability, exactly
    as `Sampler.sample` computes them for a greedy row (model runners use it for multi-step decoding)."""
    logits = np.asarray(logits, dtype=np.float32)
    tokens = np.argmax(logits, axis=1)
    return tokens, logits[np.arange(len(tokens)), tokens] - _log_normaliser(logits)


def _log_normaliser(logits: np.ndarray) -> np.ndarray:
    """Per row of float logits [n, vocab]: log(sum(exp(row))), computed stably (-inf entries count as 0; a row
    of only -inf gives nan)."""
    peak = logits.max(axis=1)
    normaliser: np.ndarray = peak + np.log(np.exp(logits - peak[:, None]).sum(axis=1))
    return normaliser


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    peak = np.max(x, axis=-1, keepdims=True)
    shifted = x - peak
    logprobs: np.ndarray = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return logprobs


def top_candidates(row: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries of `row`, ranked by value descending, ties by lowest id."""
    vocab = row.shape[0]
    if k >= vocab:
        candidates = np.arange(vocab)
    else:
        head = np.argpartition(row, vocab - k)[vocab - k :]
        # argpartition breaks ties at the k-th value arbitrarily: widen to every tie (in id order), then cut.
        candidates = np.flatnonzero(row >= row[head].min())
    return candidates[np.argsort(-row[candidates], kind="stable")][:k]


def _draw(candidates: np.ndarray | None, weights: np.ndarray, generator: np.random.Generator) -> int:
    """One id drawn from unnormalised `weights` over `candidates` (None: ids 0..len-1) with one uniform number."""
    cumulative = np.cumsum(weights)
    index = int(np.searchsorted(cumulative, generator.random() * cumulative[-1], side="right"))
    if index >= len(cumulative):  # rounding reached the total: the last token with weight
        index = int(np.searchsorted(cumulative, cumulative[-1], side="left"))
    return index if candidates is None else int(candidates[index])


def _accept_or_draw(
    candidates: np.ndarray | None, weights: np.ndarray, proposed: int | None, generator: np.random.Generator
) -> int:
    """Rejection sampling of one proposed token: `proposed` with its probability under the weights, else a draw
    from the weights without it (renormalised); a plain draw when nothing is proposed. Either way the token is
    distributed as the weights say."""
    if proposed is None:
        return _draw(candidates, weights, generator)
    if candidates is None:
        at = proposed if proposed < len(weights) else None
    else:
        hits = np.flatnonzero(candidates == proposed)
        at = int(hits[0]) if len(hits) else None
    total = weights.sum()
    chance = 0.0 if at is None else weights[at] / total
    if generator.random() < chance:
        return proposed
    rest = weights.copy()
    if at is not None:
        rest[at] = 0.0
    if not rest.sum() > 0:  # only the proposed token has weight (and rounding rejected it)
        return proposed
    return _draw(candidates, rest, generator)


class Sampler:
    """Samples one token per row; `seed` seeds the generator shared by requests without their own seed."""

    # NOTE: top-p alone first looks at this many candidates and widens only if their mass falls short,
    # so peaked distributions never sort the whole vocabulary.
    TOP_P_FIRST_CANDIDATES = 64

    def __init__(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)

    def sample(
        self,
        logits: np.ndarray,
        params: Sequence[SamplingParams],
        token_histories: Sequence[Sequence[int]],
        generators: Sequence[np.random.Generator | None] | None = None,
        *,
        output_token_ids: Sequence[Sequence[int]] | None = None,
        eos_token_ids: Sequence[Collection[int]] | None = None,
        bad_words_ids: Sequence[TokenSequences] | None = None,
        bitmasks: np.ndarray | None = None,
    ) -> SamplerOutput:
        """`logits` [n, vocab]; per row its params, its prompt + output tokens (repetition penalty), its own
        generator (None: the shared one), its output tokens (presence / frequency penalties, bad words,
        min_tokens; None: no output yet), its end-of-sequence ids (min_tokens; None: none), its banned token
        sequences (bad words; None: none); `bitmasks`: None or int32 [n, ceil(vocab / 32)], the tokens each
        row's grammar allows (bit j of word w allows token 32w + j; a row of all -1 allows everything)."""
        logits = np.asarray(logits, dtype=np.float32)
        n = len(params)
        if logits.ndim != 2 or logits.shape[0] != n:
            raise ValueError(f"sampler expects logits [{n}, vocab], got shape {logits.shape}")
        per_row = (token_histories, generators, output_token_ids, eos_token_ids, bad_words_ids)
        if any(values is not None and len(values) != n for values in per_row):
            raise ValueError(
                "sampler needs one params, one token history and one generator per row (and one "
                "output, end-of-sequence set and bad word list where given)"
            )
        outputs = output_token_ids if output_token_ids is not None else [()] * n
        bad_words = bad_words_ids if bad_words_ids is not None else [()] * n
        restricted = restricted_rows(bitmasks, n)
        tokens = np.argmax(logits, axis=1)  # greedy for every row; the others are redone below
        processed_rows = []
        for i, p in enumerate(params):
            if needs_processing(p, len(outputs[i]), bad_words[i]) or (restricted is not None and restricted[i]):
                processed_rows.append(i)
            elif not p.greedy:
                tokens[i] = self._sample_row(logits[i], p, self._generator(generators, i))
        processed_logprobs = {}
        if processed_rows:
            processed = process_logits(
                np.take(logits, processed_rows, axis=0),
                [params[i] for i in processed_rows],
                [token_histories[i] for i in processed_rows],
                [outputs[i] for i in processed_rows],
                [eos_token_ids[i] if eos_token_ids is not None else () for i in processed_rows],
                [bad_words[i] for i in processed_rows],
                None if bitmasks is None else np.asarray(bitmasks)[processed_rows],
            )
            best = np.argmax(processed, axis=1)
            allowed = processed[np.arange(len(processed_rows)), best] > -np.inf
            for k, i in enumerate(processed_rows):
                p = params[i]
                if not allowed[k]:
                    tokens[i] = NO_TOKEN
                    continue
                if p.logprobs_mode == "processed":
                    processed_logprobs[i] = processed[k] - _log_normaliser(processed[k : k + 1])[0]
                tokens[i] = best[k] if p.greedy else self._sample_row(processed[k], p, self._generator(generators, i))
        return self._output(logits, params, tokens, processed_logprobs)

    def sample_requests(
        self, logits: np.ndarray, requests: Sequence, bitmasks: np.ndarray | None = None
    ) -> SamplerOutput:
        """Convenience over `sample` for objects with sampling_params, all_token_ids, output_token_ids,
        eos_token_ids, bad_words_ids and generator (Request); `bitmasks` as in `sample`, a row per request."""
        return self.sample(
            logits,
            [r.sampling_params for r in requests],
            [r.all_token_ids for r in requests],
            [r.generator for r in requests],
            output_token_ids=[r.output_token_ids for r in requests],
            eos_token_ids=[r.eos_token_ids for r in requests],
            bad_words_ids=[r.bad_words_ids for r in requests],
            bitmasks=bitmasks,
        )

    def _generator(self, generators: Sequence[np.random.Generator | None] | None, row: int) -> np.random.Generator:
        generator = generators[row] if generators is not None else None
        return generator if generator is not None else self._rng

    def _output(
        self, logits: np.ndarray, params: Sequence[SamplingParams], tokens: np.ndarray, processed_logprobs: dict
    ) -> SamplerOutput:
        """The chosen tokens with their logprobs: raw rows from log_softmax(logits), processed rows from the
        processed logprobs given."""
        n = len(params)
        log_normaliser = _log_normaliser(logits)
        chosen = logits[np.arange(n), np.maximum(tokens, 0)] - log_normaliser
        logprobs = [float(v) for v in chosen]
        top: list[list[tuple[int, float]]] = []
        for i, p in enumerate(params):
            row = processed_logprobs.get(i)
            if tokens[i] == NO_TOKEN:
                logprobs[i] = float("-inf")
                top.append([])
                continue
            if row is not None:
                logprobs[i] = float(row[tokens[i]])
            if p.top_logprobs:
                top.append(self._top(row if row is not None else logits[i] - log_normaliser[i], p.top_logprobs))
            else:
                top.append([])
        return SamplerOutput([int(t) for t in tokens], logprobs, top)

    @classmethod
    def _sample_row(cls, row: np.ndarray, params: SamplingParams, generator: np.random.Generator) -> int:
        """One token drawn from a row of logits (-inf entries are never drawn while another is finite); the row
        is not changed."""
        return _draw(*cls._distribution(row, params), generator)

    @classmethod
    def _distribution(cls, row: np.ndarray, params: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
        """What a sampled row draws from: (candidate ids, None for every id in order; their unnormalised weights)
        after temperature, top_k, top_p and min_p."""
        row = np.asarray(row, dtype=np.float64) / params.temperature
        vocab = row.shape[0]
        peak = row.max()
        if params.top_k_enabled and params.top_k < vocab:
            candidates = top_candidates(row, params.top_k)
            weights = np.exp(row[candidates] - peak)
            mass = weights.sum()  # top-p then applies to the distribution renormalised over the top k
        elif params.top_p < 1.0:
            all_weights = np.exp(row - peak)
            mass = all_weights.sum()
            k = cls.TOP_P_FIRST_CANDIDATES
            while True:
                candidates = top_candidates(row, k)
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
            assert candidates is not None  # top_p < 1 took a branch that ranks the candidates
            candidates = candidates[:keep]
        if params.min_p > 0:
            # the most likely token has weight exp(0) = 1 and survives top-k and top-p: min_p is the bar itself
            weights = np.where(weights >= params.min_p, weights, 0.0)
        return candidates, weights

    # --- speculative decoding -----------------------------------------------------------------
    def verify(
        self, logits: np.ndarray, request: Request, draft: Sequence[int], bitmasks: np.ndarray | None = None
    ) -> SamplerOutput:
        """Which of the proposed tokens `draft` a row keeps (speculative decoding), and the token that follows them:
        `logits` [len(draft) + 1, vocab], row j computed after the row's tokens and draft[:j]; `request` as for
        `sample_requests`. Returns the tokens kept, each with its logprob and top logprobs as `sample` gives them:
        an accepted prefix of the draft, then the model's own token, so that the output is distributed exactly as
        without speculation:

        * a greedy row keeps the longest prefix equal to its argmax at each position, then takes the argmax after
          it (sequential greedy decoding, token for token);
        * a sampled row (rejection sampling for a proposal that is certain) keeps draft[j] with probability p_j of
          it, where p_j is the distribution the row would draw from at that position (processing, temperature,
          top_k, top_p, min_p); at the first rejection it draws from p_j with draft[j] removed and renormalised,
          and after a fully accepted draft it draws from the last position's p.

        Each position is processed (penalties, bias, bad words, min_tokens...) as if the draft before it had been
        generated. Where a position allows no token: NO_TOKEN when it is the first; after an accepted token the row
        stops at that token (it is computed again next step, which then finds no token)."""
        logits = np.asarray(logits, dtype=np.float32)
        draft = [int(t) for t in draft]
        num_rows = len(draft) + 1
        if logits.ndim != 2 or logits.shape[0] != num_rows:
            raise ValueError(
                f"verify expects logits [{num_rows}, vocab] for a draft of {len(draft)}, got shape {logits.shape}"
            )
        params = request.sampling_params
        num_output = len(request.output_token_ids)
        processed = None
        if bitmasks is not None or any(
            needs_processing(params, num_output + j, request.bad_words_ids) for j in range(num_rows)
        ):
            # each position's tokens before it: the request's, then the proposed ones before that position
            history, output = list(request.all_token_ids), list(request.output_token_ids)
            processed = process_logits(
                logits.copy(),
                [params] * num_rows,
                [history + draft[:j] for j in range(num_rows)],
                [output + draft[:j] for j in range(num_rows)],
                [request.eos_token_ids] * num_rows,
                [request.bad_words_ids] * num_rows,
                bitmasks,
            )
        rows = processed if processed is not None else logits
        generator = request.generator if request.generator is not None else self._rng
        tokens: list[int] = []
        for j in range(num_rows):
            row = rows[j]
            if not row.max() > -np.inf:
                if not tokens:
                    tokens.append(NO_TOKEN)
                break
            proposed = draft[j] if j < len(draft) else None
            if params.greedy:
                token = int(np.argmax(row))
            else:
                candidates, weights = self._distribution(row, params)
                token = _accept_or_draw(candidates, weights, proposed, generator)
            tokens.append(token)
            if token != proposed:
                break
        processed_logprobs = {}
        if processed is not None and params.logprobs_mode == "processed":
            processed_logprobs = {
                j: processed[j] - _log_normaliser(processed[j : j + 1])[0]
                for j in range(len(tokens))
                if tokens[j] != NO_TOKEN
            }
        return self._output(
            logits[: len(tokens)], [params] * len(tokens), np.asarray(tokens, np.int64), processed_logprobs
        )

    @staticmethod
    def _top(logprobs_row: np.ndarray, count: int) -> list[tuple[int, float]]:
        return [(int(t), float(logprobs_row[t])) for t in top_candidates(logprobs_row, count)]
