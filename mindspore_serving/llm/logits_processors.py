"""What a request's sampling parameters do to its logits before a token is chosen (numpy, on the host).

`process_logits` changes a [m, vocab] float array of the rows that need it in place, each step for the whole
array at once (a Python loop only over rows and bad words, never over tokens), in this order:
  1. repetition penalty over the prompt and the output so far (a positive logit divided by it, a negative one
     multiplied: the CTRL / Hugging Face rule);
  2. presence and frequency penalties over the output only (OpenAI's formula):
     logit[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0);
  3. logit bias, added;
  4. allowed_token_ids: every other token gets -inf;
  5. bad words: the last token of each banned sequence gets -inf when the output ends with the tokens before it
     (a one-token word: always);
  6. min_tokens: while the output has fewer tokens, the end-of-sequence ids (unless ignore_eos) and
     stop_token_ids get -inf;
  7. a grammar bitmask (llguidance's layout, int32 [m, ceil(vocab / 32)]: bit j of word w allows token 32w + j;
     a row of all -1 allows everything): tokens it does not allow get -inf.
A row may end with every logit -inf: nothing is allowed (the sampler reports token -1 for it).
Token ids outside [0, vocab) in histories, biases or banned lists are ignored.
"""

import itertools
from collections.abc import Callable, Collection, Sequence

import numpy as np

from mindspore_serving.llm.sampling_params import SamplingParams

TokenSequences = tuple[tuple[int, ...], ...]
"""Banned token sequences of one request (its bad words, tokenized)."""

_ALL_ALLOWED = -1
"""A bitmask word allowing all of its 32 tokens."""


def needs_processing(params: SamplingParams, num_output_tokens: int, bad_words_ids: TokenSequences) -> bool:
    """Whether `process_logits` would change this row (the grammar bitmask aside)."""
    return (
        params.repetition_penalty != 1.0
        or params.presence_penalty != 0
        or params.frequency_penalty != 0
        or bool(params.logit_bias)
        or bool(params.allowed_token_ids)
        or bool(bad_words_ids)
        or num_output_tokens < params.min_tokens
    )


def restricted_rows(bitmasks: np.ndarray | None, num_rows: int) -> np.ndarray | None:
    """Bool [num_rows]: the rows whose bitmask forbids something (None: no bitmasks at all)."""
    if bitmasks is None:
        return None
    bitmasks = np.asarray(bitmasks)
    if bitmasks.ndim != 2 or bitmasks.shape[0] != num_rows:
        raise ValueError(f"bitmasks must be [{num_rows}, ceil(vocab / 32)] int32, got shape {bitmasks.shape}")
    restricted: np.ndarray = (bitmasks != _ALL_ALLOWED).any(axis=1)
    return restricted


def process_logits(
    logits: np.ndarray,
    params: Sequence[SamplingParams],
    histories: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    eos_ids: Sequence[Collection[int]],
    bad_words_ids: Sequence[TokenSequences],
    bitmasks: np.ndarray | None = None,
) -> np.ndarray:
    """Applies steps 1-7 (module docstring) in place to `logits` [m, vocab] (float); per row its params, its
    prompt + output tokens, its output tokens, its end-of-sequence ids and its banned sequences; `bitmasks`
    [m, words] or None. Returns `logits`."""
    repetition = np.array([p.repetition_penalty for p in params], dtype=np.float64)
    if (repetition != 1.0).any():
        apply_repetition_penalties(logits, histories, repetition)
    presence = np.array([p.presence_penalty for p in params], dtype=np.float64)
    frequency = np.array([p.frequency_penalty for p in params], dtype=np.float64)
    if presence.any() or frequency.any():
        apply_output_penalties(logits, outputs, presence, frequency)
    if any(p.logit_bias for p in params):
        apply_logit_bias(logits, [p.logit_bias for p in params])
    if any(p.allowed_token_ids for p in params):
        keep_only(logits, [p.allowed_token_ids_array for p in params])
    if any(bad_words_ids):
        ban(logits, banned_by_bad_words(outputs, bad_words_ids))
    early = [early_stop_ids(p, eos, len(out)) for p, eos, out in zip(params, eos_ids, outputs)]
    if any(early):
        ban(logits, early)
    if bitmasks is not None:
        apply_bitmask(logits, bitmasks)
    return logits


def _flat(token_lists: Sequence[Sequence[int]], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(row index, token id) of every token of every row, ids outside [0, vocab) left out."""
    lengths = [len(tokens) for tokens in token_lists]
    tokens = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=sum(lengths))
    rows = np.repeat(np.arange(len(token_lists)), lengths)
    inside = (tokens >= 0) & (tokens < vocab)
    return rows[inside], tokens[inside]


def apply_repetition_penalties(logits: np.ndarray, histories: Sequence[Sequence[int]], penalties: np.ndarray) -> None:
    """Each row's seen tokens (once however often seen): positive logits divided by its penalty, negative ones
    multiplied (1.0 leaves a row as it is)."""
    active = np.flatnonzero(penalties != 1.0)
    rows, tokens = _flat([histories[i] for i in active.tolist()], logits.shape[1])
    rows = active[rows]
    values = logits[rows, tokens]
    penalty = penalties[rows]
    # repeated (row, token) pairs write the same value: the penalty applies once
    logits[rows, tokens] = np.where(values > 0, values / penalty, values * penalty)


def apply_output_penalties(
    logits: np.ndarray, outputs: Sequence[Sequence[int]], presence: np.ndarray, frequency: np.ndarray
) -> None:
    """OpenAI's presence and frequency penalties over each row's output tokens."""
    active = np.flatnonzero((presence != 0) | (frequency != 0))
    vocab = logits.shape[1]
    rows, tokens = _flat([outputs[i] for i in active.tolist()], vocab)
    # only the tokens the outputs hold change: count each (row, token) pair once over the flat index
    cells, counts = np.unique(active[rows] * vocab + tokens, return_counts=True)
    rows, tokens = cells // vocab, cells % vocab
    logits[rows, tokens] -= frequency[rows] * counts + presence[rows]


def apply_logit_bias(logits: np.ndarray, biases: Sequence[tuple[tuple[int, float], ...]]) -> None:
    """Adds each row's (token id, bias) pairs."""
    pairs = [
        (row, token, bias)
        for row, row_biases in enumerate(biases)
        for token, bias in row_biases
        if 0 <= token < logits.shape[1]
    ]
    if pairs:
        rows, tokens, values = zip(*pairs)
        np.add.at(logits, (np.array(rows), np.array(tokens)), np.array(values, dtype=logits.dtype))


def keep_only(logits: np.ndarray, allowed: Sequence[np.ndarray]) -> None:
    """Rows with allowed ids (an int array per row): every token outside them gets -inf (none: the row is left
    as it is)."""
    vocab = logits.shape[1]
    lengths = [len(ids) for ids in allowed]
    rows = np.repeat(np.arange(len(allowed)), lengths)
    tokens = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in allowed])
    inside = (tokens >= 0) & (tokens < vocab)
    banned = np.zeros(logits.shape, dtype=bool)
    banned[[i for i, length in enumerate(lengths) if length]] = True
    banned[rows[inside], tokens[inside]] = False
    np.putmask(logits, banned, -np.inf)


def ban(logits: np.ndarray, banned: Sequence[Collection[int]]) -> None:
    """Each row's banned token ids get -inf."""
    rows, tokens = _flat([tuple(ids) for ids in banned], logits.shape[1])
    logits[rows, tokens] = -np.inf


def banned_by_bad_words(outputs: Sequence[Sequence[int]], bad_words_ids: Sequence[TokenSequences]) -> list[list[int]]:
    """Per row, the last token of each banned sequence whose other tokens end the output."""
    banned = []
    for output, sequences in zip(outputs, bad_words_ids):
        row: list[int] = []
        for sequence in sequences:
            prefix = len(sequence) - 1
            if prefix == 0 or (len(output) >= prefix and tuple(output[-prefix:]) == sequence[:-1]):
                row.append(sequence[-1])
        banned.append(row)
    return banned


def early_stop_ids(params: SamplingParams, eos_ids: Collection[int], num_output_tokens: int) -> tuple[int, ...]:
    """The ids that may not come yet because the output is shorter than min_tokens: the end-of-sequence ids
    (unless ignored) and the stop token ids; () once it has min_tokens tokens."""
    if num_output_tokens >= params.min_tokens:
        return ()
    return params.stop_token_ids + (() if params.ignore_eos else tuple(eos_ids or ()))


def bitmask_allows(bitmasks: np.ndarray, vocab: int) -> np.ndarray:
    """Bool [m, vocab] of int32 bitmasks [m, words]: bit j of word w allows token 32w + j; tokens past the
    mask's words are not allowed."""
    words = np.ascontiguousarray(bitmasks, dtype="<i4")
    allowed = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little").view(bool)
    if allowed.shape[1] >= vocab:
        return allowed[:, :vocab]
    return np.pad(allowed, ((0, 0), (0, vocab - allowed.shape[1])))


def apply_bitmask(logits: np.ndarray, bitmasks: np.ndarray) -> None:
    """Tokens a row's bitmask does not allow get -inf; rows of all -1 are left as they are."""
    restricted = restricted_rows(bitmasks, logits.shape[0])
    assert restricted is not None  # bitmasks were given
    rows = np.flatnonzero(restricted)
    if len(rows):
        allowed = bitmask_allows(np.asarray(bitmasks)[rows], logits.shape[1])
        logits[rows] = np.where(allowed, logits[rows], -np.inf)


def bad_words_token_ids(encode: Callable[[str], Sequence[int]], words: Sequence[str]) -> TokenSequences:
    """The token sequences that spell `words` (SamplingParams.bad_words), as vLLM finds them: each word without
    its leading whitespace, alone and after a space (a word inside a text), tokenized by `encode` (text -> ids,
    without special tokens); a word of whitespace only, as it is. Distinct non-empty sequences, in order."""
    sequences = []
    for word in words:
        stripped = word.lstrip()
        for text in (stripped, " " + stripped) if stripped else (word,):
            ids = tuple(int(t) for t in encode(text))
            if ids and ids not in sequences:
                sequences.append(ids)
    return tuple(sequences)
