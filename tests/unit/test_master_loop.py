"""The master's event loop: uvloop when installed, asyncio's on request; grpc.aio works on it."""

import asyncio

import grpc
import pytest

from mindspore_serving.master.master import new_event_loop
from mindspore_serving.proto import internal_pb2, internal_pb2_grpc


def test_uvloop_by_default_and_asyncio_on_request(monkeypatch):
    uvloop = pytest.importorskip("uvloop")
    loop = new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    monkeypatch.setenv("MS_SERVING_EVENT_LOOP", "asyncio")
    loop = new_event_loop()
    try:
        assert not isinstance(loop, uvloop.Loop) and isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()


class _Worker(internal_pb2_grpc.WorkerServiceServicer):
    async def Ping(self, request, context):  # pylint: disable=invalid-name
        return internal_pb2.PingReply()


def test_grpc_aio_server_and_client_on_the_master_loop(tmp_path):
    address = f"unix:{tmp_path}/ping.sock"

    async def scenario():
        server = grpc.aio.server()
        internal_pb2_grpc.add_WorkerServiceServicer_to_server(_Worker(), server)
        server.add_insecure_port(address)
        await server.start()
        async with grpc.aio.insecure_channel(address) as channel:
            stub = internal_pb2_grpc.WorkerServiceStub(channel)
            replies = await asyncio.gather(*[stub.Ping(internal_pb2.Empty()) for _ in range(20)])
        await server.stop(1)
        return replies

    loop = new_event_loop()
    try:
        assert len(loop.run_until_complete(asyncio.wait_for(scenario(), 30))) == 20
    finally:
        loop.close()
