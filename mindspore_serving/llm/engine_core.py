"""The engine core: scheduler + model runner + sampler, stepping in the caller's thread.

No threads, no I/O, no text. Each `step()` schedules, runs the model, samples and updates, and returns
token-level outputs. A serving loop in another thread or process drives it the same way; hooks
(`add_step_listener`) report per-step statistics without the core knowing who listens.

A failing model step does not stop the engine: the requests of that step finish with reason "error"
and every other request goes on.

With SchedulerConfig.async_scheduling, a step whose tokens the runner chooses (every row greedy) stays in
flight when `step()` returns: the next `step()` plans and submits the following step first, then collects
this one's tokens, so the runner always has the next step queued while the engine does its own work.
"""
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from mindspore_serving import log
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.model_io import PLACEHOLDER, ModelRunner
from mindspore_serving.llm.request import FinishReason, Request, RequestStatus
from mindspore_serving.llm.sampler import Sampler
from mindspore_serving.llm.scheduler import Scheduler, SchedulerOutput


@dataclass
class EngineCoreOutput:
    """What one step produced for one request (token ids only; text is the front end's job)."""
    request_id: str
    new_token_ids: List[int] = field(default_factory=list)
    new_logprobs: List[float] = field(default_factory=list)
    new_top_logprobs: List[List[Tuple[int, float]]] = field(default_factory=list)
    finished: bool = False
    finish_reason: Optional[FinishReason] = None
    error: Optional[str] = None


@dataclass
class StepStats:
    """One model step, for logs and benchmarks (steps that run nothing are not reported)."""
    step_id: int
    num_seqs: int                 # batch size: requests computed this step
    num_prefill_seqs: int
    num_decode_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_batched_tokens: int
    token_budget_usage: float     # num_batched_tokens / max_num_batched_tokens
    num_preempted: int
    num_new_tokens: int           # tokens sampled and kept
    num_finished: int
    num_running: int              # after the step
    num_waiting: int
    kv_usage: float               # fraction of usable KV blocks held by requests, after the step
    num_free_blocks: int
    schedule_s: float
    execute_s: float              # model run + sampling (async scheduling: the time the engine waited for them)
    update_s: float
    num_model_steps: int = 1      # decode steps run back to back in this one (multi-step decoding)


StepListener = Callable[[StepStats], None]


def _call_now(function, *args) -> Future:
    """A future done with function(*args) or with its exception."""
    future: Future = Future()
    try:
        future.set_result(function(*args))
    except Exception as err:  # pylint: disable=broad-except
        future.set_exception(err)
    return future


@dataclass
class _InFlight:
    """A step submitted to the runner and not yet collected."""
    plan: SchedulerOutput
    greedy: bool                  # the runner returns tokens (else logits, sampled here)
    num_steps: int
    future: Any
    schedule_s: float
    submitted: float
    overlapped: bool = False      # submitted while the engine had other work (async scheduling)


@dataclass
class _Sampled:
    token_id: int
    logprob: float
    top_logprobs: List[Tuple[int, float]]


class EngineCore:
    """Scheduler, model runner and sampler; `step()` is schedule -> execute -> update."""

    def __init__(self, model_runner: ModelRunner, scheduler_config: SchedulerConfig,
                 sampler: Optional[Sampler] = None, clock: Callable[[], float] = time.monotonic,
                 timer: Callable[[], float] = time.perf_counter):
        scheduler_config.check_runner(model_runner)
        self.runner = model_runner
        self.config = scheduler_config
        self.scheduler = Scheduler(scheduler_config, clock)
        self.sampler = sampler or Sampler()
        self._timer = timer
        self._pending: List[EngineCoreOutput] = []
        self._listeners: List[StepListener] = []
        self.last_stats: Optional[StepStats] = None
        self.num_steps = 0
        # a runner in this thread (no `submit`) would compute nothing while the engine plans: steps stay in turn
        ahead = scheduler_config.async_scheduling and hasattr(model_runner, "submit")
        self._submitter = model_runner if ahead else None
        self._in_flight: Optional[_InFlight] = None

    # --- requests -----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort(self, request_id: str) -> bool:
        """Finishes the request now, in any state, freeing its blocks; the next `step()` returns its
        final output (reason "abort"). False when it is unknown or already finished."""
        if not self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED):
            return False
        self._pending.append(EngineCoreOutput(request_id, finished=True, finish_reason=FinishReason.ABORT))
        return True

    def finish_request(self, request_id: str, status: RequestStatus) -> bool:
        """Finishes a request for a reason found outside the core (a stop string); no output follows."""
        return self.scheduler.finish_request(request_id, status)

    def get_request(self, request_id: str) -> Optional[Request]:
        return self.scheduler.get_request(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending) or self._in_flight is not None

    def add_step_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    # --- the loop body ------------------------------------------------------------------------
    def step(self) -> List[EngineCoreOutput]:
        """One model step (nothing runs when nothing is schedulable); outputs of the requests it changed,
        plus the final outputs of requests aborted since the last step."""
        if self._submitter is not None:
            return self._step_ahead()
        t0 = self._timer()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return self._take_pending()
        num_steps = self.scheduler.reserve_decode_steps(plan, self._decode_steps(plan))
        t1 = self._timer()
        if num_steps > 1:
            future = _call_now(self.runner.run_greedy, plan.seq_steps, num_steps)
        else:
            future = _call_now(self.runner.run, plan.seq_steps)
        outputs = self._collect(_InFlight(plan, num_steps > 1, num_steps, future, t1 - t0, t1))
        return self._take_pending() + outputs

    def _step_ahead(self) -> List[EngineCoreOutput]:
        """`step()` with async scheduling: plans and submits the next step before collecting the one in flight
        (see the module docstring). Returns the outputs of the step collected (and of a step that samples in
        the engine, which is collected at once)."""
        t0 = self._timer()
        outputs: List[EngineCoreOutput] = []
        in_flight = self._in_flight
        if in_flight is not None:
            self.scheduler.advance_in_flight(in_flight.plan, in_flight.num_steps)
            if not self.scheduler.fits_without_preemption():
                outputs += self._collect(in_flight)
                in_flight = None
        plan = self.scheduler.schedule()
        if plan.is_empty:
            self._in_flight = None
            if in_flight is not None:
                outputs += self._collect(in_flight)
            return self._take_pending() + outputs
        greedy = self._greedy(plan)
        # a runner with `submit` runs greedy steps itself (model_io), so `greedy` is all _decode_steps would check
        num_steps = self.scheduler.reserve_decode_steps(plan, self.config.num_scheduler_steps) if greedy else 1
        prev_rows = self._prev_rows(plan, in_flight)
        t1 = self._timer()
        future = self._submitter.submit(plan.seq_steps, num_steps if greedy else 0, prev_rows)
        self._in_flight = _InFlight(plan, greedy, num_steps, future, t1 - t0, t1, overlapped=True)
        if in_flight is not None:
            outputs += self._collect(in_flight)
        if not greedy:
            outputs += self._collect(self._in_flight)
        return self._take_pending() + outputs

    def _collect(self, in_flight: _InFlight) -> List[EngineCoreOutput]:
        """Waits for a submitted step and records its tokens (sampling them first when the runner returned
        logits)."""
        if self._in_flight is in_flight:
            self._in_flight = None
        plan, num_steps, greedy = in_flight.plan, in_flight.num_steps, in_flight.greedy
        # the engine's own time: with overlap, only what it waited for the model
        t1 = self._timer() if in_flight.overlapped else in_flight.submitted
        try:
            result = in_flight.future.result()
            if greedy:
                tokens, logprobs = self._check_steps(plan, num_steps, result)
            else:
                sampled = self._sample(plan, result)
        except Exception as err:  # pylint: disable=broad-except
            # NOTE: a failed step fails its own requests, not the engine.
            log.exception(f"LLM step {plan.step_id} failed for requests {plan.request_ids}: {err}")
            t2 = self._timer()
            outputs = self._fail(plan, f"model step failed: {type(err).__name__}: {err}")
        else:
            t2 = self._timer()
            outputs = self._update_steps(plan, tokens, logprobs) if greedy else self._update(plan, sampled)
        self._record(plan, outputs, in_flight.schedule_s, t2 - t1, self._timer() - t2, num_steps)
        return outputs

    def _greedy(self, plan: SchedulerOutput) -> bool:
        """Whether the runner can choose every row's tokens (each row samples, greedily, with nothing that needs
        the engine between tokens)."""
        for row in plan.scheduled:
            p = self.scheduler.requests[row.request_id].sampling_params
            if not row.samples or not p.greedy or p.repetition_penalty != 1.0 or p.stop or p.top_logprobs:
                return False
        return True

    @staticmethod
    def _prev_rows(plan: SchedulerOutput, in_flight: Optional[_InFlight]) -> List[int]:
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
                raise RuntimeError(f"step {plan.step_id}: request {row.request_id} continues from a token no step "
                                   f"in flight computes ({row.seq_step.token_ids[:4]})")
        return prev

    def _decode_steps(self, plan: SchedulerOutput) -> int:
        """How many steps this plan may run at once (see SchedulerConfig.num_scheduler_steps): 1 unless the
        runner offers `run_greedy` and it can choose every row's tokens (`_greedy`); Scheduler.reserve_decode_steps
        may cut it."""
        steps = self.config.num_scheduler_steps
        if steps <= 1 or not hasattr(self.runner, "run_greedy") or not self._greedy(plan):
            return 1
        return steps

    def _take_pending(self) -> List[EngineCoreOutput]:
        pending, self._pending = self._pending, []
        return pending

    def _sample(self, plan: SchedulerOutput, logits) -> Dict[int, _Sampled]:
        logits = np.asarray(logits)
        if logits.ndim != 2 or logits.shape[0] != len(plan.scheduled):
            raise RuntimeError(f"model runner returned logits of shape {logits.shape} "
                               f"for {len(plan.scheduled)} sequences")
        live = self.scheduler.requests  # a request may have finished since the plan (async scheduling: on EOS)
        rows = [i for i, row in enumerate(plan.scheduled) if row.samples and row.request_id in live]
        if not rows:
            return {}
        requests = [self.scheduler.requests[plan.scheduled[i].request_id] for i in rows]
        result = self.sampler.sample_requests(logits if len(rows) == len(logits) else logits[rows], requests)
        tops = result.top_logprobs or [[] for _ in rows]
        return {i: _Sampled(result.token_ids[k], result.logprobs[k], tops[k]) for k, i in enumerate(rows)}

    def _update(self, plan: SchedulerOutput, sampled: Dict[int, _Sampled]) -> List[EngineCoreOutput]:
        tokens = [sampled[i].token_id if i in sampled else None for i in range(len(plan.scheduled))]
        by_id = {plan.scheduled[i].request_id: value for i, value in sampled.items()}
        outputs = []
        for delta in self.scheduler.update_from_output(plan, tokens):
            got = by_id[delta.request_id]
            outputs.append(EngineCoreOutput(delta.request_id, delta.new_token_ids, [got.logprob],
                                            [got.top_logprobs] if got.top_logprobs else [],
                                            delta.finished, delta.finish_reason))
        return outputs

    @staticmethod
    def _check_steps(plan: SchedulerOutput, num_steps: int, result) -> Tuple[np.ndarray, np.ndarray]:
        tokens, logprobs = (np.asarray(a) for a in result)
        if tokens.shape != (len(plan.scheduled), num_steps) or logprobs.shape != tokens.shape:
            raise RuntimeError(f"model runner returned tokens {tokens.shape} and logprobs {logprobs.shape} for "
                               f"{len(plan.scheduled)} sequences and {num_steps} steps")
        return tokens, logprobs

    def _update_steps(self, plan: SchedulerOutput, tokens: np.ndarray, logprobs: np.ndarray) -> List[EngineCoreOutput]:
        rows = {row.request_id: i for i, row in enumerate(plan.scheduled)}
        outputs = []
        for delta in self.scheduler.update_from_steps(plan, tokens.tolist()):
            chosen = logprobs[rows[delta.request_id], :len(delta.new_token_ids)]
            outputs.append(EngineCoreOutput(delta.request_id, delta.new_token_ids, [float(v) for v in chosen], [],
                                            delta.finished, delta.finish_reason))
        return outputs

    def _fail(self, plan: SchedulerOutput, message: str) -> List[EngineCoreOutput]:
        outputs = []
        for request_id in plan.request_ids:
            request = self.scheduler.get_request(request_id)
            if request is None:
                continue
            request.error = message
            self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ERROR)
            outputs.append(EngineCoreOutput(request_id, finished=True, finish_reason=FinishReason.ERROR,
                                            error=message))
        return outputs

    def _record(self, plan: SchedulerOutput, outputs: List[EngineCoreOutput], schedule_s: float,
                execute_s: float, update_s: float, num_steps: int = 1) -> None:
        self.num_steps += 1
        num_prefill = sum(1 for row in plan.scheduled if row.is_prefill)
        bm = self.scheduler.block_manager
        stats = StepStats(
            step_id=plan.step_id, num_seqs=len(plan.scheduled), num_prefill_seqs=num_prefill,
            num_decode_seqs=len(plan.scheduled) - num_prefill, num_prefill_tokens=plan.num_prefill_tokens,
            num_decode_tokens=plan.num_decode_tokens, num_batched_tokens=plan.num_batched_tokens,
            token_budget_usage=plan.num_batched_tokens / self.config.max_num_batched_tokens,
            num_preempted=len(plan.preempted_request_ids),
            num_new_tokens=sum(len(o.new_token_ids) for o in outputs),
            num_finished=sum(1 for o in outputs if o.finished),
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            kv_usage=bm.usage, num_free_blocks=bm.num_free_blocks,
            schedule_s=schedule_s, execute_s=execute_s, update_s=update_s, num_model_steps=num_steps)
        self.last_stats = stats
        for listener in self._listeners:
            listener(stats)
