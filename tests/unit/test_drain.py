"""frontends/drain.py on its own: counting requests in flight, refusing, and the cut at the end of the grace."""

import asyncio

import pytest

from mindspore_serving.common import errors
from mindspore_serving.frontends.drain import Drain, GuardedBackend, refusal_reply
from mindspore_serving.frontends.errors import Protocol, grpc_error


def run(coro):
    return asyncio.run(coro)


def test_finish_returns_at_once_when_nothing_runs():
    drain = Drain()
    assert run(drain.finish(10.0)) == {}
    assert not drain.accepting


def test_requests_that_finish_in_the_grace_are_not_cut():
    async def scenario():
        drain = Drain()

        async def request():
            drain.enter("a")
            try:
                return await drain.guard(asyncio.sleep(0.05, result="done"))
            finally:
                drain.leave("a")

        task = asyncio.ensure_future(request())
        await asyncio.sleep(0)
        cut = await drain.finish(5.0)
        return cut, await task

    assert run(scenario()) == ({}, "done")


def test_the_cut_ends_guarded_waits_with_server_stopping_and_names_them():
    async def scenario():
        drain = Drain()
        outcomes = []

        async def request(kind):
            drain.enter(kind)
            try:
                await drain.guard(asyncio.sleep(60))
            except errors.ServerStopping as err:
                outcomes.append(err.message)
            finally:
                drain.leave(kind)

        tasks = [asyncio.ensure_future(request(kind)) for kind in ("x", "x", "y")]
        await asyncio.sleep(0)
        cut = await drain.finish(0.05)
        await asyncio.gather(*tasks)
        return cut, outcomes, [t.cancelling() for t in tasks]

    cut, outcomes, cancelling = run(scenario())
    assert cut == {"x": 2, "y": 1}
    assert (
        outcomes
        == ["Serving Error: the server stopped before this request finished (its grace period of 0.05 s ended)"] * 3
    )
    assert cancelling == [0, 0, 0]  # the cut's cancellation is undone: the tasks go on answering


def test_a_client_cancellation_is_not_taken_for_the_cut():
    async def scenario():
        drain = Drain()
        task = asyncio.ensure_future(drain.guard(asyncio.sleep(60)))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())


def test_guarded_backend_stream_is_cut_between_events():
    class Backend:
        closed = False

        def models(self):
            return []

        async def stream(self, request):
            try:
                yield "first"
                await asyncio.sleep(60)
                yield "never"
            finally:
                Backend.closed = True

    async def scenario():
        drain = Drain()
        events = []

        async def consume():
            drain.enter("stream")
            try:
                async for event in GuardedBackend(Backend(), drain).stream(None):
                    events.append(event)
            finally:
                drain.leave("stream")

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.01)
        assert await drain.finish(0.01) == {"stream": 1}
        with pytest.raises(errors.ServerStopping):
            await task
        return events

    assert run(scenario()) == ["first"]
    assert Backend.closed


def test_refusals_are_503_in_each_protocols_shape_and_grpc_unavailable():
    refusal = Drain().refusal()
    assert refusal_reply(Protocol.MINDSPORE, refusal) == (503, {"error_msg": refusal.message})
    status, body = refusal_reply(Protocol.OPENAI, refusal)
    assert status == 503 and body["error"]["code"] == "service_unavailable"
    assert refusal_reply(Protocol.TGI, refusal) == (503, {"error": refusal.message, "error_type": "unavailable"})
    assert grpc_error(refusal)[0].name == "UNAVAILABLE"
    assert grpc_error(errors.WorkerUnavailable("gone"))[0].name == "UNAVAILABLE"  # as every unavailable error
