"""The master's LLM backend against a fake worker: an in-process gRPC server whose Session hands each command
to the test and sends back the batches the test writes. Every wait has a deadline."""

import asyncio

import grpc
import pytest
from llm_setup import llm_worker_registry

from mindspore_serving.common import errors
from mindspore_serving.ipc import llm_session
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.master import llm_backend
from mindspore_serving.master.llm_backend import MasterLlmBackend
from mindspore_serving.master.llm_types import FinalEvent, GenerationRequest, TokenEvent
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
from mindspore_serving.proto import llm_worker_pb2 as pb
from mindspore_serving.proto import llm_worker_pb2_grpc
from mindspore_serving.spec.llm import GENERATE_METHOD, LLM_EXTENSION

DEADLINE_S = 5.0
_END = object()


class FakeWorker(llm_worker_pb2_grpc.LlmWorkerServicer):
    """Each command goes to `commands`; each item put on `batches` is sent back (`_END` ends the session)."""

    def __init__(self):
        self.commands: asyncio.Queue = asyncio.Queue()
        self.batches: asyncio.Queue = asyncio.Queue()

    async def Session(self, request_iterator, context):  # pylint: disable=invalid-name
        async def read():
            async for command in request_iterator:
                await self.commands.put(command)

        reader = asyncio.ensure_future(read())
        try:
            while (batch := await self.batches.get()) is not _END:
                yield batch
        finally:
            reader.cancel()

    async def command(self) -> pb.SessionCommand:
        return await asyncio.wait_for(self.commands.get(), DEADLINE_S)

    def send(self, stream_id, *events):
        self.batches.put_nowait(pb.SessionBatch(streams=[pb.StreamEvents(stream_id=stream_id, events=events)]))


def facts(version=llm_session.LLM_SESSION_PROTOCOL_VERSION):
    text = llm_session.registration_facts(
        model_id="tiny", max_model_len=64, max_num_seqs=4, max_queue_size=8, vocab_size=100
    )
    return text.replace(
        f'"session_protocol": {llm_session.LLM_SESSION_PROTOCOL_VERSION}', f'"session_protocol": {version}'
    )


def run(scenario, version=llm_session.LLM_SESSION_PROTOCOL_VERSION):
    """Runs `scenario(backend, worker)` against a fake worker registered as servable "tiny"."""

    async def main():
        worker = FakeWorker()
        server = grpc.aio.server()
        llm_worker_pb2_grpc.add_LlmWorkerServicer_to_server(worker, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        registry = llm_worker_registry(channel, facts(version), batch_size=4)
        try:
            return await asyncio.wait_for(scenario(MasterLlmBackend(registry), worker), DEADLINE_S)
        finally:
            await channel.close()
            await server.stop(None)

    return asyncio.run(main())


def token(token_id, text, index, special=False):
    return pb.GenerateEvent(token=pb.Token(id=token_id, text=text, logprob=-0.25, special=special, index=index))


def final():
    return pb.GenerateEvent(
        final=pb.Final(
            text="ab",
            token_ids=[11, 12],
            finish_reason=pb.FINISH_REASON_LENGTH,
            prompt_tokens=3,
            completion_tokens=2,
            queue_time=0.5,
            time_to_first_token=1.0,
            inter_token_latency=0.25,
            e2e_latency=2.0,
            prompt="Hi",
        )
    )


def error(kind, message):
    return pb.GenerateEvent(error=pb.Error(kind=kind, message=message))


REQUEST = GenerationRequest(
    model="tiny",
    prompt="Hi",
    params={"max_new_tokens": 2, "temperature": 0, "seed": 0, "stop": ["\n"]},
    request_id="r-1",
)


def test_a_generation_yields_its_tokens_then_its_final_event():
    async def scenario(backend, worker):
        events = backend.stream(REQUEST)
        first = asyncio.ensure_future(events.__anext__())
        command = await worker.command()
        generate = command.generate
        assert (generate.request_id, generate.prompt) == ("r-1", "Hi")
        assert llm_session.params_from_proto(generate.params) == SamplingParams(
            max_new_tokens=2, temperature=0.0, seed=0, stop=("\n",)
        )
        assert generate.params.HasField("seed") and not generate.params.HasField("do_sample")
        worker.send(command.stream_id, token(11, "a", 0), token(12, "b", 1, special=True), final())
        received = [await first] + [event async for event in events]
        worker.batches.put_nowait(_END)
        return received

    tokens_and_final = run(scenario)
    assert tokens_and_final[:2] == [TokenEvent(11, "a", -0.25, False, 0), TokenEvent(12, "b", -0.25, True, 1)]
    last = tokens_and_final[2]
    assert isinstance(last, FinalEvent) and len(tokens_and_final) == 3
    assert (last.text, last.token_ids, last.finish_reason, last.prompt_tokens, last.completion_tokens, last.prompt) == (
        "ab",
        [11, 12],
        "length",
        3,
        2,
        "Hi",
    )
    assert (
        last.timing.queue_time,
        last.timing.time_to_first_token,
        last.timing.inter_token_latency,
        last.timing.e2e_latency,
    ) == (0.5, 1.0, 0.25, 2.0)


@pytest.mark.parametrize(
    "kind,raised",
    [
        (pb.ERROR_KIND_VALIDATION, errors.InvalidInputs),
        (pb.ERROR_KIND_OVERLOADED, errors.Overloaded),
        (pb.ERROR_KIND_NOT_FOUND, errors.ServableUnavailable),
        (pb.ERROR_KIND_UNAVAILABLE, errors.WorkerUnavailable),
        (pb.ERROR_KIND_GENERATION, errors.Failed),
        (pb.ERROR_KIND_INCOMPLETE, errors.IncompleteGeneration),
        (pb.ERROR_KIND_INTERNAL, errors.Failed),
    ],
)
def test_an_error_event_raises_the_exception_of_its_kind(kind, raised):
    async def scenario(backend, worker):
        events = backend.stream(REQUEST)
        first = asyncio.ensure_future(events.__anext__())
        command = await worker.command()
        worker.send(command.stream_id, error(kind, "what went wrong"))
        try:
            await first
        except errors.ServingError as err:
            return err
        finally:
            worker.batches.put_nowait(_END)

    err = run(scenario)
    assert type(err) is raised and err.message == "what went wrong"  # pylint: disable=unidiomatic-typecheck


def test_a_consumer_that_goes_away_aborts_its_request_in_the_worker():
    async def scenario(backend, worker):
        events = backend.stream(REQUEST)
        first = asyncio.ensure_future(events.__anext__())
        command = await worker.command()
        worker.send(command.stream_id, token(11, "a", 0))
        await first
        await events.aclose()
        abort = await worker.command()
        worker.batches.put_nowait(_END)
        return command.stream_id, abort

    stream_id, abort = run(scenario)
    assert abort.stream_id == stream_id and abort.WhichOneof("command") == "abort"


def test_a_lost_session_fails_its_generations_with_worker_unavailable():
    async def scenario(backend, worker):
        events = backend.stream(REQUEST)
        first = asyncio.ensure_future(events.__anext__())
        await worker.command()
        worker.batches.put_nowait(_END)
        with pytest.raises(errors.WorkerUnavailable) as info:
            await first
        return info.value.message

    assert run(scenario) == "Model tiny is not available: the worker (pid 4242) stopped while generating"


def test_a_generation_whose_worker_shows_no_progress_for_the_token_timeout_fails_and_is_aborted_in_the_worker(
    monkeypatch,
):
    logged = []
    monkeypatch.setattr(llm_backend.log, "error", logged.append)

    async def scenario(backend, worker):
        backend.token_timeout = 0.05
        events = backend.stream(REQUEST)
        first = asyncio.ensure_future(events.__anext__())
        command = await worker.command()
        worker.send(command.stream_id, token(11, "a", 0))
        await first
        with pytest.raises(errors.WorkerUnavailable) as info:
            await events.__anext__()  # the worker says nothing more, not even a heartbeat
        abort = await worker.command()
        worker.batches.put_nowait(_END)
        return info.value.message, command.stream_id, abort

    message, stream_id, abort = run(scenario)
    assert message == "Model tiny is not available: its worker made no progress for 0.05 s"
    assert abort.stream_id == stream_id and abort.WhichOneof("command") == "abort"
    assert logged == ["generation r-1 on worker pid 4242: the worker's engine made no progress for 0.05 s; aborting it"]


def test_a_generation_waiting_its_turn_outlives_the_token_timeout_while_its_worker_progresses():
    """No token for 8 token timeouts, but the worker's heartbeats (empty batches) and the tokens of another
    generation on the session say that its engine steps: the generation waits, then completes."""

    async def scenario(backend, worker):
        backend.token_timeout = 0.1
        waiting = backend.stream(REQUEST)
        first = asyncio.ensure_future(waiting.__anext__())
        command = await worker.command()
        other = backend.stream(REQUEST)
        other_first = asyncio.ensure_future(other.__anext__())
        other_command = await worker.command()
        for beat in range(40):  # 0.8 s: beats, and now and then the other generation's token
            if beat % 10 == 9:
                worker.send(other_command.stream_id, token(11, "a", beat))
            else:
                worker.batches.put_nowait(llm_session.progress_batch())
            await asyncio.sleep(0.02)
        assert not first.done()
        worker.send(command.stream_id, token(11, "a", 0), token(12, "b", 1), final())
        received = [await first] + [event async for event in waiting]
        await other_first
        await other.aclose()
        worker.batches.put_nowait(_END)
        return received

    received = run(scenario)
    assert [type(event).__name__ for event in received] == ["TokenEvent", "TokenEvent", "FinalEvent"]


@pytest.mark.parametrize(
    "timeout,progressed_at,since,now,left",
    [
        (0.0, 0.0, 0.0, 1e9, None),  # no limit
        (60.0, 100.0, 50.0, 130.0, 30.0),  # counted from the worker's last progress
        (60.0, 100.0, 120.0, 130.0, 50.0),  # a generation newer than that progress gets a whole timeout
        (60.0, 100.0, 50.0, 160.0, 0.0),  # hung
    ],
)
def test_a_worker_is_hung_only_after_the_timeout_without_progress_counted_from_the_later_start(
    timeout, progressed_at, since, now, left
):
    assert llm_backend.stall_left(timeout, progressed_at, since, now) == left


def test_bad_parameters_fail_in_the_master_with_the_engine_s_message():
    async def scenario(backend, worker):
        bad = GenerationRequest(model="tiny", prompt="Hi", params={"top_p": 1.5})
        with pytest.raises(errors.InvalidInputs) as info:
            await backend.stream(bad).__anext__()
        assert worker.commands.empty()
        return info.value.message

    assert run(scenario) == "top_p must be in (0, 1], got 1.5"


def test_a_worker_of_another_session_protocol_is_not_used():
    async def scenario(backend, _worker):
        assert backend.models() == []
        with pytest.raises(errors.ServableUnavailable) as info:
            await backend.stream(REQUEST).__anext__()
        return info.value.message

    assert run(scenario, version=llm_session.LLM_SESSION_PROTOCOL_VERSION + 1) == "Model tiny is not a language model"


def test_models_carry_the_tool_call_parser_their_worker_announces():
    registry = WorkerRegistry()
    for name, extra in (("qwen", {"tool_call_parser": "hermes"}), ("plain", {"tool_call_parser": None}), ("older", {})):
        text = llm_session.registration_facts(
            model_id=name, max_model_len=64, max_num_seqs=4, max_queue_size=8, vocab_size=100, **extra
        )
        registry.add(
            WorkerRecord(
                key=f"{name}@0",
                pid=1,
                address="",
                servable_name=name,
                version_number=1,
                batch_size=4,
                methods={GENERATE_METHOD: None},
                extensions={LLM_EXTENSION: text},
            )
        )
    parsers = {info.name: info.tool_call_parser for info in MasterLlmBackend(registry).models()}
    assert parsers == {"qwen": "hermes", "plain": None, "older": None}


def choice_final(choice, completion_tokens, cumulative_logprob):
    return pb.GenerateEvent(
        final=pb.Final(
            text="x",
            token_ids=[11] * completion_tokens,
            prompt_tokens=3,
            completion_tokens=completion_tokens,
            finish_reason=pb.FINISH_REASON_LENGTH,
            choice=choice,
            cumulative_logprob=cumulative_logprob,
        )
    )


def test_a_generation_with_several_choices_ends_after_the_final_of_each():
    request = GenerationRequest(
        model="tiny", prompt="Hi", params={"max_new_tokens": 2, "n": 2, "best_of": 3}, request_id="r-2"
    )

    async def scenario(backend, worker):
        events = backend.stream(request)
        first = asyncio.ensure_future(events.__anext__())
        command = await worker.command()
        assert llm_session.params_from_proto(command.generate.params).num_choices == 3
        prompt = llm_session.prompt_scores_event([llm_session.PromptToken(5, "H", None)])
        second = pb.GenerateEvent(token=pb.Token(id=12, text="b", logprob=-1.0, index=0, choice=2))
        worker.send(
            command.stream_id, prompt, token(11, "a", 0), second, choice_final(2, 1, -1.0), choice_final(0, 2, -0.5)
        )
        received = [await first]
        worker.send(command.stream_id, choice_final(1, 2, -0.75))
        received += [event async for event in events]
        worker.batches.put_nowait(_END)
        stats = backend.metrics.llm_model("tiny")
        return received, (stats.prompt_tokens, stats.generation_tokens, dict(stats.finished))

    received, stats = run(scenario)
    assert [type(e).__name__ for e in received] == [
        "PromptEvent",
        "TokenEvent",
        "TokenEvent",
        "FinalEvent",
        "FinalEvent",
        "FinalEvent",
    ]
    assert [e.choice for e in received[1:3]] == [0, 2]
    assert [(e.choice, e.cumulative_logprob) for e in received[3:]] == [(2, -1.0), (0, -0.5), (1, -0.75)]
    assert stats == (3, 5, {"length": 1})


def test_an_error_of_one_choice_ends_the_generation_without_an_abort():
    request = GenerationRequest(model="tiny", prompt="Hi", params={"max_new_tokens": 2, "n": 2}, request_id="r-3")

    async def scenario(backend, worker):
        events = backend.stream(request)
        first = asyncio.ensure_future(events.__anext__())
        command = await worker.command()
        worker.send(command.stream_id, choice_final(0, 2, -0.5), error(pb.ERROR_KIND_GENERATION, "boom"))
        assert isinstance(await first, FinalEvent)
        with pytest.raises(errors.Failed, match="boom"):
            await events.__anext__()
        await asyncio.sleep(0)  # an abort would be written now
        worker.batches.put_nowait(_END)
        return worker.commands.qsize(), dict(backend.metrics.llm_model("tiny").finished)

    assert run(scenario) == (0, {"error": 1})
