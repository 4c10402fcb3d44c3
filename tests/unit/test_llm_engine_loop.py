"""The threaded engine loop over the fake runner: streaming, abort, back-pressure, timeouts, bad input."""

import functools
import itertools
import threading

import pytest

from mindspore_serving.common import errors
from mindspore_serving.llm import LLMEngine, SchedulerConfig
from mindspore_serving.llm.engine_loop import EngineLoop
from mindspore_serving.llm.testing import FakeModelRunner, reference_greedy

GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}


def new_runner():
    return FakeModelRunner(num_blocks=64, block_size=4, max_seq_len=64, vocab_size=97)


@pytest.fixture
def runner():
    return new_runner()


def make_loop(runner, **kwargs):
    config = SchedulerConfig.for_runner(runner, max_num_seqs=4, max_num_batched_tokens=64)
    return EngineLoop(LLMEngine(runner, scheduler_config=config), **kwargs)


def test_streamed_tokens_match_reference(runner):
    loop = make_loop(runner)
    try:
        prompts = [[1, 2, 3], [5, 6, 7, 8, 9], [11]]
        streams = [loop.submit(p, GREEDY) for p in prompts]
        for prompt, stream in zip(prompts, streams):
            tokens = [t for out in stream for t in out.new_token_ids]
            assert tokens == reference_greedy(new_runner, prompt, 8)
            assert stream.final.finish_reason.value == "length"
    finally:
        loop.close()


def test_abort_finishes_request_and_frees_capacity(runner):
    loop = make_loop(runner, max_waiting=0)
    try:
        long = {"temperature": 0.0, "max_new_tokens": 50, "ignore_eos": True}
        streams = [loop.submit([1, 2], long) for _ in range(4)]
        with pytest.raises(errors.Overloaded) as refused:  # at admission, before the request is queued
            loop.submit([1], GREEDY)
        assert refused.value.message == (
            "Model is overloaded: 4 requests are in the engine, its limit (max_num_seqs 4 running + "
            "max_queue_size 0 waiting); retry later"
        )
        first = streams[0]
        first.get()
        first.abort()
        assert first.result().finish_reason.value == "abort"
        assert loop.submit([3], GREEDY).result().finished
        for stream in streams[1:]:
            stream.abort()
            stream.result()
    finally:
        loop.close()


def test_bad_request_gets_error_and_others_continue(runner):
    loop = make_loop(runner)
    try:
        bad = loop.submit([1, 2], {"temperature": -1.0})
        with pytest.raises(errors.InvalidInputs, match="temperature"):
            bad.result()
        empty = loop.submit([], GREEDY)
        with pytest.raises(errors.InvalidInputs):
            empty.result()
        assert loop.submit([4, 5], GREEDY).result().token_ids == reference_greedy(new_runner, [4, 5], 8)
    finally:
        loop.close()


def test_request_timeout_aborts_on_the_engine_clock(runner):
    """The deadline is read on the engine's clock: one that moves a second per reading aborts a request of 60 tokens
    with a 20 s timeout after at most 20 loop iterations, whatever the real time."""
    config = SchedulerConfig.for_runner(runner, max_num_seqs=4, max_num_batched_tokens=64)
    clock = functools.partial(next, itertools.count(100.0, 1.0))
    loop = EngineLoop(LLMEngine(runner, scheduler_config=config, clock=clock), request_timeout=20.0)
    try:
        out = loop.submit([1, 2], {"temperature": 0.0, "max_new_tokens": 60, "ignore_eos": True}).result()
        assert out.finish_reason.value == "abort" and len(out.token_ids) < 2 + 20
    finally:
        loop.close()


def test_close_fails_pending_requests(runner):
    loop = make_loop(runner)
    stream = loop.submit([1, 2], {"temperature": 0.0, "max_new_tokens": 60, "ignore_eos": True})
    loop.close()
    with pytest.raises(errors.ServingError):
        stream.result()
    with pytest.raises(
        errors.WorkerUnavailable, match="the LLM engine is stopping"
    ):  # retry later, not "no such model"
        loop.submit([1], GREEDY)


def test_close_ends_every_stream_when_the_loop_thread_does_not_stop_in_time(runner, monkeypatch):
    """close() gives up on a loop thread stuck in the engine (here in a step, with a request half generated and
    another waiting to be taken): every request fails with the close reason, close() itself raises nothing, and the
    thread drops what it does later."""
    loop = make_loop(runner)
    entered, release = threading.Event(), threading.Event()
    step = loop.engine.step
    steps = itertools.count()

    def stuck_step():
        if next(steps) == 1:  # the second step: the first token is out, the request is far from its end
            entered.set()
            release.wait(10)
        return step()

    monkeypatch.setattr(loop.engine, "step", stuck_step)
    running = loop.submit([1, 2], {"temperature": 0.0, "max_new_tokens": 60, "ignore_eos": True})
    running.get(timeout=10)
    assert entered.wait(10)
    waiting = loop.submit([3], GREEDY)
    loop.close_timeout = 0.01
    loop.close("stopping for the test")
    with pytest.raises(errors.WorkerUnavailable, match="stopping for the test"):
        running.result()
    with pytest.raises(errors.WorkerUnavailable, match="stopping for the test"):
        waiting.get(timeout=5)
    release.set()
    loop._thread.join(timeout=10)
    assert not loop._thread.is_alive()


class _CollectingSink:
    """An OutputSink that records each flush as one batch of (tag, item)."""

    def __init__(self):
        import queue

        self.pending, self.batches = [], queue.SimpleQueue()

    def put(self, stream, item):
        self.pending.append((stream.tag, item))

    def flush(self):
        self.batches.put(self.pending)
        self.pending = []

    def collect(self, tags):
        """Batches until every tag has finished (an exception or a finished output)."""
        open_tags, batches = set(tags), []
        while open_tags:
            batch = self.batches.get(timeout=10)
            batches.append(batch)
            for tag, item in batch:
                if isinstance(item, BaseException) or item.finished:
                    open_tags.discard(tag)
        return batches


def test_sink_gets_one_batch_per_step_in_order(runner):
    loop = make_loop(runner)
    sink = _CollectingSink()
    try:
        prompts = {"a": [1, 2, 3], "b": [5, 6, 7, 8, 9], "c": [11]}
        streams = {tag: loop.submit(p, GREEDY, sink=sink, tag=tag) for tag, p in prompts.items()}
        batches = sink.collect(prompts)
        for batch in batches:  # a request appears at most once per step
            tags = [tag for tag, _ in batch]
            assert len(tags) == len(set(tags))
        assert max(len(b) for b in batches) == 3  # the three requests share steps
        for tag, prompt in prompts.items():
            tokens = [t for b in batches for t_tag, out in b if t_tag == tag for t in out.new_token_ids]
            assert tokens == reference_greedy(new_runner, prompt, 8)
        assert all(s._outputs.empty() for s in streams.values())  # nothing went to the streams' own queues
    finally:
        loop.close()


def test_sink_gets_validation_errors_and_close_errors(runner):
    loop = make_loop(runner)
    sink = _CollectingSink()
    try:
        loop.submit([1], {"temperature": -1.0}, sink=sink, tag="bad")
        [[(tag, item)]] = sink.collect(["bad"])
        assert tag == "bad" and isinstance(item, errors.InvalidInputs)
        loop.submit([1, 2], {"temperature": 0.0, "max_new_tokens": 60, "ignore_eos": True}, sink=sink, tag="long")
    finally:
        loop.close("stopping for the test")
    items = [
        item for batch in iter(lambda: None if sink.batches.empty() else sink.batches.get(), None) for _, item in batch
    ]
    assert isinstance(items[-1], errors.WorkerUnavailable) and items[-1].message == "stopping for the test"


def test_a_request_arrives_when_it_is_submitted_not_when_the_loop_takes_it(runner):
    now = [100.0]
    config = SchedulerConfig.for_runner(runner, max_num_seqs=4, max_num_batched_tokens=64)
    loop = EngineLoop(LLMEngine(runner, scheduler_config=config, clock=lambda: now[0]))
    try:
        stream = loop.submit([1, 2, 3], GREEDY)
        now[0] = 200.0  # the loop thread may take the request before or after this
        metrics = stream.result().metrics
        assert metrics.arrival_time == 100.0 and metrics.queue_time >= 0
    finally:
        loop.close()


@pytest.mark.parametrize(
    "failure, kind, text",
    [
        (
            errors.WorkerUnavailable("LLM agent rank 0 of m is gone"),
            errors.WorkerUnavailable,
            r"^LLM agent rank 0 of m is gone$",
        ),
        (RuntimeError("boom"), errors.ServingError, r"^LLM engine failed: RuntimeError: boom$"),
    ],
)
def test_a_broken_step_fails_the_requests_keeping_an_unavailable_reason(runner, monkeypatch, failure, kind, text):
    """A model runner that lost its agent before the worker closed the loop still means "retry later"; anything
    else is the engine's failure."""
    loop = make_loop(runner)
    try:

        def broken():
            raise failure

        monkeypatch.setattr(loop.engine, "step", broken)
        stream = loop.submit([1, 2], GREEDY)
        with pytest.raises(kind, match=text) as info:
            stream.result()
        assert isinstance(info.value, errors.WorkerUnavailable) == isinstance(failure, errors.WorkerUnavailable)
    finally:
        loop.close()
