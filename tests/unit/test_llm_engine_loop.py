"""The threaded engine loop over the fake runner: streaming, abort, back-pressure, timeouts, bad input."""
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
        with pytest.raises(errors.Overloaded, match="Model is overloaded"):
            loop.submit([1], GREEDY)
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


def test_request_timeout_aborts(runner):
    loop = make_loop(runner, request_timeout=1e-6)
    try:
        out = loop.submit([1, 2], {"temperature": 0.0, "max_new_tokens": 60, "ignore_eos": True}).result()
        assert out.finish_reason.value == "abort"
    finally:
        loop.close()


def test_close_fails_pending_requests(runner):
    loop = make_loop(runner)
    stream = loop.submit([1, 2], {"temperature": 0.0, "max_new_tokens": 60, "ignore_eos": True})
    loop.close()
    with pytest.raises(errors.ServingError):
        stream.result()
    with pytest.raises(errors.ServableUnavailable):
        loop.submit([1], GREEDY)
