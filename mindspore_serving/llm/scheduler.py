"""Which requests run in the next model step, and with how many tokens each.

Pure bookkeeping, no I/O: `schedule()` returns a `SchedulerOutput` (plain data: one `ScheduledSeq`
with its `SeqStep` per request in the step), the caller runs the model and samples, and
`update_from_output()` appends the sampled tokens and finishes requests.

Each step:
  1. Running requests that need one token (decodes) are scheduled first, then running requests in
     the middle of a chunked prefill, each in admission order. When the block pool cannot give a
     request the blocks it needs, the newest running request (the most recently admitted; a
     readmitted request counts as new) is preempted (recompute): its blocks are freed and it goes
     back to the front of the waiting queue, keeping its generated tokens, which it recomputes
     together with its prompt when readmitted.
  2. If nothing was preempted, waiting requests join in FCFS order while the batching policy, the token
     budget, the prefill share, max_num_seqs and the free blocks allow. With chunked prefill a prompt that does
     not fit in what is left of the budget is cut, and the rest is computed in later steps.
  3. With speculative decoding (SchedulerConfig.speculative) and fewer running requests than its
     disable_by_batch_size, each decode row that knows its last token may get proposed tokens
     (llm/ngram_proposer.py), cut to what the budget, the free blocks, max_new_tokens and max_model_len leave (a
     proposal never delays a prompt or preempts anyone): its SeqStep computes the last token and the proposal and
     asks for every position's logits (`ScheduledSeq.draft`). `update_from_output` then takes the accepted prefix
     of the proposal and one more token; the accepted ones count as computed, the keys and values of the rejected
     ones are written again by later steps, and the blocks reserved for them go back to the pool.
A request yields new tokens only in the step that computes its last known token.

A request scoring its prompt (SamplingParams.prompt_logprobs, llm/prompt_scores.py) computes all of it, whatever
the prefix cache holds, and its prompt chunks ask the runner for every token's logits (SeqStep.all_logits). One with
max_new_tokens 0 finishes (reason "length", no token) in the step that completes its prompt.

Which waiting requests may join at all is the batching policy's call (batching_policy.py: continuous batching
lets any join, static batching only the batch formed when nothing ran).

Multi-step rounds: `reserve_decode_steps(plan, n)` reserves blocks for a plan run n steps back to back and
`update_from_steps` records its tokens.

Planning ahead (async scheduling): `advance_in_flight(plan, n)` takes a greedy plan whose
tokens are still being computed as done: each row gets PLACEHOLDER tokens for the n tokens it will produce,
so that `schedule()` can plan the next step (its rows continue from the placeholders). A request that will
reach max_new_tokens (or max_model_len) within the plan leaves the batch and frees its blocks at once; it
finishes when its tokens arrive. `update_from_steps` puts the real tokens in place of the placeholders.

Choices (SamplingParams n / best_of, llm/choices.py): a request with k choices holds k batch seats of max_num_seqs
from its admission. The step that computes its prompt's last token samples k first tokens from that row (the
caller gets the children to sample for from `children_to_fork` and passes their tokens to `update_from_output`);
the request then forks: choices 1..k-1 join the running requests as children sharing its full prompt blocks, and
run, are preempted and finish like any request. `take_forked` hands the new children to the engine;
`group_members` names every unfinished choice of a request (abort).
"""

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from mindspore_serving.llm.batching_policy import BatchingPolicy, make_batching_policy
from mindspore_serving.llm.block_manager import BlockManager
from mindspore_serving.llm.choices import make_children
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.model_io import PLACEHOLDER, SeqStep
from mindspore_serving.llm.ngram_proposer import propose_ngram
from mindspore_serving.llm.request import FinishReason, Request, RequestStatus

_T = TypeVar("_T")


@dataclass
class ScheduledSeq:
    """One request's share of a step."""

    request_id: str
    num_tokens: int
    """Tokens computed this step: a prompt chunk, a recompute chunk, or 1 for a decode."""
    seq_step: SeqStep
    samples: bool
    """True when this step computes the request's last known token, so its logits give the next token;
    False for a prefill chunk that stops short of the end (its logits are discarded)."""
    is_prefill: bool
    draft: tuple[int, ...] = ()
    """Tokens proposed to follow (speculative decoding): the row computes its token then these, asking for every
    position's logits, and keeps the longest prefix the model agrees with plus one token of its own."""


@dataclass
class SchedulerOutput:
    """The plan of one step. `scheduled` rows are in the order the runner gets their `SeqStep`s."""

    step_id: int
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)

    @property
    def seq_steps(self) -> list[SeqStep]:
        return [row.seq_step for row in self.scheduled]

    @property
    def request_ids(self) -> list[str]:
        return [row.request_id for row in self.scheduled]

    @property
    def num_batched_tokens(self) -> int:
        return sum(row.num_tokens + len(row.draft) for row in self.scheduled)

    @property
    def num_draft_tokens(self) -> int:
        return sum(len(row.draft) for row in self.scheduled)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(row.num_tokens for row in self.scheduled if row.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(row.num_tokens + len(row.draft) for row in self.scheduled if not row.is_prefill)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class RequestDelta:
    """What one step changed for one request (returned by `update_from_output`)."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None


class _Budget:
    def __init__(self, tokens: int, prefill_tokens: int) -> None:
        self.tokens = tokens
        self.prefill_tokens = prefill_tokens

    def take(self, num_tokens: int, prefill: bool, sign: int = 1) -> None:
        self.tokens -= sign * num_tokens
        if prefill:
            self.prefill_tokens -= sign * num_tokens


class Scheduler:
    """Batching over a paged KV cache; see the module docstring for the algorithm. `policy` defaults to the one
    config.batching names."""

    def __init__(
        self, config: SchedulerConfig, clock: Callable[[], float] = time.monotonic, policy: BatchingPolicy | None = None
    ) -> None:
        self.config = config
        self.clock = clock
        self.policy = policy or make_batching_policy(config)
        self.block_manager = BlockManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        """Admission order: the last one is the newest, preempted first."""
        self.requests: dict[str, Request] = {}
        """Unfinished requests by id."""
        self._advanced: dict[str, tuple[int, int]] = {}
        """Requests holding PLACEHOLDER tokens (advance_in_flight): id -> (placeholders, computed tokens added)."""
        self._draining: dict[str, Request] = {}
        """Requests out of the batch, blocks freed, whose last tokens are still being computed."""
        self._forking: dict[str, list[Request]] = {}
        """Requests sampling their first token (children_to_fork) -> their children, until they fork."""
        self._groups: dict[str, list[Request]] = {}
        """Group id -> every choice of a request that forked, until they have all finished."""
        self._forked: list[Request] = []
        """Children created since the last `take_forked`."""
        self._step_id = 0
        self._seq_ids = itertools.count()
        self.num_preemptions = 0
        self.last_arrival_time = float("-inf")

    # --- queue --------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        if request.status is not RequestStatus.WAITING:
            raise ValueError(f"request {request.request_id!r} must be WAITING to be added, it is {request.status.name}")
        request.seq_id = next(self._seq_ids)
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.last_arrival_time = self.clock()

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def group_members(self, request_id: str) -> list[Request]:
        """The unfinished choices of the request added as `request_id` (itself, and its children once it forked);
        [] when none is left or the id is not a request's own (a child's)."""
        group = self._groups.get(request_id)
        if group is not None:
            return [r for r in group if not r.finished]
        request = self.requests.get(request_id)
        return [request] if request is not None and request.group_id == request_id else []

    def take_forked(self) -> list[Request]:
        """The children that forked off their requests since the last call (each got its first token then)."""
        forked, self._forked = self._forked, []
        return forked

    def children_to_fork(self, request: Request) -> list[Request]:
        """The children `request` forks into at this sampled token (its first): one per pending choice, made once
        and kept until `update_from_output` forks them; [] when it has no pending choice. Their first tokens
        are sampled from the request's logits row, each with its own generator."""
        if not request.num_pending_choices:
            return []
        children = self._forking.get(request.request_id)
        if children is None:
            children = self._forking[request.request_id] = make_children(request, self._id_taken)
        return children

    def _id_taken(self, request_id: str) -> bool:
        return request_id in self.requests or any(
            request_id == c.request_id for children in self._forking.values() for c in children
        )

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_seats(self) -> int:
        """Batch rows the running requests hold, counting the choices they will fork (max_num_seqs bounds it)."""
        return sum(r.num_seats for r in self.running)

    def finish_request(self, request_id: str, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> bool:
        """Finishes an unfinished request in any state (abort, stop string, error) and frees its blocks
        at once. Returns False when the id is unknown or already finished. Call it between steps."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        if request.status is not RequestStatus.RUNNING:
            self.waiting.remove(request)
        elif request_id not in self._draining:
            self.running.remove(request)
        self._finish(request, status)
        return True

    # --- one step -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self._step_id += 1
        budget = _Budget(self.config.max_num_batched_tokens, self.config.prefill_token_cap)
        scheduled: dict[str, int] = {}
        preempted: list[str] = []
        self._schedule_running(budget, scheduled, preempted)
        if not preempted:
            self._schedule_waiting(budget, scheduled)
        drafts = self._propose_drafts(budget, scheduled) if self.speculating else {}
        return self._build_output(scheduled, preempted, drafts)

    @property
    def speculating(self) -> bool:
        """Whether decode rows may carry proposed tokens now: speculative decoding is configured and the batch is
        below its disable_by_batch_size."""
        spec = self.config.speculative
        return spec is not None and (
            spec.disable_by_batch_size is None or len(self.running) < spec.disable_by_batch_size
        )

    def _propose_drafts(self, budget: _Budget, scheduled: dict[str, int]) -> dict[str, tuple[int, ...]]:
        """The proposed tokens of the step's decode rows that speculate (request id -> draft), each cut to what
        the budget, the free blocks, max_new_tokens and max_model_len leave; asked for after every row and prompt
        of the step is placed, so that a proposal never delays a prompt or preempts anyone."""
        spec = self.config.speculative
        assert spec is not None  # asked only while speculating
        drafts = {}
        for request_id, num_tokens in scheduled.items():
            request = self.requests[request_id]
            if num_tokens != 1 or request.num_tokens_to_compute != 1 or not _may_speculate(request):
                continue
            params = request.sampling_params
            # every proposed token accepted plus the model's own must stay within the request's limits
            room = min(
                spec.num_speculative_tokens,
                budget.tokens,
                params.max_new_tokens - request.num_output_tokens - 1,
                self.config.max_model_len - request.num_tokens - 1,
            )
            if room <= 0:
                continue
            draft = propose_ngram(request.all_token_ids, room, spec.prompt_lookup_min, spec.prompt_lookup_max)
            if draft and self.block_manager.append_slots(request, 1 + len(draft)):
                drafts[request_id] = tuple(draft)
                budget.take(len(draft), prefill=False)
        return drafts

    def _schedule_running(self, budget: _Budget, scheduled: dict[str, int], preempted: list[str]) -> None:
        decodes = [r for r in self.running if not r.is_prefilling]
        prefills = [r for r in self.running if r.is_prefilling]
        for request in decodes + prefills:
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_tokens = min(request.num_tokens_to_compute, budget.tokens)
            if request.is_prefilling:
                num_tokens = min(num_tokens, budget.prefill_tokens)
            if num_tokens <= 0:
                continue
            if not self._reserve(request, num_tokens, budget, scheduled, preempted):
                continue
            scheduled[request.request_id] = num_tokens
            budget.take(num_tokens, request.is_prefilling)

    def _reserve(
        self, request: Request, num_tokens: int, budget: _Budget, scheduled: dict[str, int], preempted: list[str]
    ) -> bool:
        """Gets the request blocks for `num_tokens` more tokens, preempting the newest running requests
        (possibly the request itself) until they fit. False when the request itself was preempted."""
        while not self.block_manager.append_slots(request, num_tokens):
            victim = self.running[-1]
            if victim.request_id in scheduled:  # scheduled earlier in this step: give its budget back
                victim_tokens = scheduled.pop(victim.request_id)
                budget.take(victim_tokens, victim.is_prefilling, sign=-1)
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _schedule_waiting(self, budget: _Budget, scheduled: dict[str, int]) -> None:
        config = self.config
        self.policy.open_admission(self.waiting, len(self.running))
        slots = self._prefill_slots(scheduled)
        seats = self.num_seats
        while self.waiting and slots != 0:
            request = self.waiting[0]
            if seats + request.num_seats > config.max_num_seqs or not self.policy.may_join(request):
                break
            computed_blocks, num_cached = self.block_manager.get_computed_blocks(request)
            if _scoring(request):  # its prompt logprobs need the logits of every prompt position
                computed_blocks, num_cached = [], 0
            num_tokens = request.num_tokens - num_cached
            limit = min(budget.tokens, budget.prefill_tokens)
            if num_tokens > limit:
                if not config.enable_chunked_prefill or limit <= 0:
                    break
                num_tokens = limit
            if not self.block_manager.allocate(request, num_tokens, computed_blocks):
                break
            self.waiting.popleft()
            self.running.append(request)
            request.set_status(RequestStatus.RUNNING)
            request.num_computed_tokens = num_cached
            request.num_cached_prompt_tokens = num_cached
            if request.first_scheduled_time is None:
                request.first_scheduled_time = self.clock()
            scheduled[request.request_id] = num_tokens
            budget.take(num_tokens, prefill=True)
            seats += request.num_seats
            if slots is not None:
                slots -= 1

    def _prefill_slots(self, scheduled: dict[str, int]) -> int | None:
        """How many prompts may still join this step (SchedulerConfig.max_prefills_per_decode_step), None: any."""
        cap = self.config.max_prefills_per_decode_step
        if cap is None:
            return None
        prefills = sum(1 for request_id in scheduled if self.requests[request_id].is_prefilling)
        if prefills == len(scheduled):  # nothing decodes in this step
            return None
        return max(0, cap - prefills)

    def _build_output(
        self, scheduled: dict[str, int], preempted: list[str], drafts: Mapping[str, tuple[int, ...]]
    ) -> SchedulerOutput:
        output = SchedulerOutput(step_id=self._step_id, preempted_request_ids=preempted)
        for request_id, num_tokens in scheduled.items():
            request = self.requests[request_id]
            start = request.num_computed_tokens
            end = start + num_tokens
            draft = drafts.get(request_id, ())
            scores = request.prompt_scores if _scoring(request) else None
            step = SeqStep(
                token_ids=request.all_token_ids[start:end] + list(draft),
                start_pos=start,
                block_table=list(request.block_table),
                seq_id=request.seq_id,
                all_logits=bool(draft) or (scores is not None and scores.wants_logits(start, num_tokens)),
            )
            is_decode = num_tokens == 1 and request.num_output_tokens > 0 and end == request.num_tokens
            # max_new_tokens 0 (a scored prompt): the step that completes the prompt samples nothing
            samples = end == request.num_tokens and request.sampling_params.max_new_tokens > 0
            output.scheduled.append(
                ScheduledSeq(request_id, num_tokens, step, samples=samples, is_prefill=not is_decode, draft=draft)
            )
        return output

    def update_from_output(
        self,
        output: SchedulerOutput,
        sampled_token_ids: Sequence[None | int | Sequence[int]],
        fork_token_ids: Mapping[int, Sequence[int]] | None = None,
    ) -> list[RequestDelta]:
        """Records a finished step. `sampled_token_ids` has one entry per row of `output.scheduled`:
        the sampled token for rows with `samples`, anything (None) for the others; for a row with a draft, its
        tokens: the proposed tokens the model accepted (a prefix of the draft, whose keys/values the step wrote)
        then the model's own next token. A request takes them in order until it stops. `fork_token_ids[i]`: for
        a row whose request forks (`children_to_fork`), the first tokens of its children, in their order.

        Rows of requests finished since `schedule()` (aborted) are skipped. Returns one delta per
        request that got a token, a forked request's children right after it."""
        now = self.clock()
        deltas = []
        forks = fork_token_ids or {}
        for i, (row, request, token) in enumerate(
            self._live_rows(output, sampled_token_ids, "update_from_output", with_skipped=True)
        ):
            if request is None:
                continue
            request.num_computed_tokens += row.num_tokens
            self.block_manager.cache_full_blocks(request)
            if not row.samples:
                if not request.num_tokens_to_compute:  # max_new_tokens 0: its prompt computed, it is done
                    self.running.remove(request)
                    self._finish(request, RequestStatus.FINISHED_LENGTH)
                    deltas.append(RequestDelta(request.request_id, [], True, request.finish_reason))
                continue
            if token is None:
                raise ValueError(f"no sampled token for request {row.request_id}, which completed its tokens")
            children = self._fork(request, forks.get(i, ())) if request.num_pending_choices else []
            tokens = [int(token)] if isinstance(token, (int, np.integer)) else [int(t) for t in token]
            if len(tokens) > 1 + len(row.draft) or tokens[:-1] != list(row.draft[: len(tokens) - 1]):
                raise ValueError(
                    f"request {row.request_id} got tokens {tokens} for its draft {list(row.draft)}: "
                    f"only an accepted prefix of the draft and one token may follow"
                )
            for j, token_id in enumerate(tokens):
                if self._accept(request, token_id, now):
                    tokens = tokens[: j + 1]
                    break
                if j < len(tokens) - 1:  # an accepted proposed token: the step wrote its keys and values
                    request.num_computed_tokens += 1
                    self.block_manager.cache_full_blocks(request)
            if row.draft and not request.finished:
                # the blocks reserved for rejected proposed tokens go back: speculation holds no more than decoding
                self.block_manager.trim(request, request.num_tokens)
            deltas.append(RequestDelta(request.request_id, tokens, request.finished, request.finish_reason))
            for child in children:
                deltas.append(
                    RequestDelta(child.request_id, list(child.output_token_ids), child.finished, child.finish_reason)
                )
        return deltas

    def _fork(self, parent: Request, tokens: Sequence[int]) -> list[Request]:
        """Forks `parent`, whose prompt was just computed, into the children `children_to_fork` made, with their
        first `tokens`: they share its full blocks and run from now on (a child whose first token ends it
        finishes at once)."""
        children = self._forking.pop(parent.request_id, None)
        if children is None or len(tokens) != len(children):
            raise ValueError(
                f"request {parent.request_id} forks into {parent.num_pending_choices} choices but got "
                f"{len(tokens)} first tokens for them"
            )
        now = self.clock()
        parent.num_pending_choices = 0
        self._groups[parent.group_id] = [parent] + children
        for child in children:
            self.block_manager.fork(parent, child)
            child.seq_id = next(self._seq_ids)
            child.set_status(RequestStatus.RUNNING)
            self.requests[child.request_id] = child
            self.running.append(child)
        self.policy.add_choices(parent, children)
        self._forked.extend(children)
        for child, token in zip(children, tokens):
            self._accept(child, int(token), now)
        return children

    def reserve_decode_steps(self, output: SchedulerOutput, num_steps: int) -> int:
        """Turns a plan whose rows all sample (decode rows, and prompts completed by this step) into
        `num_steps` steps run back to back (multi-step decoding): the first computes the plan as it is, each
        next one decodes every row once more. Reserves each row's blocks for its tokens of the round and
        refreshes the plan's block tables. The number of steps is cut so that no row outgrows max_model_len;
        returns it, or 1 (the plan unchanged) when a row does not sample (a prompt chunk), when the plan computes
        prompts and the batch still has room (their first tokens are sent after one step, and another prompt
        may join the next step: prompts ride in rounds only at a full batch, where nothing could join), or when
        blocks are short."""
        if num_steps <= 1 or not output.scheduled or output.preempted_request_ids:
            return 1
        if any(not row.samples for row in output.scheduled):
            return 1
        if self.num_seats < self.config.max_num_seqs and any(row.is_prefill for row in output.scheduled):
            # room in the batch: a prompt's first token goes out after one step, and a waiting one can join
            return 1
        requests = [self.requests[row.request_id] for row in output.scheduled]
        num_steps = min(
            [num_steps]
            + [
                self.config.max_model_len - r.num_computed_tokens - row.num_tokens + 1
                for row, r in zip(output.scheduled, requests)
            ]
        )
        if num_steps <= 1:
            return 1
        for row, request in zip(output.scheduled, requests):
            # a short pool leaves blocks reserved ahead: they serve the next steps
            if not self.block_manager.append_slots(request, row.num_tokens + num_steps - 1):
                return 1
        for row, request in zip(output.scheduled, requests):
            row.seq_step.block_table = list(request.block_table)
        return num_steps

    def update_from_steps(self, output: SchedulerOutput, token_ids: Sequence[Sequence[int]]) -> list[RequestDelta]:
        """Records the steps of a plan given to `reserve_decode_steps`: `token_ids[i]` are row i's tokens, one
        per step (the first one completes the row's query: a decode token or a whole prompt). A request takes
        them in order until it stops (its remaining tokens were computed ahead and are dropped). Returns one
        delta per request still running at the start."""
        now = self.clock()
        deltas = []
        for row, request, tokens in self._live_rows(output, token_ids, "update_from_steps"):
            assert request is not None  # without with_skipped, every row given is live
            if request.num_pending_choices and row.samples:
                raise RuntimeError(
                    f"request {request.request_id} forks at this step: its first tokens are sampled "
                    f"by the engine (update_from_output), not chosen by the runner"
                )
            self._rewind(request)
            draining = request.request_id in self._draining  # its blocks are gone: nothing to cache
            taken: list[int] = []
            for token in tokens:
                request.num_computed_tokens += row.num_tokens if not taken else 1
                if not draining:
                    self.block_manager.cache_full_blocks(request)
                taken.append(int(token))
                if self._accept(request, int(token), now):
                    break
            if draining and not request.finished:
                raise RuntimeError(
                    f"request {request.request_id} left the batch to finish in step "
                    f"{output.step_id}, but {len(taken)} tokens did not finish it"
                )
            deltas.append(RequestDelta(request.request_id, taken, request.finished, request.finish_reason))
        return deltas

    # --- planning ahead (async scheduling) ----------------------------------------------------
    def advance_in_flight(self, output: SchedulerOutput, num_steps: int) -> None:
        """Takes the plan given to `reserve_decode_steps` (`num_steps` steps, every row sampling), whose tokens
        the runner is still computing, as computed: each row that goes on gets one PLACEHOLDER per token it
        will produce; a row that will reach its length limit within the plan leaves the batch and frees its
        blocks (the runner has the plan already; blocks it writes after they are handed on are written again
        by their new owner's later steps before anything reads them). Then `schedule()` plans the next step.
        `update_from_steps(output, tokens)` must follow, before the plan after that is advanced."""
        for row in output.scheduled:
            request = self.requests.get(row.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue
            if (
                not row.samples
                or request.num_tokens_to_compute != row.num_tokens
                or request.request_id in self._advanced
            ):
                raise RuntimeError(
                    f"request {request.request_id} cannot be advanced over step {output.step_id}: {request!r}"
                )
            params = request.sampling_params
            room = min(
                params.max_new_tokens - request.num_output_tokens, self.config.max_model_len - request.num_tokens
            )
            if room <= num_steps:
                # the blocks full of the tokens this plan computes stay shareable (whoever takes them runs after it)
                request.num_computed_tokens += row.num_tokens
                self.block_manager.cache_full_blocks(request)
                request.num_computed_tokens -= row.num_tokens
                self.running.remove(request)
                self.block_manager.free(request)
                self._draining[request.request_id] = request
                continue
            request.num_computed_tokens += row.num_tokens + num_steps - 1
            for _ in range(num_steps):
                request.append_output_token(PLACEHOLDER)
            self._advanced[request.request_id] = (num_steps, row.num_tokens + num_steps - 1)

    def fits_without_preemption(self) -> bool:
        """Whether every running request can get the blocks for all the tokens it has to compute, so that the
        next `schedule()` preempts nothing (a request carrying placeholders must not be preempted: it would
        recompute them)."""
        need = sum(self.block_manager.blocks_to_append(r, r.num_tokens_to_compute) for r in self.running)
        return need <= self.block_manager.num_free_blocks

    def _rewind(self, request: Request) -> None:
        """Takes back a request's placeholders (advance_in_flight) before its real tokens are recorded."""
        advanced = self._advanced.pop(request.request_id, None)
        if advanced is not None:
            num_tokens, num_computed = advanced
            request.pop_output_tokens(num_tokens)
            request.num_computed_tokens -= num_computed

    def _live_rows(
        self, output: SchedulerOutput, values: Sequence[_T], caller: str, with_skipped: bool = False
    ) -> Iterator[tuple[ScheduledSeq, Request | None, _T]]:
        """(row, request, value) for each row of the plan whose request still runs (an aborted one is skipped,
        or given with request None when `with_skipped`); `values` has one entry per row."""
        if len(values) != len(output.scheduled):
            raise ValueError(f"{caller} got {len(values)} values for the {len(output.scheduled)} rows of the plan")
        for row, value in zip(output.scheduled, values):
            request = self.requests.get(row.request_id)
            if request is not None and request.status is RequestStatus.RUNNING:
                yield row, request, value
            elif with_skipped:
                yield row, None, value

    def _accept(self, request: Request, token: int, now: float) -> bool:
        """Appends a sampled token; finishes the request when it stops. True when it finished."""
        request.append_output_token(token)
        if request.first_token_time is None:
            request.first_token_time = now
        request.last_token_time = now
        status = request.check_stop(self.config.max_model_len)
        if status is None:
            return False
        if request.request_id not in self._draining:
            self.running.remove(request)
        self._finish(request, status)
        return True

    # --- internals ----------------------------------------------------------------------------
    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.set_status(RequestStatus.PREEMPTED)
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        self._rewind(request)  # finished before its tokens came (abort, failed step): no placeholders stay
        self.block_manager.free(request)
        request.set_status(status)
        request.finished_time = self.clock()
        del self.requests[request.request_id]
        self.policy.forget(request.request_id)
        self._draining.pop(request.request_id, None)
        self._forking.pop(request.request_id, None)  # finished before it forked (abort, failed step)
        group = self._groups.get(request.group_id)
        if group is not None and all(r.finished for r in group):
            del self._groups[request.group_id]


def _may_speculate(request: Request) -> bool:
    """Whether a decoding request may verify proposed tokens this step: it knows its last token (not a
    placeholder of a step in flight) and its grammar, if any, still accepts tokens."""
    return (
        request.num_output_tokens > 0
        and request.output_token_ids[-1] != PLACEHOLDER
        and (request.grammar is None or request.grammar.error is None)
        and not request.num_pending_choices
        and not _scoring(request)
    )


def _scoring(request: Request) -> bool:
    """Whether the request still needs the logits of its prompt positions (SamplingParams.prompt_logprobs)."""
    return request.prompt_scores is not None and not request.prompt_scores.complete
