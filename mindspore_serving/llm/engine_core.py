"""The engine core: scheduler + step executor (model runner, sampler), stepping in the caller's thread.

No threads, no I/O, no text. Each `step()` schedules, runs the model, samples and updates, and returns
token-level outputs. A serving loop in another thread or process drives it the same way; hooks
(`add_step_listener`) report per-step statistics without the core knowing who listens.

How a step runs (one at a time, in multi-step rounds, or planned ahead while the runner computes) is the step
executor's (step_executor.py), chosen once from the config and the runner; the core owns the requests' entry and
exit (add, abort) and the step statistics.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.model_io import ModelRunner
from mindspore_serving.llm.prompt_scores import score_refusal
from mindspore_serving.llm.request import FinishReason, Request, RequestStatus
from mindspore_serving.llm.sampler import Sampler
from mindspore_serving.llm.scheduler import Scheduler, SchedulerOutput
from mindspore_serving.llm.step_executor import EngineCoreOutput, VerifyCounts, make_step_executor


@dataclass
class StepStats:
    """One model step, for logs and benchmarks (steps that run nothing are not reported)."""

    step_id: int
    num_seqs: int  # batch size: requests computed this step
    num_prefill_seqs: int
    num_decode_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_batched_tokens: int
    token_budget_usage: float  # num_batched_tokens / max_num_batched_tokens
    num_preempted: int
    num_new_tokens: int  # tokens sampled and kept
    num_finished: int
    num_running: int  # after the step
    num_waiting: int
    kv_usage: float  # fraction of usable KV blocks held by requests, after the step
    num_free_blocks: int
    schedule_s: float
    execute_s: float  # model run + sampling (async scheduling: the time the engine waited for them)
    update_s: float
    num_model_steps: int = 1  # decode steps run back to back in this one (multi-step decoding)
    num_drafts: int = 0  # speculative decoding: rows that verified proposed tokens
    num_draft_tokens: int = 0  # tokens proposed to them
    num_accepted_tokens: int = 0  # of which the model kept
    accepted_per_position: tuple[int, ...] = ()
    """[j]: drafts whose token j was kept."""


StepListener = Callable[[StepStats], None]


class EngineCore:
    """Scheduler, model runner and sampler; `step()` is schedule -> execute -> update."""

    def __init__(
        self,
        model_runner: ModelRunner,
        scheduler_config: SchedulerConfig,
        sampler: Sampler | None = None,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        scheduler_config.check_runner(model_runner)
        _check_speculation(scheduler_config, model_runner)
        self.runner = model_runner
        self.config = scheduler_config
        self.scheduler = Scheduler(scheduler_config, clock)
        self.sampler = sampler or Sampler()
        self._pending: list[EngineCoreOutput] = []
        self._listeners: list[StepListener] = []
        self.last_stats: StepStats | None = None
        self.num_steps = 0
        self.executor = make_step_executor(
            scheduler_config, model_runner, self.scheduler, self.sampler, self._record, timer
        )

    # --- requests -----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queues the request; one with nothing to compute (max_new_tokens 0, no prompt scores) finishes at once:
        the next `step()` returns its final output (reason "length", no token)."""
        if request.sampling_params.max_new_tokens == 0 and request.prompt_scores is None:
            request.set_status(RequestStatus.FINISHED_LENGTH)
            request.finished_time = self.scheduler.clock()
            self._pending.append(EngineCoreOutput(request.request_id, finished=True, finish_reason=FinishReason.LENGTH))
            return
        self.scheduler.add_request(request)

    def abort(self, request_id: str) -> bool:
        """Finishes the request now, in any state, with every choice it forked (llm/choices.py), freeing their
        blocks; the next `step()` returns the final output (reason "abort") of each one still unfinished. False
        when none is left or the id is not one of a request added."""
        members = self.scheduler.group_members(request_id)
        for request in members:
            self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_ABORTED)
            self._pending.append(EngineCoreOutput(request.request_id, finished=True, finish_reason=FinishReason.ABORT))
        return bool(members)

    def finish_request(self, request_id: str, status: RequestStatus) -> bool:
        """Finishes a request for a reason found outside the core (a stop string); no output follows."""
        return self.scheduler.finish_request(request_id, status)

    def get_request(self, request_id: str) -> Request | None:
        return self.scheduler.get_request(request_id)

    def take_forked(self) -> list[Request]:
        """The choices forked off their requests since the last call (Scheduler.take_forked)."""
        return self.scheduler.take_forked()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending) or self.executor.has_in_flight

    def add_step_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    # --- the loop body ------------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        """One model step, or round (nothing runs when nothing is schedulable); outputs of the requests it
        changed, plus the final outputs of requests aborted since the last step."""
        outputs = self.executor.step()
        return self._take_pending() + outputs

    def _take_pending(self) -> list[EngineCoreOutput]:
        pending, self._pending = self._pending, []
        return pending

    def _record(
        self,
        plan: SchedulerOutput,
        outputs: list[EngineCoreOutput],
        schedule_s: float,
        execute_s: float,
        update_s: float,
        num_steps: int = 1,
        verified: VerifyCounts | None = None,
    ) -> None:
        self.num_steps += 1
        num_prefill = sum(1 for row in plan.scheduled if row.is_prefill)
        bm = self.scheduler.block_manager
        stats = StepStats(
            step_id=plan.step_id,
            num_seqs=len(plan.scheduled),
            num_prefill_seqs=num_prefill,
            num_decode_seqs=len(plan.scheduled) - num_prefill,
            num_prefill_tokens=plan.num_prefill_tokens,
            num_decode_tokens=plan.num_decode_tokens,
            num_batched_tokens=plan.num_batched_tokens,
            token_budget_usage=plan.num_batched_tokens / self.config.max_num_batched_tokens,
            num_preempted=len(plan.preempted_request_ids),
            num_new_tokens=sum(len(o.new_token_ids) for o in outputs),
            num_finished=sum(1 for o in outputs if o.finished),
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_usage=bm.usage,
            num_free_blocks=bm.num_free_blocks,
            schedule_s=schedule_s,
            execute_s=execute_s,
            update_s=update_s,
            num_model_steps=num_steps,
        )
        if verified is not None:
            stats.num_drafts, stats.num_draft_tokens = verified.num_drafts, verified.num_draft_tokens
            stats.num_accepted_tokens = verified.num_accepted_tokens
            stats.accepted_per_position = tuple(verified.accepted_per_position)
        self.last_stats = stats
        for listener in self._listeners:
            listener(stats)


def _check_speculation(config: SchedulerConfig, runner: ModelRunner) -> None:
    """Speculative decoding needs every position's logits of the rows it verifies: a runner that verifies its
    proposals in one step (`spec_tokens`), or one that returns them for any row (PromptScorer: one call per row).
    Raises ValueError otherwise."""
    if config.speculative is None:
        return
    if getattr(runner, "spec_tokens", 0) >= config.speculative.num_speculative_tokens:
        return
    refusal = score_refusal(runner)
    if refusal is not None:
        raise ValueError(
            f"speculative decoding verifies proposed tokens with every position's logits, which this "
            f"model runner cannot return: {refusal}"
        )
