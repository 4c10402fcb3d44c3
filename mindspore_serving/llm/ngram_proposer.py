"""Model-free proposals for speculative decoding: prompt lookup (n-gram matching), as vLLM's `ngram` method.

For a sequence (prompt + output so far), take its last n tokens for n from `max_n` down to `min_n`; at the first n
whose n-gram occurred earlier in the sequence, propose the (at most k) tokens that followed its latest earlier
occurrence. No occurrence: no proposal. Text that quotes its context (summaries, edits, code, answers grounded in a
retrieved passage) and a model's own repetitions are what it catches.

Pure logic over token ids; the scheduler asks it for each decode row it lets speculate (llm/scheduler.py).
"""

from collections.abc import Sequence

import numpy as np


def propose_ngram(token_ids: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to `k` tokens proposed to follow `token_ids` (see the module docstring); [] when no n-gram of length
    min_n..max_n recurs. The latest occurrence wins: it is the one nearest to what is being written."""
    length = len(token_ids)
    if k <= 0 or length < min_n + 1:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    # earlier occurrences of the last token (each the end of a candidate n-gram), latest first
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])[::-1]
    if not len(ends):
        return []
    # how far back each candidate keeps matching the sequence's tail, up to max_n tokens
    matched = np.ones(len(ends), dtype=bool)
    run = np.ones(len(ends), dtype=np.int64)
    for back in range(1, min(max_n, length - 1)):
        at = ends - back
        matched &= (at >= 0) & (tokens[np.maximum(at, 0)] == tokens[length - 1 - back])
        if not matched.any():
            break
        run += matched
    best = int(np.argmax(run))  # the longest match, the latest of those
    if run[best] < min_n:
        return []
    end = int(ends[best])
    proposal: list[int] = tokens[end + 1 : end + 1 + k].tolist()
    return proposal
