"""Step executors: which one the factory picks, and what each hands the runner and returns, step by step.

The runners are scripted: the token after a sequence is 10 + its context length, whatever the tokens, so
every output below is literal. A submitted step computes nothing until its result is asked for.
"""

from concurrent.futures import Future

import numpy as np
import pytest

from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.model_io import MultiStepRunner, StepSubmitter
from mindspore_serving.llm.request import FinishReason, Request
from mindspore_serving.llm.sampler import Sampler
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.llm.scheduler import Scheduler
from mindspore_serving.llm.step_executor import (
    AsyncStepExecutor,
    MultiStepExecutor,
    SingleStepExecutor,
    make_step_executor,
)

VOCAB = 64


def next_token(context_len):
    return 10 + context_len


class ScriptedRunner:
    """Only `run`: the one-hot logits of next_token."""

    block_size, num_blocks, max_seq_len, vocab_size = 4, 64, 32, VOCAB

    def __init__(self):
        self.calls = []

    def run(self, seqs):
        self.calls.append(("run", [(s.token_ids, s.start_pos) for s in seqs]))
        logits = np.zeros((len(seqs), VOCAB), np.float32)
        for row, seq in enumerate(seqs):
            logits[row, next_token(seq.context_len)] = 10.0
        return logits


class ScriptedMultiStepRunner(ScriptedRunner, MultiStepRunner):
    def run_greedy(self, seqs, num_steps):
        self.calls.append(("run_greedy", [(s.token_ids, s.start_pos) for s in seqs], num_steps))
        tokens = np.array([[next_token(s.context_len + k) for k in range(num_steps)] for s in seqs], np.int64)
        return tokens, np.zeros(tokens.shape, np.float32)


class _Later(Future):
    def __init__(self, compute):
        super().__init__()
        self.compute = compute

    def result(self, timeout=None):
        if not self.done():
            self.set_result(self.compute())
        return super().result(timeout)


class ScriptedSubmitter(ScriptedMultiStepRunner, StepSubmitter):
    """`submissions`: (greedy_steps, prev_rows, steps submitted before it and not yet collected)."""

    def __init__(self):
        super().__init__()
        self.submissions = []
        self._futures = []

    def submit(self, seqs, greedy_steps=0, prev_rows=()):
        pending = sum(1 for f in self._futures if not f.done())
        self.submissions.append((greedy_steps, list(prev_rows), pending))
        future = _Later(lambda: self.run_greedy(seqs, greedy_steps) if greedy_steps else self.run(seqs))
        self._futures.append(future)
        return future


class Forwarding:
    """A wrapper that adds `submit` to the runner it forwards everything else to (as the real-graph oracle's)."""

    def __init__(self, runner):
        self.runner = runner

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def submit(self, seqs, greedy_steps=0, prev_rows=()):
        raise NotImplementedError


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_executor(runner, **overrides):
    values = dict(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=32, block_size=4, num_blocks=64)
    values.update(overrides)
    config = SchedulerConfig(**values)
    scheduler = Scheduler(config, clock=FakeClock())
    steps = []
    executor = make_step_executor(
        config,
        runner,
        scheduler,
        Sampler(),
        lambda plan, outputs, *times_steps_counts: steps.append(times_steps_counts[3]),
        timer=lambda: 0.0,
    )
    return executor, scheduler, steps


def add(scheduler, request_id, prompt_len, max_new, first_token=100, **params):
    params = dict(dict(temperature=0), **params)
    request = Request(
        request_id,
        [first_token + i for i in range(prompt_len)],
        SamplingParams(max_new_tokens=max_new, **params),
        arrival_time=scheduler.clock(),
    )
    scheduler.add_request(request)
    return request


def summary(outputs):
    return [(o.request_id, o.new_token_ids, o.finished) for o in outputs]


# --- the factory ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "runner, overrides, chosen",
    [
        (ScriptedRunner(), dict(num_scheduler_steps=4, async_scheduling=True), SingleStepExecutor),
        (ScriptedMultiStepRunner(), dict(), SingleStepExecutor),
        (ScriptedMultiStepRunner(), dict(num_scheduler_steps=4), MultiStepExecutor),
        (ScriptedMultiStepRunner(), dict(num_scheduler_steps=4, async_scheduling=True), MultiStepExecutor),
        (ScriptedSubmitter(), dict(num_scheduler_steps=4), MultiStepExecutor),
        (ScriptedSubmitter(), dict(async_scheduling=True), AsyncStepExecutor),
        (Forwarding(ScriptedMultiStepRunner()), dict(async_scheduling=True), AsyncStepExecutor),
    ],
    ids=[
        "run-only",
        "one-step-rounds",
        "rounds",
        "rounds-without-submit",
        "submitter-without-async",
        "async",
        "wrapper-with-submit",
    ],
)
def test_the_executor_follows_the_config_and_what_the_runner_declares(runner, overrides, chosen):
    assert type(make_executor(runner, **overrides)[0]) is chosen


# --- one step per call ----------------------------------------------------------------------
def test_single_steps_schedule_run_sample_update():
    runner = ScriptedMultiStepRunner()
    executor, scheduler, steps = make_executor(runner)
    add(scheduler, "a", 3, max_new=2)
    add(scheduler, "b", 5, max_new=1, first_token=200)
    assert summary(executor.step()) == [("a", [13], False), ("b", [15], True)]
    assert summary(executor.step()) == [("a", [14], True)]
    assert executor.step() == [] and not scheduler.has_unfinished()
    assert runner.calls == [("run", [([100, 101, 102], 0), ([200, 201, 202, 203, 204], 0)]), ("run", [([13], 3)])]
    assert steps == [1, 1]


def test_a_failing_step_fails_its_requests_only():
    runner = ScriptedRunner()
    executor, scheduler, _ = make_executor(runner)
    add(scheduler, "a", 3, max_new=2)
    runner.run = lambda seqs: np.zeros((len(seqs) + 1, VOCAB), np.float32)  # a row too many
    outputs = executor.step()
    assert [(o.request_id, o.finish_reason) for o in outputs] == [("a", FinishReason.ERROR)]
    assert "logits of shape (2, 64) for 1 sequences" in outputs[0].error
    assert not scheduler.has_unfinished()


# --- multi-step rounds ----------------------------------------------------------------------
def test_rounds_run_greedy_decodes_back_to_back_and_each_request_takes_what_it_needs():
    runner = ScriptedMultiStepRunner()
    executor, scheduler, steps = make_executor(runner, num_scheduler_steps=4)
    add(scheduler, "a", 3, max_new=6)
    add(scheduler, "b", 2, max_new=3, first_token=200)
    # prompts in a batch with room: one step, their first tokens at once
    assert summary(executor.step()) == [("a", [13], False), ("b", [12], False)]
    # b stops after two more tokens; the rest of its round is dropped
    assert summary(executor.step()) == [("a", [14, 15, 16, 17], False), ("b", [13, 14], True)]
    assert summary(executor.step()) == [("a", [18], True)]
    assert runner.calls == [
        ("run", [([100, 101, 102], 0), ([200, 201], 0)]),
        ("run_greedy", [([13], 3), ([12], 2)], 4),
        ("run_greedy", [([17], 7)], 4),
    ]
    assert steps == [1, 4, 4]


def test_a_sampled_request_keeps_the_batch_to_single_steps():
    runner = ScriptedMultiStepRunner()
    executor, scheduler, steps = make_executor(runner, num_scheduler_steps=4)
    add(scheduler, "a", 3, max_new=3)
    add(scheduler, "b", 2, max_new=3, first_token=200, temperature=1.0, seed=0)
    while scheduler.has_unfinished():
        executor.step()
    assert [call[0] for call in runner.calls] == ["run"] * 3 and steps == [1, 1, 1]


# --- async scheduling -----------------------------------------------------------------------
def test_async_submits_the_next_step_before_collecting_the_one_in_flight():
    runner = ScriptedSubmitter()
    executor, scheduler, steps = make_executor(runner, async_scheduling=True, num_scheduler_steps=2)
    add(scheduler, "a", 3, max_new=3)  # a lone request keeps its rounds even right after arriving
    assert executor.step() == [] and executor.has_in_flight
    assert summary(executor.step()) == [("a", [13], False)]
    # a reaches max_new_tokens within the round in flight: it leaves the batch, nothing more is planned
    assert summary(executor.step()) == [("a", [14, 15], True)]
    assert not executor.has_in_flight and not scheduler.has_unfinished()
    assert runner.submissions == [(1, [], 0), (2, [0], 1)]
    # the second step continues from a token still being computed: the runner fills the placeholder
    assert runner.calls == [("run_greedy", [([100, 101, 102], 0)], 1), ("run_greedy", [([-1], 3)], 2)]
    assert steps == [1, 2]


def test_async_collects_a_step_that_samples_in_the_engine_at_once():
    runner = ScriptedSubmitter()
    executor, scheduler, _ = make_executor(runner, async_scheduling=True, num_scheduler_steps=2)
    add(scheduler, "a", 3, max_new=2, temperature=1.0, seed=0)
    assert [o.request_id for o in executor.step()] == ["a"] and not executor.has_in_flight
    assert runner.submissions == [(0, [], 0)]


def test_async_rounds_are_single_steps_while_requests_keep_arriving_to_a_batch_with_room():
    runner = ScriptedSubmitter()
    executor, scheduler, _ = make_executor(runner, async_scheduling=True, num_scheduler_steps=4)
    add(scheduler, "a", 3, max_new=30)
    add(scheduler, "b", 3, max_new=30, first_token=200)
    executor.step()  # both prompts, the last arrival just now
    executor.step()
    scheduler.clock.now += 1.5  # nobody arrived for a while (the tail of a burst)
    executor.step()
    assert [greedy_steps for greedy_steps, _, _ in runner.submissions] == [1, 1, 4]
