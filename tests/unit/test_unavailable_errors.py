"""One answer for "unavailable, retry later": a lost agent or a down worker becomes an unavailable error at every
hop (agent client -> engine step -> session event -> master -> front end), and each protocol answers it as
such: HTTP 503 + Retry-After (OpenAI, TGI, MindSpore shapes), gRPC UNAVAILABLE. Also: a malformed protobuf is
INVALID_ARGUMENT."""

import asyncio
import json
import threading

import grpc
import numpy as np
import pytest
from fastapi import FastAPI
from grpc_fakes import FakeFuture
from serving_process import free_port
from starlette.testclient import TestClient
from test_llm_step_executor import ScriptedRunner, add, make_executor

from mindspore_serving.common import errors
from mindspore_serving.common.errors import Kind
from mindspore_serving.common.tensor_codec import instance_to_proto, tensor_to_value
from mindspore_serving.frontends import grpc_server
from mindspore_serving.frontends.errors import RETRY_AFTER_S, Protocol, http_error
from mindspore_serving.frontends.llm import build_llm_router
from mindspore_serving.frontends.llm.testing import FakeLlmBackend
from mindspore_serving.frontends.restful_server import RestfulApp
from mindspore_serving.ipc import llm_session
from mindspore_serving.llm.engine import RequestOutput
from mindspore_serving.llm.request import FinishReason
from mindspore_serving.master.llm_backend import MasterLlmBackend
from mindspore_serving.master.llm_types import GenerationRequest
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
from mindspore_serving.proto import agent_pb2, ms_service_pb2, ms_service_pb2_grpc
from mindspore_serving.spec.llm import GENERATE_METHOD, LLM_EXTENSION
from mindspore_serving.worker.llm.agent_client import AgentLost, _StepCall

LOST = f"LLM agent rank 1 of llama_tiny is gone (127.0.0.1:{free_port()}: UNAVAILABLE: Socket closed)"


class _RpcError(grpc.RpcError):
    """A failed gRPC call as the client library raises it: its str() is a multi-line repr."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "Socket closed"

    def __str__(self):
        return "<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE>"


def assert_no_repr(text):
    assert "<" not in text and "Rendezvous" not in text and "model step failed" not in text


# --- agent client ---------------------------------------------------------------------------------------


def test_agent_lost_is_an_unavailable_error():
    lost = AgentLost(LOST)
    assert isinstance(lost, errors.WorkerUnavailable) and isinstance(lost, RuntimeError)
    assert errors.kind_of(lost) is Kind.UNAVAILABLE and lost.code == errors.WORKER_UNAVAILABLE
    assert lost.message == LOST


def test_a_rank_that_fails_the_step_call_is_named_without_the_grpc_object():
    call = _StepCall(0, lambda _call, failed: None, "llama_tiny")
    call.start([FakeFuture(agent_pb2.StepReply(step_id=1)), FakeFuture(error=_RpcError())])
    with pytest.raises(AgentLost) as info:
        call.result()
    assert info.value.message == "LLM agent rank 1 of llama_tiny did not answer the step (UNAVAILABLE: Socket closed)"


def test_rank_zero_failing_only_when_its_result_is_read_is_still_an_agent_lost():
    failures = []
    call = _StepCall(0, lambda _call, failed: failures.append(failed), "llama_tiny")
    call.start([FakeFuture(raise_on_result=_RpcError())])
    with pytest.raises(AgentLost) as info:
        call.result()
    assert info.value.message == "LLM agent rank 0 of llama_tiny did not answer the step (UNAVAILABLE: Socket closed)"
    assert failures == [True]


# --- engine step -> session event -> master -----------------------------------------------------------


def test_a_step_failing_with_agent_lost_fails_its_requests_as_unavailable():
    runner = ScriptedRunner()
    executor, scheduler, _ = make_executor(runner)
    add(scheduler, "a", 3, max_new=2)

    def lost(_seqs):
        raise AgentLost(LOST)

    runner.run = lost
    (output,) = executor.step()
    assert (output.finish_reason, output.error, output.error_kind) == (FinishReason.ERROR, LOST, Kind.UNAVAILABLE)


def test_any_other_step_failure_stays_a_generation_failure():
    runner = ScriptedRunner()
    executor, scheduler, _ = make_executor(runner)
    add(scheduler, "a", 3, max_new=2)

    def broken(_seqs):
        raise RuntimeError("device lost")

    runner.run = broken
    (output,) = executor.step()
    assert (output.error, output.error_kind) == ("model step failed: RuntimeError: device lost", Kind.GENERATION)


def _failed_output(kind):
    return RequestOutput(
        request_id="r",
        prompt="Hi",
        prompt_token_ids=[5],
        new_token_ids=[],
        new_text="",
        token_ids=[],
        text="",
        finished=True,
        finish_reason=FinishReason.ERROR,
        error=LOST,
        error_kind=kind,
    )


@pytest.mark.parametrize(
    "kind, raised", [(Kind.UNAVAILABLE, errors.WorkerUnavailable), (Kind.GENERATION, errors.Failed)]
)
def test_the_error_event_carries_the_kind_to_the_master(kind, raised):
    (event,) = llm_session.output_events(_failed_output(kind), 0)
    with pytest.raises(raised) as info:
        llm_session.read_event(event)
    assert info.value.message == LOST and errors.kind_of(info.value) is kind


def _llm_record(pid=4242):
    facts = llm_session.registration_facts(
        model_id="tiny", max_model_len=64, max_num_seqs=4, max_queue_size=8, vocab_size=100
    )
    return WorkerRecord(
        key="tiny@0",
        pid=pid,
        address="",
        servable_name="tiny",
        version_number=1,
        batch_size=4,
        methods={GENERATE_METHOD: None},
        extensions={LLM_EXTENSION: facts},
    )


def test_a_served_model_without_a_live_worker_is_unavailable_and_an_unknown_one_not_found():
    registry = WorkerRegistry()
    backend = MasterLlmBackend(registry)
    registry.add(_llm_record())
    assert [m.name for m in backend.models()] == ["tiny"] and backend.unavailable_models() == {}
    registry.remove("tiny@0")  # the worker died; the master restarts it

    async def first_event(model):
        return await backend.stream(GenerationRequest(model=model, prompt="Hi")).__anext__()

    with pytest.raises(errors.WorkerUnavailable) as info:
        asyncio.run(first_event("tiny"))
    assert info.value.message == "Model tiny is not available: its worker is restarting"
    assert backend.unavailable_models() == {"tiny": info.value.message}
    with pytest.raises(errors.ServableUnavailable):
        asyncio.run(first_event("nope"))


# --- front ends ----------------------------------------------------------------------------------------


@pytest.fixture(name="http")
def _http():
    backend = FakeLlmBackend()
    app = FastAPI()
    app.include_router(build_llm_router(backend))
    with TestClient(app) as client:
        yield backend, client


def _retry_later(reply):
    assert reply.status_code == 503 and reply.headers["retry-after"] == str(RETRY_AFTER_S)
    return reply.json()


def test_a_model_down_for_now_is_503_with_retry_after_in_every_http_protocol(http):
    backend, client = http
    backend.down = {"llama_tiny": "Model llama_tiny is not available: its worker is restarting"}
    backend.served = []
    text = backend.down["llama_tiny"]
    body = _retry_later(client.post("/v1/completions", json={"model": "llama_tiny", "prompt": "Hi"}))
    assert body["error"] == {"message": text, "type": "server_error", "param": None, "code": "service_unavailable"}
    body = _retry_later(
        client.post(
            "/v1/chat/completions",
            json={"model": "llama_tiny", "messages": [{"role": "user", "content": "Hi"}], "stream": True},
        )
    )
    assert body["error"]["code"] == "service_unavailable"
    assert _retry_later(client.post("/generate", json={"inputs": "Hi"})) == {"error": text, "error_type": "unavailable"}
    assert _retry_later(client.post("/generate_stream", json={"inputs": "Hi"}))["error_type"] == "unavailable"
    assert _retry_later(client.post("/models/llama_tiny/generate", json={"inputs": "Hi"}))["error"] == text
    unknown = client.post("/v1/completions", json={"model": "nope", "prompt": "Hi"})
    assert unknown.status_code == 404 and "retry-after" not in unknown.headers
    assert unknown.json()["error"]["code"] == "model_not_found"


def test_an_agent_lost_mid_stream_ends_the_stream_with_an_unavailable_event(http):
    backend, client = http
    backend.fail_after = (2, AgentLost(LOST))
    with client.stream(
        "POST", "/v1/completions", json={"model": "llama_tiny", "prompt": "Hi", "stream": True}
    ) as reply:
        events = [line[len("data: ") :] for line in reply.iter_lines() if line.startswith("data: ")]
    assert reply.status_code == 200 and events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["message"], error["type"], error["code"]) == (LOST, "server_error", "service_unavailable")
    with client.stream("POST", "/generate_stream", json={"inputs": "Hi"}) as reply:
        last = [line for line in reply.iter_lines() if line.startswith("data:")][-1]
    assert json.loads(last[len("data:") :]) == {"error": LOST, "error_type": "unavailable"}
    assert_no_repr(LOST)


def test_the_classic_mindspore_shape_is_503_only_for_unavailable():
    assert http_error(Protocol.MINDSPORE, AgentLost(LOST)) == (503, {"error_msg": LOST})
    assert http_error(Protocol.MINDSPORE, errors.InvalidInputs("bad")) == (200, {"error_msg": "bad"})


class _Dispatcher:
    """y = x1 + x2; a request for servable "down" fails as a worker that died would fail it."""

    async def predict(self, spec, instances, timeout=None):
        if spec.name == "down":
            return [
                errors.WorkerUnavailable(
                    "Request servable(down) method(m) , servable is not available: the "
                    "worker (pid 7) stopped while handling it"
                )
            ] * len(instances)
        return [
            instance_to_proto({"y": tensor_to_value(i.items["x1"]) + tensor_to_value(i.items["x2"])}) for i in instances
        ]


def test_the_classic_restful_route_is_503_with_retry_after_when_the_servable_is_down():
    async def unused(scope, receive, send):
        raise AssertionError("the classic route answers itself")

    client = TestClient(RestfulApp(_Dispatcher(), 1 << 20, unused))  # no lifespan: only HTTP reaches the app
    body = _retry_later(client.post("/model/down:m", json={"instances": [{"x1": 1.0, "x2": 2.0}]}))
    assert body == {
        "error_msg": "Request servable(down) method(m) , servable is not available: the worker "
        "(pid 7) stopped while handling it"
    }
    ok = client.post("/model/add:add_common", json={"instances": [{"x1": 1.0, "x2": 2.0}]})
    assert ok.status_code == 200 and ok.json() == {"instances": [{"y": 3.0}]} and "retry-after" not in ok.headers


@pytest.fixture(name="grpc_address")
def _grpc_address():
    loop = asyncio.new_event_loop()

    async def start():
        server = grpc.aio.server()
        grpc_server.add_servicer(grpc_server.MSServiceServicer(_Dispatcher()), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _request(name, **inputs):
    request = ms_service_pb2.PredictRequest(servable_spec=ms_service_pb2.ServableSpec(name=name, method_name="m"))
    instance_to_proto({k: np.float32(v) for k, v in inputs.items()}, request.instances.add())
    return request


def test_grpc_predict_ends_with_unavailable_and_garbage_with_invalid_argument(grpc_address):
    with grpc.insecure_channel(grpc_address) as channel:
        stub = ms_service_pb2_grpc.MSServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(_request("down", x1=1, x2=2), timeout=10)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "servable is not available: the worker (pid 7) stopped" in info.value.details()
        raw = channel.unary_unary("/mindspore.serving.proto.MSService/Predict")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff garbage", timeout=10)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith("the request is not a valid mindspore.serving.proto.PredictRequest")
        assert "DecodeError" not in info.value.details() and "Unexpected" not in info.value.details()
        stream = channel.unary_stream("/mindspore.serving.proto.MSService/PredictStream")
        with pytest.raises(grpc.RpcError) as info:
            list(stream(b"\xff\xff\xff garbage", timeout=10))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        reply = stub.Predict(_request("add", x1=1, x2=2), timeout=10)
        assert not reply.error_msg and tensor_to_value(reply.instances[0].items["y"]) == 3.0
