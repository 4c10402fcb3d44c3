"""The master's Predict calls over the worker's unix socket (ipc/predict_socket.py): both real ends in one
process, a thread per connection on the worker's side and an asyncio channel on the master's."""

import asyncio
import os
import shutil
import tempfile
import threading

import pytest

from mindspore_serving.ipc import predict_socket
from mindspore_serving.ipc.master_worker import CONNECTION_ERRORS, WorkerConnectionError
from mindspore_serving.ipc.predict_socket import PredictChannel, PredictSocketServer
from mindspore_serving.proto import internal_pb2


@pytest.fixture(name="address")
def _address():
    folder = tempfile.mkdtemp(prefix="ps", dir="/tmp")  # unix socket paths are short
    yield "unix:" + os.path.join(folder, "worker.predict")
    shutil.rmtree(folder, ignore_errors=True)


def echo(request):
    """The reply names the request and, as an instance error, the size of the first instance's input bytes."""
    reply = internal_pb2.WorkerPredictReply(request_id=request.request_id)
    error = reply.error_msg.add()
    error.error_msg = str(sum(len(t.data) for t in request.request.instances[0].items.values())).encode()
    return reply


def request_of(request_id: str, nbytes: int = 4):
    request = internal_pb2.WorkerPredictRequest(request_id=request_id)
    request.request.instances.add().items["x"].data = b"\1" * nbytes
    return request


def serve_and_run(address, handle, scenario, spin_s=0.0):
    """`await scenario(server, channel)` against a worker's end answering with `handle`; both ends closed after."""
    server = PredictSocketServer(address, handle, spin_s)
    channel = PredictChannel(address)

    async def run():
        try:
            return await scenario(server, channel)
        finally:
            channel.close()

    try:
        return asyncio.run(run())
    finally:
        server.stop(grace=1)


@pytest.mark.parametrize("spin_s", [0.0, 0.001])
def test_calls_get_their_own_replies_small_and_large_one_after_another_and_together(address, spin_s):
    async def scenario(_server, channel):
        first = await channel.call(request_of("a"))
        large = await channel.call(request_of("b", 3 << 20))  # several socket reads
        together = await asyncio.gather(*[channel.call(request_of(f"c{i}", i + 1)) for i in range(4)])
        return first, large, together

    first, large, together = serve_and_run(address, echo, scenario, spin_s)
    assert (first.request_id, first.error_msg[0].error_msg) == ("a", b"4")
    assert (large.request_id, large.error_msg[0].error_msg) == ("b", str(3 << 20).encode())
    assert [(r.request_id, r.error_msg[0].error_msg) for r in together] == [
        (f"c{i}", str(i + 1).encode()) for i in range(4)
    ]


def test_a_call_out_of_time_fails_and_its_late_reply_never_answers_the_next_call(address):
    release = threading.Event()

    def slow_first(request):
        if request.request_id == "slow":
            release.wait(5)
        return echo(request)

    async def scenario(_server, channel):
        with pytest.raises(WorkerConnectionError, match="no reply within 0.05 s"):
            await channel.call(request_of("slow"), timeout=0.05)
        release.set()
        return await channel.call(request_of("next"))

    assert serve_and_run(address, slow_first, scenario).request_id == "next"


def test_a_stopped_or_missing_worker_is_a_connection_error(address):
    entered, release = threading.Event(), threading.Event()

    def hold(request):
        entered.set()
        release.wait(5)
        return echo(request)

    async def scenario(server, channel):
        await channel.call(request_of("a"))  # an idle connection stays
        server.handle = hold
        call = asyncio.ensure_future(channel.call(request_of("in flight")))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 5)
        stopper = threading.Thread(target=server.stop, args=(5,))
        stopper.start()  # the call being answered still gets its reply
        release.set()
        answered = await call
        stopper.join()
        with pytest.raises(CONNECTION_ERRORS):  # gone: the idle connection was closed, new ones are refused
            await channel.call(request_of("b"))
        with pytest.raises(WorkerConnectionError, match="cannot connect"):
            await PredictChannel(address + ".missing").call(request_of("c"))
        return answered

    assert serve_and_run(address, echo, scenario).request_id == "in flight"
    assert not os.path.exists(address[len("unix:") :])  # the stopped worker removed its socket file


def test_a_socket_file_left_by_a_killed_worker_is_replaced(address):
    with open(address[len("unix:") :], "w", encoding="utf-8"):
        pass

    async def scenario(_server, channel):
        return await channel.call(request_of("a"))

    assert serve_and_run(address, echo, scenario).request_id == "a"


def test_a_frame_that_is_not_a_request_closes_the_connection(address):
    server = PredictSocketServer(address, echo)

    async def scenario():
        reader, writer = await asyncio.open_unix_connection(address[len("unix:") :])
        writer.write(b"\3\0\0\0\xff\xff\xff")
        await writer.drain()
        return await reader.read()

    try:
        assert asyncio.run(scenario()) == b""
    finally:
        server.stop(grace=1)


def test_an_idle_connection_polls_before_it_blocks_but_not_while_another_call_is_answered(address, monkeypatch):
    spins = []
    spin = predict_socket.spin_until_readable

    def recording(poller, seconds):
        spins.append((threading.current_thread().ident, seconds))
        return spin(poller, seconds)

    monkeypatch.setattr(predict_socket, "spin_until_readable", recording)
    entered, release = threading.Event(), threading.Event()

    def handle(request):
        if request.request_id == "held":
            entered.set()
            release.wait(5)
        return echo(request)

    async def scenario(_server, channel):
        await channel.call(request_of("a"))
        await channel.call(request_of("b"))
        first_connection = set(spins)
        held = asyncio.ensure_future(channel.call(request_of("held")))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 5)
        other = await channel.call(request_of("c"))  # on a second connection, while "held" is answered
        while_held = list(spins)  # after release, an idle second connection may poll again: that is allowed
        release.set()
        return first_connection, while_held, (await held).request_id, other.request_id

    first_connection, while_held, held, other = serve_and_run(address, handle, scenario, spin_s=0.05)
    assert (held, other) == ("held", "c")
    ((thread, seconds),) = first_connection
    assert seconds == 0.05 and len(while_held) >= 3  # before "a", "b" and "held" at least
    assert {ident for ident, _ in while_held} == {thread}  # the second connection never spun: a call was being answered


def test_polling_ends_when_data_arrives_or_the_time_is_up():
    import select
    import socket

    left, right = socket.socketpair()
    with left, right:
        poller = select.poll()
        poller.register(left, select.POLLIN)
        assert predict_socket.spin_until_readable(poller, 0.001) is False
        right.sendall(b"x")
        assert predict_socket.spin_until_readable(poller, 60.0) is True


def test_the_worker_reads_its_polling_time_from_the_environment(monkeypatch):
    from mindspore_serving.worker.process import SPIN_VARIABLE, predict_spin_seconds

    monkeypatch.delenv(SPIN_VARIABLE, raising=False)
    assert predict_spin_seconds() == predict_socket.DEFAULT_SPIN_S == 0.0005
    for text, seconds in (("0", 0.0), ("250", 0.00025), ("-3", 0.0)):
        monkeypatch.setenv(SPIN_VARIABLE, text)
        assert predict_spin_seconds() == seconds
    monkeypatch.setenv(SPIN_VARIABLE, "fast")
    with pytest.raises(
        ValueError, match="MS_SERVING_WORKER_SPIN_US should be a number of microseconds, but got 'fast'"
    ):
        predict_spin_seconds()


def test_begin_writes_the_request_at_once_on_an_idle_connection(address):
    received = threading.Event()

    def handle(request):
        received.set()
        return echo(request)

    async def scenario(_server, channel):
        await channel.call(request_of("first"))  # leaves an idle connection
        received.clear()
        pending = channel.begin(request_of("second"))
        assert received.wait(5)  # the worker has it while this event loop has not run since
        return (await pending).request_id

    assert serve_and_run(address, handle, scenario) == "second"
