"""Several choices of one request (SamplingParams n / best_of): the prompt is computed once, then the request forks.

A request with k choices runs alone until its prompt's last token is computed. From that one logits row the first
tokens of all k choices are sampled, each choice with its own random stream (`choice_generator`), and choices
1..k-1 become child requests (`make_child`) that the scheduler runs like any other (scheduler.py `_fork`):

* they share the parent's full prompt blocks (the block manager's `fork`: reference count + 1 each). A shared block
  is read-only, because a request writes only positions >= its num_computed_tokens, which start after them;
* the parent's last, partial block is not shared: the copy-on-write of that block is done by recomputing it. A
  child starts with num_computed_tokens at the last full-block boundary, so its first step computes the partial
  tail again (at most block_size - 1 prompt tokens) together with its first token, into a block of its own. The
  runners have no block-copy operation; recomputing a tail costs less than one block of prefill;
* a child's id derives from its parent's (f"{parent}#{choice}", made unique if taken), its `group_id` is the
  parent's id and `choice` its index; the engine reports every choice under the parent's id with
  RequestOutput.index = choice. Aborting the parent's id aborts every choice.

Until it forks, a request holds one batch seat (max_num_seqs) per choice, so that its children always have a row.
"""

from collections.abc import Callable, Iterable

import numpy as np

from mindspore_serving.llm.request import Request


def choice_generator(seed: int | None, choice: int) -> np.random.Generator | None:
    """The random stream of choice `choice`: seeded with seed + choice when the request has a seed (choice 0 is
    the request's own generator), else None (the engine's shared generator)."""
    return None if seed is None else np.random.default_rng(seed + choice)


def child_id(parent_id: str, choice: int, taken: Callable[[str], bool]) -> str:
    """f"{parent_id}#{choice}", with more '#' appended while `taken` says the id is in use."""
    request_id = f"{parent_id}#{choice}"
    while taken(request_id):
        request_id += "#"
    return request_id


def make_child(parent: Request, choice: int, request_id: str) -> Request:
    """Choice `choice` of `parent`, not yet forked: the same prompt and params, no tokens computed or sampled, its
    own random stream and a copy of the parent's grammar state (taken before the parent's first token)."""
    child = Request(
        request_id,
        parent.prompt_token_ids,
        parent.sampling_params,
        parent.arrival_time,
        parent.eos_token_ids,
        parent.prompt,
    )
    child.group_id = parent.group_id
    child.choice = choice
    child.num_pending_choices = 0
    child.generator = choice_generator(parent.sampling_params.seed, choice)
    child.bad_words_ids = parent.bad_words_ids  # set by the engine after building the parent
    if parent.grammar is not None:
        child.grammar = parent.grammar.fork()
    child.first_scheduled_time = parent.first_scheduled_time
    child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
    return child


def make_children(parent: Request, taken: Callable[[str], bool]) -> list[Request]:
    """The parent's pending choices (1..k-1) as child requests, with ids unique under `taken`."""
    children: list[Request] = []
    ids = set()
    for choice in range(1, parent.num_pending_choices + 1):
        request_id = child_id(parent.request_id, choice, lambda i: i in ids or taken(i))
        ids.add(request_id)
        children.append(make_child(parent, choice, request_id))
    return children


def expand_rows(rows: list[int], requests: list[Request], children_of: Callable[[Request], Iterable[Request]]) -> int:
    """Appends, for each request that forks at this sampled row, one (row, child) pair per child to `rows` and
    `requests` (in place), so that each child samples its first token from its parent's logits row. Returns how
    many rows there were before (the parents' own rows come first)."""
    num_rows = len(rows)
    for k in range(num_rows):
        for child in children_of(requests[k]):
            rows.append(rows[k])
            requests.append(child)
    return num_rows
