"""What a front-end process asks the master (MasterFrontend over a real unix-socket gRPC channel): model control
runs in the master and its errors come back with their code and text; a metrics scrape is the master's."""

import asyncio
import threading
from types import SimpleNamespace

import grpc
import pytest

from mindspore_serving.common import errors
from mindspore_serving.frontend_process.process import RemoteMetrics, RemoteModelControl
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.master.frontend_processes import MasterFrontendServicer
from mindspore_serving.proto import frontend_pb2_grpc


class FakeControl:
    def __init__(self):
        self.calls = []

    def load_by_name(self, name, version=0):
        self.calls.append(("load", name, version))
        if name == "missing":
            raise errors.ServableUnavailable(f"failed to load '{name}': not in the servable directory")

    def unload(self, name, version=0):
        self.calls.append(("unload", name, version))
        raise errors.InvalidInputs(f"failed to unload servable {name}: it is not loaded")


class FakeCollector:
    async def render(self):
        return b"# the master's scrape\n"


SECRET = "f" * 64


class Master:
    def __init__(self):
        child = SimpleNamespace(index=1, secret=SECRET)
        self.model_control, self.metrics_collector = FakeControl(), FakeCollector()
        self.frontend_processes = SimpleNamespace(children={1: child})
        self.control_open = True

    def model_control_open(self):
        return self.control_open


@pytest.fixture
def process(tmp_path):
    """A front-end process's side (its loop in a thread, its stub to the master) and the master's servicer."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    master = Master()
    address = f"unix:{tmp_path}/master"

    async def start():
        server = grpc.aio.server()
        frontend_pb2_grpc.add_MasterFrontendServicer_to_server(MasterFrontendServicer(master), server)
        server.add_insecure_port(address)
        await server.start()
        return server, frontend_pb2_grpc.MasterFrontendStub(grpc.aio.insecure_channel(address))

    server, stub = asyncio.run_coroutine_threadsafe(start(), loop).result(10)

    class Process:
        pass

    side = Process()
    side.loop, side.master, side.control, side.master_object = loop, stub, master.model_control, master
    side.credentials = ipc.peer_metadata("frontend/1", SECRET)
    try:
        yield side
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_model_control_runs_in_the_master_and_its_errors_come_back_as_they_were(process):
    control = RemoteModelControl(process)
    control.load_by_name("add", 2)
    with pytest.raises(errors.ServableUnavailable, match="failed to load 'missing': not in the servable directory"):
        control.load_by_name("missing")
    with pytest.raises(errors.InvalidInputs, match="failed to unload servable add: it is not loaded"):
        control.unload("add")
    assert process.control.calls == [("load", "add", 2), ("load", "missing", 0), ("unload", "add", 0)]


def test_a_metrics_scrape_is_the_masters(process):
    text = asyncio.run_coroutine_threadsafe(RemoteMetrics(process).render(), process.loop).result(10)
    assert text == b"# the master's scrape\n"


def test_model_control_is_refused_in_the_master_when_off(process):
    process.master_object.control_open = False
    with pytest.raises(errors.Forbidden, match="model control is off"):  # 403 / PERMISSION_DENIED at the front end
        RemoteModelControl(process).load_by_name("add", 0)


def test_a_caller_without_a_front_end_process_s_secret_is_refused(process):
    for credentials in ((), ipc.peer_metadata("frontend/1", "0" * 64), ipc.peer_metadata("frontend/2", SECRET)):
        process.credentials = credentials
        with pytest.raises(grpc.RpcError) as info:
            asyncio.run_coroutine_threadsafe(RemoteMetrics(process).render(), process.loop).result(10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert not process.control.calls
