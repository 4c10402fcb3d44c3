"""How the engine core runs its scheduler's plans on the model runner, and what a step produced per request.

Three executors, one per way of stepping; `make_step_executor` picks one when the engine core is built, from
the config and what the runner declares it can do (model_io):

* `SingleStepExecutor`: schedule, run one model step, sample, update.
* `MultiStepExecutor` (num_scheduler_steps > 1, a MultiStepRunner): a plan whose every row the runner can
  choose greedily runs as a round of steps back to back in one `run_greedy` call.
* `AsyncStepExecutor` (async_scheduling, a StepSubmitter): a greedy step stays in flight when `step()` returns;
  the next `step()` plans and submits the following step first, then collects this one's tokens, so the
  runner always has the next step queued while the engine does its own work.

Mixed steps: with a runner that runs them (model_io.submits_mixed_steps: the agents), a plan holding both rows the
runner can choose greedily and rows the engine must sample (a grammar, a temperature, penalties...) runs as one
mixed step: the runner returns the greedy rows' tokens and only the other rows' logits, which the engine samples.
Without one, such a plan has the logits of all its rows returned and samples every row in the engine. A plan
with rows verifying proposed tokens (speculative decoding) runs as a mixed step too when some of them are the
runner's to choose: those bring back only the greedy token and logprob at each position (all their verification
needs), the others every position's logits.

Structured output: a plan with a row under a grammar samples in the engine. The grammar bitmasks of its rows are
computed on llguidance's threads while the model computes the step (started right before the runner gets the plan; a
row verifying proposed tokens gets one per position) and handed to the sampler with the logits; after the step each
grammar is fed its request's new token. A row whose grammar allows no token ends its request with reason "grammar"
(request.error says why); a completed grammar allows only the end-of-sequence token, and ends its request with
reason "stop" where that token cannot.

A failing model step does not stop the engine: the requests of that step finish with reason "error" and every
other request goes on. A runner that fails with a ServingError says what kind of failure it is (a lost agent is
unavailable: retry later); the requests carry that kind and message, any other exception is a generation
failure "model step failed: ...".
"""

from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.errors import Kind
from mindspore_serving.llm.choices import expand_rows
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.model_io import (
    PLACEHOLDER,
    MixedStep,
    ModelRunner,
    MultiStepRunner,
    SeqStep,
    StepLogits,
    StepSubmitter,
    split_logits,
    submits_mixed_steps,
)
from mindspore_serving.llm.prompt_scores import record_prompt_scores
from mindspore_serving.llm.request import FinishReason, Request, RequestStatus
from mindspore_serving.llm.sampler import Sampler
from mindspore_serving.llm.scheduler import Scheduler, SchedulerOutput
from mindspore_serving.llm.structured_output import BitmaskComputer, GrammarState, StepMasks

ARRIVAL_WINDOW_S = 1.0
"""Async scheduling: how recent the last arrival must be for a batch with room to run single steps."""


@dataclass
class EngineCoreOutput:
    """What one step produced for one request (token ids only; text is the front end's job)."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[float] = field(default_factory=list)
    new_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    error_kind: Kind = Kind.GENERATION
    """What kind of failure `error` is (common/errors.py), which decides the client's answer."""


@dataclass
class VerifyCounts:
    """What speculative decoding did in one step (vLLM's spec_decode metrics count the same)."""

    num_drafts: int = 0  # rows that verified proposed tokens
    num_draft_tokens: int = 0  # tokens proposed to them
    num_accepted_tokens: int = 0  # of which the model kept
    accepted_per_position: list[int] = field(default_factory=list)
    """[j]: drafts whose token j (0-based) was kept."""

    def add(self, draft_len: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += draft_len
        self.num_accepted_tokens += accepted
        add_per_position(self.accepted_per_position, [1] * accepted)


def add_per_position(totals: list[int], counts: Sequence[int]) -> None:
    """Adds `counts` to `totals` position by position, growing `totals` as needed (accepted tokens per position)."""
    if len(totals) < len(counts):
        totals.extend([0] * (len(counts) - len(totals)))
    for j, count in enumerate(counts):
        totals[j] += count


StepRecorder = Callable[[SchedulerOutput, list[EngineCoreOutput], float, float, float, int, VerifyCounts | None], None]
"""Told of each step run: (plan, outputs, schedule_s, execute_s, update_s, model steps, what verification did or
None)."""


def _call_now(function: Callable[..., Any], *args: Any) -> Future:
    """A future done with function(*args) or with its exception."""
    future: Future = Future()
    try:
        future.set_result(function(*args))
    except Exception as err:  # pylint: disable=broad-except
        future.set_exception(err)
    return future


@dataclass
class _Submitted:
    """A step given to the runner and not yet collected."""

    plan: SchedulerOutput
    greedy: bool  # the runner returns tokens (else logits, sampled here)
    num_steps: int
    future: Any
    schedule_s: float
    submitted: float
    overlapped: bool = False  # submitted while the engine had other work (async scheduling)
    masks: Future | None = None  # the grammar bitmasks of its rows, computed while the model runs
    logits_rows: list[int] | None = None  # a mixed step's rows that the engine samples (model_io)


@dataclass
class _Sampled:
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]
    forks: dict[str, "_Sampled"] = field(default_factory=dict)
    """A request forking at this row (llm/choices.py): each child's id -> its first token, in choice order."""
    accepted: list["_Sampled"] = field(default_factory=list)
    """A row that verified a draft: the proposed tokens the model kept, before `token_id`."""

    @property
    def tokens(self) -> list["_Sampled"]:
        return self.accepted + [self]


class StepExecutor:
    """Collects a step from the runner and records its tokens with the scheduler; subclasses say how steps are
    planned and handed to the runner (`step`)."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        sampler: Sampler,
        on_step: StepRecorder,
        timer: Callable[[], float],
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.sampler = sampler
        self._on_step = on_step
        self._timer = timer
        self._masker: BitmaskComputer | None = None
        self._mixed_steps = submits_mixed_steps(runner)

    def step(self) -> list[EngineCoreOutput]:
        """Runs what the scheduler plans now (nothing when nothing is schedulable); the outputs of the requests
        whose steps were collected."""
        raise NotImplementedError

    @property
    def has_in_flight(self) -> bool:
        """A step was submitted and is not collected yet."""
        return False

    def _collect(self, submitted: _Submitted) -> list[EngineCoreOutput]:
        """Waits for a submitted step and records its tokens (sampling them first when the runner returned
        logits)."""
        plan, num_steps, greedy = submitted.plan, submitted.num_steps, submitted.greedy
        verify_counts: VerifyCounts | None = None
        # the engine's own time: with overlap, only what it waited for the model
        t1 = self._timer() if submitted.overlapped else submitted.submitted
        try:
            result = submitted.future.result()
            step_masks = None if submitted.masks is None else submitted.masks.result()
            masks: np.ndarray | None
            draft_masks: dict[int, np.ndarray] = {}
            if isinstance(step_masks, StepMasks):
                masks, draft_masks = step_masks.rows, step_masks.drafts
            else:
                masks = step_masks
            counts = VerifyCounts()  # what the verifying rows (if any) did
            if any(row.draft for row in plan.scheduled):
                verify_counts = counts
            if submitted.logits_rows is not None:
                sampled = self._sample_mixed(plan, result, submitted.logits_rows, masks, draft_masks, counts)
            elif greedy:
                tokens, logprobs = self._check_steps(plan, num_steps, result)
            else:
                logits, every = split_logits(result)
                drafts = _draft_logits(plan, every)
                logits = record_prompt_scores(plan.scheduled, StepLogits(logits, every), self.scheduler.requests)
                sampled = self._sample(plan, logits, masks, verified=drafts)
                if drafts:
                    sampled.update(self._verify(plan, drafts, counts, draft_masks))
        except Exception as err:  # pylint: disable=broad-except
            if submitted.masks is not None:
                wait([submitted.masks])  # its grammar states are not to be fed while it reads them
            # NOTE: a failed step fails its own requests, not the engine.
            log.exception(f"LLM step {plan.step_id} failed for requests {plan.request_ids}: {err}")
            t2 = self._timer()
            outputs = self._fail(plan, *_step_failure(err))
        else:
            t2 = self._timer()
            outputs = self._update_steps(plan, tokens, logprobs) if greedy else self._update(plan, sampled)
        self._on_step(plan, outputs, submitted.schedule_s, t2 - t1, self._timer() - t2, num_steps, verify_counts)
        return outputs

    def _runner_chooses_tokens(self, plan: SchedulerOutput) -> bool:
        """Whether the runner can choose every row's tokens (each row samples, greedily, with nothing that needs
        the engine between tokens)."""
        for row in plan.scheduled:
            if not row.samples or not _plain(self.scheduler.requests[row.request_id]):
                return False
            if row.seq_step.all_logits:  # a scored prompt's logits come back whole
                return False
        return True

    def _mixed_rows(self, plan: SchedulerOutput) -> list[int] | None:
        """The rows the engine samples when the plan runs as a mixed step (model_io); None when it does not: the
        runner runs none, no row is the runner's to choose beside rows the engine samples or rows that verify
        proposed tokens (a greedy row's verification needs only the runner's greedy tokens), or a prompt chunk asks
        for all its logits (the runner returns the logits of every row then)."""
        if not self._mixed_steps:
            return None
        engine_rows, runner_rows, verifying = [], 0, False
        for i, row in enumerate(plan.scheduled):
            if row.seq_step.all_logits and not row.draft:
                return None
            if not row.samples:  # a prompt chunk: nothing to choose
                continue
            verifying = verifying or bool(row.draft)
            if _plain(self.scheduler.requests[row.request_id]):
                runner_rows += 1
            else:
                engine_rows.append(i)
        return engine_rows if runner_rows and (engine_rows or verifying) else None

    def _sample(
        self,
        plan: SchedulerOutput,
        logits: np.ndarray,
        bitmasks: np.ndarray | None = None,
        logits_rows: list[int] | None = None,
        verified: Collection[int] = (),
    ) -> dict[int, _Sampled]:
        """Samples the rows that complete their tokens, but those in `verified` (rows with a draft, see `_verify`);
        `bitmasks`: the grammar bitmasks of the plan's rows; `logits_rows`: the plan's rows whose logits `logits`
        holds, in that order (None: every row)."""
        logits = np.asarray(logits)
        expected = len(plan.scheduled) if logits_rows is None else len(logits_rows)
        if logits.ndim != 2 or logits.shape[0] != expected:
            which = "" if logits_rows is None else f"{expected} of "
            raise RuntimeError(
                f"model runner returned logits of shape {logits.shape} for {which}{len(plan.scheduled)} sequences"
            )
        live = self.scheduler.requests  # a request may have finished since the plan (async scheduling: on EOS)
        candidates = range(len(plan.scheduled)) if logits_rows is None else logits_rows
        rows = [
            i
            for i in candidates
            if plan.scheduled[i].samples and plan.scheduled[i].request_id in live and i not in verified
        ]
        if not rows:
            return {}
        requests = [live[plan.scheduled[i].request_id] for i in rows]
        num_rows = expand_rows(rows, requests, self.scheduler.children_to_fork)  # a forking row samples each choice
        if logits_rows is None:
            at = rows
        else:
            where = {row: k for k, row in enumerate(logits_rows)}
            at = [where[i] for i in rows]
        result = self.sampler.sample_requests(
            logits if at == list(range(len(logits))) else logits[at],
            requests,
            bitmasks=None if bitmasks is None else bitmasks[rows],
        )
        tops = result.top_logprobs or [[] for _ in rows]
        sampled = {i: _Sampled(result.token_ids[k], result.logprobs[k], tops[k]) for k, i in enumerate(rows[:num_rows])}
        for k in range(num_rows, len(rows)):
            sampled[rows[k]].forks[requests[k].request_id] = _Sampled(result.token_ids[k], result.logprobs[k], tops[k])
        return sampled

    def _verify(
        self, plan: SchedulerOutput, drafts: dict[int, np.ndarray], counts: VerifyCounts, masks: dict[int, np.ndarray]
    ) -> dict[int, _Sampled]:
        """The tokens of the rows that verified a draft (`drafts`: row -> the logits of each of its positions;
        `masks`: row -> its grammar's mask at each position): the accepted prefix of the draft and the model's own
        token after it (Sampler.verify)."""
        live = self.scheduler.requests
        sampled = {}
        for i, values in drafts.items():
            row = plan.scheduled[i]
            request = live.get(row.request_id)
            if request is None:
                continue
            result = self.sampler.verify(values, request, row.draft, masks.get(i))
            sampled[i] = _kept(row.draft, result.token_ids, result.logprobs, result.top_logprobs, counts)
        return sampled

    def _sample_mixed(
        self,
        plan: SchedulerOutput,
        result: MixedStep,
        logits_rows: list[int],
        bitmasks: np.ndarray | None,
        draft_masks: dict[int, np.ndarray],
        counts: VerifyCounts,
    ) -> dict[int, _Sampled]:
        """The tokens of a mixed step (model_io.MixedStep): the engine samples `logits_rows` from their logits
        (verifying rows among them from every position's), the other rows that complete their tokens take the
        runner's greedy token and logprob (verifying rows: the agreeing prefix of their proposal and the token
        after it, from the runner's greedy tokens at each position)."""
        tokens, logprobs = self._check_steps(plan, 1, (result.tokens, result.logprobs))
        drafts = {i for i, row in enumerate(plan.scheduled) if row.draft}
        sampled = self._sample(plan, result.logits, bitmasks, logits_rows, verified=drafts)
        live, engine_rows = self.scheduler.requests, set(logits_rows)
        missing = sorted(i for i in drafts if i not in (result.every if i in engine_rows else result.verified))
        if missing:
            raise RuntimeError(
                f"model runner did not return what rows {missing} of step {plan.step_id} need to verify "
                f"their proposed tokens"
            )
        sampled.update(self._verify(plan, {i: result.every[i] for i in drafts & engine_rows}, counts, draft_masks))
        for i, row in enumerate(plan.scheduled):
            if not row.samples or i in engine_rows or row.request_id not in live:
                continue
            if i in drafts:  # the agreeing prefix of the proposal, then the runner's token after it
                greedy_tokens, greedy_logprobs = result.verified[i]
                accepted = _agreeing_prefix(row.draft, greedy_tokens)
                sampled[i] = _kept(
                    row.draft, greedy_tokens[: accepted + 1], greedy_logprobs[: accepted + 1], [], counts
                )
            else:
                sampled[i] = _Sampled(int(tokens[i, 0]), float(logprobs[i, 0]), [])
        return sampled

    def _update(self, plan: SchedulerOutput, sampled: dict[int, _Sampled]) -> list[EngineCoreOutput]:
        ended = self._end_rows_without_token(plan, sampled)
        tokens = [
            None
            if i not in sampled
            else sampled[i].token_id
            if not sampled[i].accepted
            else [got.token_id for got in sampled[i].tokens]
            for i in range(len(plan.scheduled))
        ]
        by_id = {plan.scheduled[i].request_id: value for i, value in sampled.items()}
        forks = {}
        for i, value in sampled.items():
            if value.forks:
                forks[i] = [fork.token_id for fork in value.forks.values()]
                by_id.update(value.forks)
        outputs = []
        for delta in self.scheduler.update_from_output(plan, tokens, forks):
            got = by_id.get(delta.request_id)
            if got is None:  # finished without a token (max_new_tokens 0)
                outputs.append(
                    EngineCoreOutput(delta.request_id, finished=delta.finished, finish_reason=delta.finish_reason)
                )
                continue
            kept = got.tokens[: len(delta.new_token_ids)]  # a verified row stops where its request stops
            outputs.append(
                EngineCoreOutput(
                    delta.request_id,
                    delta.new_token_ids,
                    [k.logprob for k in kept],
                    [k.top_logprobs for k in kept] if got.top_logprobs else [],
                    delta.finished,
                    delta.finish_reason,
                )
            )
        return ended + self._follow_grammars(outputs)

    # --- structured output --------------------------------------------------------------------
    def _start_masks(self, plan: SchedulerOutput) -> Future | None:
        """Starts computing the grammar bitmasks of the plan's rows (None: no row has a grammar); called right
        before the runner gets the plan, so that they are computed while the model computes the step."""
        live = self.scheduler.requests
        rows: list[GrammarState | None] = []
        drafts: dict[int, tuple[GrammarState, Sequence[int]]] = {}
        for i, row in enumerate(plan.scheduled):
            request = live.get(row.request_id)
            if request is None or not row.samples:
                rows.append(None)
                continue
            grammar = request.grammar
            if grammar is not None:
                grammar.advance(request.output_token_ids)  # tokens it got outside this executor (a fork's first)
                if row.draft:  # masked at each position it verifies, not as one row
                    drafts[i], grammar = (grammar, row.draft), None
            rows.append(grammar)
        if all(grammar is None for grammar in rows) and not drafts:
            return None
        if self._masker is None:
            self._masker = BitmaskComputer(self.runner.vocab_size)
        return self._masker.start(rows, drafts)

    def _end_rows_without_token(self, plan: SchedulerOutput, sampled: dict[int, _Sampled]) -> list[EngineCoreOutput]:
        """Ends the requests whose row allowed no token (the sampler's -1), before the tokens are recorded: reason
        "grammar" for a structured output, else "stop" (its own masks exclude every token)."""
        outputs = []
        for i in [i for i, got in sampled.items() if got.token_id < 0]:
            del sampled[i]
            request = self.scheduler.get_request(plan.scheduled[i].request_id)
            if request is None:
                continue
            if request.grammar is not None:
                reason = request.grammar.error or "the grammar allows no token here"
                outputs.append(self._end(request, RequestStatus.FINISHED_GRAMMAR, f"structured output: {reason}"))
            else:
                outputs.append(
                    self._end(
                        request,
                        RequestStatus.FINISHED_STOP,
                        "no token is allowed: allowed_token_ids, bad words and min_tokens exclude every token",
                    )
                )
        return outputs

    def _follow_grammars(self, outputs: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
        """Feeds the new tokens to the grammars of the requests that go on: a grammar that refuses one ends its
        request (reason "grammar"); a completed grammar whose end-of-sequence token cannot end the request now
        (ignore_eos, min_tokens not reached, or the engine knows no EOS) ends it with reason "stop"."""
        for out in outputs:
            request = self.scheduler.get_request(out.request_id)
            if out.finished or request is None or request.grammar is None:
                continue
            grammar = request.grammar
            if not grammar.advance(request.output_token_ids):
                self._end(request, RequestStatus.FINISHED_GRAMMAR, f"structured output: {grammar.error}")
            elif grammar.is_stopped and not _eos_can_end(request, grammar):
                self._end(request, RequestStatus.FINISHED_STOP)
            else:
                continue
            out.finished, out.finish_reason = True, request.finish_reason
        return outputs

    def _end(self, request: Request, status: RequestStatus, why: str | None = None) -> EngineCoreOutput:
        """Finishes a running request after its step (reason `status`); `why` is kept as request.error and logged.
        The output tells the front end that it finished (not that it failed: its tokens stand)."""
        if why is not None:
            request.error = why
            log.info(f"request {request.request_id} ends with reason {status.finish_reason}: {why}")
        self.scheduler.finish_request(request.request_id, status)
        return EngineCoreOutput(request.request_id, finished=True, finish_reason=status.finish_reason)

    @staticmethod
    def _check_steps(plan: SchedulerOutput, num_steps: int, result: Any) -> tuple[np.ndarray, np.ndarray]:
        tokens, logprobs = (np.asarray(a) for a in result)
        if tokens.shape != (len(plan.scheduled), num_steps) or logprobs.shape != tokens.shape:
            raise RuntimeError(
                f"model runner returned tokens {tokens.shape} and logprobs {logprobs.shape} for "
                f"{len(plan.scheduled)} sequences and {num_steps} steps"
            )
        return tokens, logprobs

    def _update_steps(self, plan: SchedulerOutput, tokens: np.ndarray, logprobs: np.ndarray) -> list[EngineCoreOutput]:
        rows = {row.request_id: i for i, row in enumerate(plan.scheduled)}
        outputs = []
        for delta in self.scheduler.update_from_steps(plan, tokens.tolist()):
            chosen = logprobs[rows[delta.request_id], : len(delta.new_token_ids)]
            outputs.append(
                EngineCoreOutput(
                    delta.request_id,
                    delta.new_token_ids,
                    [float(v) for v in chosen],
                    [],
                    delta.finished,
                    delta.finish_reason,
                )
            )
        return outputs

    def _fail(self, plan: SchedulerOutput, message: str, kind: Kind = Kind.GENERATION) -> list[EngineCoreOutput]:
        outputs = []
        for request_id in plan.request_ids:
            request = self.scheduler.get_request(request_id)
            if request is None:
                continue
            request.error = message
            self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ERROR)
            outputs.append(
                EngineCoreOutput(
                    request_id, finished=True, finish_reason=FinishReason.ERROR, error=message, error_kind=kind
                )
            )
        return outputs


class SingleStepExecutor(StepExecutor):
    """One model step per `step()`: schedule -> run -> sample -> update."""

    def step(self) -> list[EngineCoreOutput]:
        t0 = self._timer()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        return self._collect(self._run(plan, t0))

    def _run(self, plan: SchedulerOutput, t0: float) -> _Submitted:
        t1 = self._timer()
        logits_rows = self._mixed_rows(plan)
        masks = self._start_masks(plan)
        if logits_rows is not None:
            submitter = cast(_MixedStepSubmitter, self.runner)  # _mixed_rows gives rows only to one
            future = _call_now(lambda: submitter.submit(plan.seq_steps, 1, (), logits_rows).result())
        else:
            future = _call_now(self.runner.run, plan.seq_steps)
        return _Submitted(plan, False, 1, future, t1 - t0, t1, masks=masks, logits_rows=logits_rows)


class MultiStepExecutor(SingleStepExecutor):
    """Like SingleStepExecutor, but a plan the runner can choose greedily runs as a round of up to
    `num_scheduler_steps` steps in one `run_greedy` call (Scheduler.reserve_decode_steps may cut it)."""

    runner: MultiStepRunner

    def __init__(
        self,
        scheduler: Scheduler,
        runner: MultiStepRunner,
        sampler: Sampler,
        on_step: StepRecorder,
        timer: Callable[[], float],
        num_scheduler_steps: int,
    ) -> None:
        super().__init__(scheduler, runner, sampler, on_step, timer)
        self.num_scheduler_steps = num_scheduler_steps

    def _run(self, plan: SchedulerOutput, t0: float) -> _Submitted:
        wanted = self.num_scheduler_steps if self._runner_chooses_tokens(plan) else 1
        num_steps = self.scheduler.reserve_decode_steps(plan, wanted)
        if num_steps == 1:
            return super()._run(plan, t0)
        t1 = self._timer()
        future = _call_now(self.runner.run_greedy, plan.seq_steps, num_steps)
        return _Submitted(plan, True, num_steps, future, t1 - t0, t1)


class AsyncStepExecutor(StepExecutor):
    """Plans and submits step N+1 before collecting step N, when N's tokens are the runner's to choose; the
    rows of N+1 that continue from N carry placeholders the runner fills (Scheduler.advance_in_flight)."""

    runner: "_SubmittingRunner"

    def __init__(
        self,
        scheduler: Scheduler,
        runner: "_SubmittingRunner",
        sampler: Sampler,
        on_step: StepRecorder,
        timer: Callable[[], float],
        num_scheduler_steps: int,
    ) -> None:
        super().__init__(scheduler, runner, sampler, on_step, timer)
        self.num_scheduler_steps = num_scheduler_steps
        self._in_flight: _Submitted | None = None
        self._planned_ahead = 0
        """Speculative decoding: model steps planned since proposals were last looked for (a step planned while
        another is in flight proposes nothing: its rows' last tokens are unknown)."""
        self._proposed = True
        """Speculative decoding: whether the last step planned with every row's tokens known had proposals (or
        nothing to look for: prompts only)."""

    @property
    def has_in_flight(self) -> bool:
        return self._in_flight is not None

    def step(self) -> list[EngineCoreOutput]:
        """Returns the outputs of the step collected (and of a step that samples in the engine, which is
        collected at once)."""
        t0 = self._timer()
        outputs: list[EngineCoreOutput] = []
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            self.scheduler.advance_in_flight(in_flight.plan, in_flight.num_steps)
            # a request holding placeholders must not be preempted (it would recompute them): wait for them; nor
            # does it propose tokens (its last ones are unknown): wait for them every so many steps to look again
            if not self.scheduler.fits_without_preemption() or self._look_for_proposals():
                outputs += self._collect(in_flight)
                in_flight = None
        plan = self.scheduler.schedule()
        if in_flight is None:  # planned with every row's tokens known: a look for proposals
            self._planned_ahead = 0
            # a plan of prompts only had nothing to look for
            self._proposed = any(row.draft for row in plan.scheduled) or all(row.is_prefill for row in plan.scheduled)
        if plan.is_empty:
            if in_flight is not None:
                outputs += self._collect(in_flight)
            return outputs
        greedy = self._runner_chooses_tokens(plan)
        logits_rows = None if greedy else self._mixed_rows(plan)
        num_steps = self.scheduler.reserve_decode_steps(plan, self._round_length()) if greedy else 1
        self._planned_ahead += num_steps
        prev_rows = _prev_rows(plan, in_flight)
        t1 = self._timer()
        masks = None if greedy else self._start_masks(plan)
        if logits_rows is not None:  # one step: the runner chooses the plain rows' tokens
            submitter = cast(_MixedStepSubmitter, self.runner)  # _mixed_rows gives rows only to one
            future = submitter.submit(plan.seq_steps, 1, prev_rows, logits_rows)
        else:
            future = self.runner.submit(plan.seq_steps, num_steps if greedy else 0, prev_rows)
        submitted = _Submitted(
            plan, greedy, num_steps, future, t1 - t0, t1, overlapped=True, masks=masks, logits_rows=logits_rows
        )
        self._in_flight = submitted
        if in_flight is not None:
            outputs += self._collect(in_flight)
        if not greedy:
            # the engine samples its tokens (a mixed step: some of them): nothing can be planned past it
            self._in_flight = None
            outputs += self._collect(submitted)
        return outputs

    def _look_for_proposals(self) -> bool:
        """Whether to collect the step in flight before planning the next one so that its rows may propose tokens
        (speculative decoding): while proposals keep coming, always; after a look that found none, once
        `num_scheduler_steps` model steps (a round, or that many single steps) have been planned since: text that
        does not repeat itself keeps most of the overlap, and is looked at again every round."""
        return self.scheduler.speculating and (self._proposed or self._planned_ahead >= self.num_scheduler_steps)

    def _round_length(self) -> int:
        """The next step is planned while this one runs, so a request arriving during a round would wait for the
        round after it too: while requests keep arriving (one within the last ARRIVAL_WINDOW_S seconds) and
        several run in a batch with room, rounds are single steps, which then cost no round trip of their own
        (they overlap) but a little runner time each. A lone request (one client streaming) and the tail of a
        burst keep their rounds."""
        scheduler = self.scheduler
        arriving = (
            1 < scheduler.num_running < scheduler.config.max_num_seqs
            and scheduler.clock() - scheduler.last_arrival_time < ARRIVAL_WINDOW_S
        )
        return 1 if arriving else self.num_scheduler_steps


def _plain(request: Request) -> bool:
    """Whether the runner may choose the request's next token itself (greedy, nothing for the engine to do)."""
    return request.sampling_params.plain_greedy and not request.num_pending_choices  # a fork samples its choices


def _eos_can_end(request: Request, grammar: GrammarState) -> bool:
    """Whether the end-of-sequence token the completed `grammar` (the request's) allows would end the request now."""
    params = request.sampling_params
    return (
        not params.ignore_eos
        and request.num_output_tokens >= params.min_tokens
        and bool(grammar.eos_token_ids & request.eos_token_ids)
    )


def _step_failure(err: Exception) -> tuple[str, Kind]:
    """(message, kind) of the requests of a failed step: a ServingError's own, else a generation failure."""
    if isinstance(err, errors.ServingError):
        return err.message, err.KIND
    return f"model step failed: {type(err).__name__}: {err}", Kind.GENERATION


def _agreeing_prefix(draft: Sequence[int], tokens: Sequence[int] | np.ndarray) -> int:
    """How many of the first proposed tokens equal `tokens` (the tokens chosen at the same positions)."""
    accepted = 0
    while accepted < min(len(draft), len(tokens)) and int(tokens[accepted]) == draft[accepted]:
        accepted += 1
    return accepted


def _kept(
    draft: Sequence[int],
    tokens: Sequence[int] | np.ndarray,
    logprobs: Sequence[float] | np.ndarray,
    top_logprobs: Sequence[list[tuple[int, float]]],
    counts: VerifyCounts,
) -> _Sampled:
    """What a verifying row keeps, counted in `counts`: `tokens` (an accepted prefix of `draft`, then one token of
    the model's own) with their logprobs and top logprobs (empty: none asked), as one _Sampled whose `accepted`
    holds all but the last."""
    counts.add(len(draft), _agreeing_prefix(draft, tokens))
    tops = top_logprobs or [[] for _ in tokens]
    kept = [_Sampled(int(t), float(lp), top) for t, lp, top in zip(tokens, logprobs, tops)]
    last = kept[-1]
    last.accepted = kept[:-1]
    return last


def _draft_logits(plan: SchedulerOutput, every: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Takes out of `every` (a step's every-token logits by row) those of the rows that verified a draft."""
    drafts = {}
    for i, row in enumerate(plan.scheduled):
        if row.draft:
            if i not in every:
                raise RuntimeError(
                    f"model runner did not return every position's logits for row {i} of step "
                    f"{plan.step_id}, which verifies proposed tokens"
                )
            drafts[i] = every.pop(i)
            if drafts[i].shape[0] != 1 + len(row.draft):
                raise RuntimeError(
                    f"model runner returned logits of shape {drafts[i].shape} for row {i} of step "
                    f"{plan.step_id}, which computes {1 + len(row.draft)} tokens"
                )
    return drafts


def _prev_rows(plan: SchedulerOutput, in_flight: _Submitted | None) -> list[int]:
    """For each row of `plan`, the row of the step in flight whose token it continues from (-1: none);
    [] when no row does."""
    rows = [row for row in plan.scheduled if row.seq_step.token_ids[-1] == PLACEHOLDER]
    if not rows:
        return []
    where = {row.request_id: i for i, row in enumerate(in_flight.plan.scheduled)} if in_flight else {}
    prev = []
    for row in plan.scheduled:
        if row.seq_step.token_ids[-1] != PLACEHOLDER:
            prev.append(-1)
        elif row.request_id in where and row.seq_step.token_ids == [PLACEHOLDER]:
            prev.append(where[row.request_id])
        else:
            raise RuntimeError(
                f"step {plan.step_id}: request {row.request_id} continues from a token no step "
                f"in flight computes ({row.seq_step.token_ids[:4]})"
            )
    return prev


class _SubmittingRunner(ModelRunner, StepSubmitter, Protocol):
    """A runner that also computes submitted steps apart from the engine (async scheduling)."""


class _MixedStepSubmitter(Protocol):
    """A StepSubmitter that runs mixed steps (model_io.submits_mixed_steps): `submit` also takes logits_rows."""

    def submit(
        self,
        seqs: Sequence[SeqStep],
        greedy_steps: int = 0,
        prev_rows: Sequence[int] = (),
        logits_rows: Sequence[int] = (),
    ) -> Any: ...


def make_step_executor(
    config: SchedulerConfig,
    runner: ModelRunner,
    scheduler: Scheduler,
    sampler: Sampler,
    on_step: StepRecorder,
    timer: Callable[[], float],
) -> StepExecutor:
    """The executor for this config and runner. Async scheduling needs a runner that computes while the engine
    plans (a StepSubmitter), and rounds one that runs them (a MultiStepRunner); without them the engine steps one
    step at a time."""
    if config.async_scheduling and isinstance(runner, StepSubmitter):
        return AsyncStepExecutor(scheduler, runner, sampler, on_step, timer, config.num_scheduler_steps)
    if config.num_scheduler_steps > 1 and isinstance(runner, MultiStepRunner):
        return MultiStepExecutor(scheduler, runner, sampler, on_step, timer, config.num_scheduler_steps)
    return SingleStepExecutor(scheduler, runner, sampler, on_step, timer)
