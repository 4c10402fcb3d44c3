"""The master's Dispatcher with fake worker stubs and a clock the tests move: checks, chunking, routing, ordering
and limits; nothing waits for time to pass."""

import asyncio

import grpc
import numpy as np
import pytest

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import instance_to_proto, tensor_to_value, value_to_tensor
from mindspore_serving.frontends.replies import predict_reply
from mindspore_serving.master.dispatcher import SETTLE_SECONDS, Dispatcher
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
from mindspore_serving.proto import internal_pb2
from mindspore_serving.proto import ms_service_pb2 as pb


class FakeWorkerStub:
    """An async WorkerService stub: y = x * 10 per instance, an error for negative x.

    With `hold=True` every call waits until the test releases it (`release(i)`), so the test sees what is in flight
    and decides the order in which chunks finish."""

    def __init__(self, name, calls, hold=False, raise_error=None):
        self.name = name
        self.calls = calls
        self.hold = hold
        self.raise_error = raise_error

    async def Predict(self, request, timeout=None):  # pylint: disable=invalid-name
        xs = [int(tensor_to_value(instance.items["x"])[0]) for instance in request.request.instances]
        released = asyncio.Event()
        call = {
            "worker": self.name,
            "xs": xs,
            "spec": request.request.servable_spec,
            "request_id": request.request_id,
            "sizes": list(request.request_sizes),
            "ids": list(request.client_request_ids),
            "release": released,
            "returned": False,
            "timeout": timeout,
        }
        self.calls.append(call)
        try:
            if self.hold:
                await released.wait()
            if self.raise_error is not None:
                raise self.raise_error
        finally:
            call["returned"] = True
        return reply_of(request)


def reply_of(request) -> "internal_pb2.WorkerPredictReply":
    """The fake worker's answer: y = x * 10 per instance, an error for negative x."""
    reply = internal_pb2.WorkerPredictReply(request_id=request.request_id)
    for item in request.request.instances:
        x = int(tensor_to_value(item.items["x"])[0])
        instance = reply.instances.add()
        error = reply.error_msg.add()
        if x < 0:
            error.error_code = errors.INVALID_INPUTS
            error.error_msg = f"negative input {x}".encode()
        else:
            value_to_tensor(np.array([x * 10], np.int32), instance.items["y"])
    return reply


def add_worker(
    registry, name, pid, calls, batch_size=2, version=1, input_names=("x",), python_stages=False, **stub_options
):
    method = internal_pb2.MethodSignature(
        name="m", input_names=list(input_names), output_names=["y"], only_model_stage=not python_stages
    )
    record = WorkerRecord(
        key=name,
        pid=pid,
        address=f"unix:{name}",
        servable_name="add",
        version_number=version,
        batch_size=batch_size,
        methods={"m": method},
        stub=FakeWorkerStub(name, calls, **stub_options),
    )
    registry.add(record)
    return record


def spec_of(version=0, name="add", method="m"):
    return pb.ServableSpec(name=name, method_name=method, version_number=version)


def instances_of(*xs):
    return [instance_to_proto({"x": np.array([x], np.int32)}) for x in xs]


def y_of(instance):
    return int(tensor_to_value(instance.items["y"])[0])


class FakeClock:
    """The dispatcher's clock, moved only by `advance`: its timers fire there, so no test waits for time to pass."""

    class Timer:
        def __init__(self, when, callback):
            self.when, self.callback, self.cancelled = when, callback, False

        def cancel(self):
            self.cancelled = True

    def __init__(self):
        self.time = 0.0
        self.timers = []

    def now(self):
        return self.time

    def call_later(self, delay, callback):
        timer = FakeClock.Timer(self.time + delay, callback)
        self.timers.append(timer)
        return timer

    def pending(self):
        return [timer for timer in self.timers if not timer.cancelled]

    def advance(self, seconds):
        self.time += seconds
        due = sorted((timer for timer in self.pending() if timer.when <= self.time), key=lambda timer: timer.when)
        self.timers = [timer for timer in self.pending() if timer not in due]
        for timer in due:
            timer.callback()


def dispatcher_of(registry, clock=None):
    dispatcher = Dispatcher(registry, clock=clock or FakeClock())
    dispatcher.request_timeout = 0  # no deadline timers among the clock's unless a test sets a deadline
    return dispatcher


async def until(condition, turns=1000):
    """Lets the event loop run until `condition()` holds, for at most `turns` turns (no time passes)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)  # ok-sleep: sleep(0) yields one event-loop turn; the bound is in turns, not time
    raise AssertionError("condition not reached")


def settled(dispatcher, tasks, calls):
    """Nothing more happens until the test acts: every request reached its worker's queue, no flush is due on a
    coming loop turn (one may wait on the clock), and every call sent reached its stub and waits there."""
    queues = [queue for worker in dispatcher.registry.all() for queue in worker.queues.values()]
    return (
        dispatcher.enqueued == sum(1 for task in tasks if not task.done())
        and not any(queue.scheduled and queue.timer is None for queue in queues)
        and sum(len(queue.tasks) for queue in queues) == sum(1 for call in calls if not call["returned"])
    )


# ---------------------------------------------------------------- chunking and routing


def test_chunks_of_the_batch_size_spread_over_two_workers_and_come_back_in_order():
    registry = WorkerRegistry()
    calls = []
    first = add_worker(registry, "w1", 11, calls, hold=True)
    second = add_worker(registry, "w2", 12, calls, hold=True)
    dispatcher = dispatcher_of(registry)

    async def scenario():
        task = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(0, 1, 2, 3, 4)))
        await until(lambda: len(calls) == 2)
        in_flight = (first.outstanding, second.outstanding)
        for call in reversed(calls):  # the last call finishes first
            call["release"].set()
            await until(lambda call=call: call["returned"])
        return in_flight, await task

    in_flight, results = asyncio.run(scenario())
    # chunks [0, 1], [2, 3], [4]: the second goes to the idle worker, the third joins a worker's queued chunk
    assert sorted(call["xs"] for call in calls) in ([[0, 1, 4], [2, 3]], [[0, 1], [2, 3, 4]])
    assert calls[0]["worker"] != calls[1]["worker"]
    assert sorted(call["sizes"] for call in calls) == [[2], [2, 1]]
    assert sorted(in_flight) == [2, 3]
    assert [y_of(result) for result in results] == [0, 10, 20, 30, 40]
    assert (first.outstanding, second.outstanding) == (0, 0)
    assert first.served + second.served == 3  # chunks answered
    assert all(call["spec"].version_number == 1 for call in calls)  # version 0 resolved to the worker's
    assert len({call["request_id"] for call in calls}) == 2


def test_chunk_size_is_the_largest_batch_size_of_the_candidates():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w1", 11, calls, batch_size=1)
    add_worker(registry, "w2", 12, calls, batch_size=3)
    results = asyncio.run(dispatcher_of(registry).predict(spec_of(), instances_of(*range(7))))
    assert sorted(size for call in calls for size in call["sizes"]) == [1, 3, 3]  # chunks of 3
    assert sorted(x for call in calls for x in call["xs"]) == list(range(7))
    assert [y_of(result) for result in results] == [x * 10 for x in range(7)]


def test_single_worker_gets_every_chunk_in_one_call():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "only", 5, calls, batch_size=4)
    results = asyncio.run(dispatcher_of(registry).predict(spec_of(), instances_of(*range(9))))
    assert [call["xs"] for call in calls] == [list(range(9))]
    assert [call["sizes"] for call in calls] == [[4, 4, 1]]
    assert {call["worker"] for call in calls} == {"only"}
    assert [y_of(result) for result in results] == [x * 10 for x in range(9)]


# ---------------------------------------------------------------- calls carrying several requests


def test_concurrent_requests_travel_in_one_call_and_get_their_own_answers():
    registry = WorkerRegistry()
    calls = []
    worker = add_worker(registry, "w", 1, calls, batch_size=1)
    dispatcher = dispatcher_of(registry)

    async def scenario():
        return await asyncio.gather(
            *[dispatcher.predict(spec_of(), instances_of(*xs)) for xs in ([1], [2, -3], [4], [-5])]
        )

    answers = asyncio.run(scenario())
    assert [call["xs"] for call in calls] == [[1, 2, -3, 4, -5]]
    assert [call["sizes"] for call in calls] == [[1, 1, 1, 1, 1]]  # chunks of the batch size 1
    assert y_of(answers[0][0]) == 10
    assert y_of(answers[1][0]) == 20 and answers[1][1].message == "negative input -3"
    assert y_of(answers[2][0]) == 40
    assert isinstance(answers[3][0], errors.InvalidInputs) and answers[3][0].message == "negative input -5"
    assert worker.outstanding == 0 and worker.served == 5


async def predict_as(dispatcher, request_id, xs):
    """A request whose front end bound `request_id` to its task (None: none bound), as request_ids.py does."""
    if request_id is not None:
        log.bind_request_id(request_id)  # this task's own context: ends with it
    return await dispatcher.predict(spec_of(), instances_of(*xs))


def test_each_request_of_a_call_carries_the_id_its_front_end_bound():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, batch_size=1)
    dispatcher = dispatcher_of(registry)

    async def scenario():
        return await asyncio.gather(
            predict_as(dispatcher, "req-a", [1]),
            predict_as(dispatcher, "req-b", [2, 3]),
            predict_as(dispatcher, None, [4]),
        )

    answers = asyncio.run(scenario())
    assert [[y_of(answer) for answer in request] for request in answers] == [[10], [20, 30], [40]]
    assert [(call["sizes"], call["ids"]) for call in calls] == [([1, 1, 1, 1], ["req-a", "req-b", "req-b", ""])]
    assert calls[0]["request_id"] == "1-1"  # the call's own id stays the dispatcher's


def test_calls_in_flight_per_worker_are_limited_and_the_rest_waits_for_one_of_them(monkeypatch):
    from mindspore_serving.master import dispatcher as dispatcher_module

    assert dispatcher_module.MAX_CALLS_IN_FLIGHT == 2
    monkeypatch.setattr(dispatcher_module, "MAX_CALL_INSTANCES", 2)
    registry = WorkerRegistry()
    calls = []
    worker = add_worker(registry, "w", 1, calls, batch_size=1, hold=True)
    dispatcher = dispatcher_of(registry)

    async def scenario():
        tasks = []

        async def submit(*xs):
            for x in xs:
                tasks.append(asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))))
            await until(lambda: settled(dispatcher, tasks, calls))

        await submit(0)  # idle worker: a call at once
        await submit(1)  # busy: one instance is not a full call
        in_flight_1 = len(calls)
        await submit(2)  # a full call (2 instances) goes while the first is in flight
        await submit(3, 4, 5)  # two calls in flight: everything waits
        waiting = (len(calls), worker.outstanding)
        calls[0]["release"].set()
        await until(lambda: len(calls) == 3)  # one call returned: the next full call goes, [5] waits
        for_last = len(calls)
        for call in calls:
            call["release"].set()
        await until(lambda: len(calls) == 4)  # idle again: the rest goes
        calls[3]["release"].set()
        return in_flight_1, waiting, for_last, await asyncio.gather(*tasks)

    in_flight_1, waiting, for_last, answers = asyncio.run(scenario())
    assert in_flight_1 == 1
    assert waiting == (2, 6)
    assert for_last == 3
    assert [call["xs"] for call in calls] == [[0], [1, 2], [3, 4], [5]]
    assert [y_of(answer[0]) for answer in answers] == [x * 10 for x in range(6)]
    assert worker.outstanding == 0


def test_a_busy_worker_gets_only_full_calls_and_an_idle_one_what_is_there(monkeypatch):
    from mindspore_serving.master import dispatcher as dispatcher_module

    monkeypatch.setattr(dispatcher_module, "MAX_CALL_INSTANCES", 4)
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, batch_size=1, hold=True)
    dispatcher = dispatcher_of(registry)

    async def scenario():
        tasks = [asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(0)))]
        await until(lambda: len(calls) == 1)  # idle worker: the lone instance goes
        tasks += [asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))) for x in (1, 2, 3)]
        await until(lambda: settled(dispatcher, tasks, calls))
        partial = len(calls)  # three instances wait: not a full call while the worker is busy
        tasks += [asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))) for x in (4, 5)]
        await until(lambda: len(calls) == 2)
        for call in calls:
            call["release"].set()
        await until(lambda: len(calls) == 3)  # the remainder goes when the worker is idle again
        calls[2]["release"].set()
        return partial, await asyncio.gather(*tasks)

    partial, answers = asyncio.run(scenario())
    assert partial == 1
    assert [call["xs"] for call in calls] == [[0], [1, 2, 3, 4], [5]]
    assert [y_of(answer[0]) for answer in answers] == [0, 10, 20, 30, 40, 50]


def test_a_worker_that_batches_continuously_gets_each_request_at_once_in_a_call_of_its_own():
    """An LLM worker batches requests itself, step by step: a short request sent while a long one runs must not
    wait for it (head-of-line blocking), neither in the queue nor in the same call."""
    from mindspore_serving.spec.llm import LLM_EXTENSION

    registry = WorkerRegistry()
    calls = []
    record = add_worker(registry, "llm", 1, calls, batch_size=16, hold=True)
    record.extensions[LLM_EXTENSION] = "{}"
    dispatcher = dispatcher_of(registry)

    async def scenario():
        long = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(1)))
        await until(lambda: len(calls) == 1)
        shorts = [asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))) for x in (2, 3, 4)]
        await until(lambda: len(calls) == 4)  # each goes while the long call is still in flight
        for call in calls[1:]:
            call["release"].set()
        answers = await asyncio.gather(*shorts)
        assert not long.done()
        calls[0]["release"].set()
        return answers, await long

    answers, long_answer = asyncio.run(scenario())
    assert [call["xs"] for call in calls] == [[1], [2], [3], [4]]
    assert [y_of(answer[0]) for answer in answers] == [20, 30, 40] and y_of(long_answer[0]) == 10


def test_a_request_past_its_deadline_fails_and_its_worker_call_carries_the_deadline():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, batch_size=1, hold=True)
    clock = FakeClock()
    dispatcher = dispatcher_of(registry, clock)
    dispatcher.request_timeout = 0.05  # the default of requests without a deadline of their own

    async def scenario():
        held = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(1)))
        await until(lambda: settled(dispatcher, [held], calls) and calls)
        queued = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(2), timeout=0.02))  # a gRPC
        await until(lambda: settled(dispatcher, [held, queued], calls))  # client's own, queued behind the held call
        clock.advance(0.02)
        with pytest.raises(errors.Failed, match="deadline of 0.02 s exceeded"):
            await queued
        assert not held.done()
        clock.advance(0.03)
        with pytest.raises(errors.Failed, match=r"servable\(add\) method\(m\) , deadline of 0.05 s exceeded"):
            await held
        calls[0]["release"].set()
        await until(lambda: calls[0]["returned"])
        await until(lambda: not any(queue.tasks for queue in registry.all()[0].queues.values()))

    asyncio.run(scenario())
    assert [call["timeout"] for call in calls] == [pytest.approx(0.05)]  # the expired request never left
    assert dispatcher.enqueued == 0


def test_a_request_cut_into_chunks_fails_whole_at_its_deadline_and_a_cancelled_one_stays_cancelled():
    registry = WorkerRegistry()
    calls = []
    worker = add_worker(registry, "w", 1, calls, batch_size=1, hold=True)
    clock = FakeClock()
    dispatcher = dispatcher_of(registry, clock)

    async def scenario():
        held = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(9)))  # the worker is busy with it
        await until(lambda: settled(dispatcher, [held], calls) and calls)
        cut = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(1, 2, 3), timeout=0.5))
        await until(lambda: settled(dispatcher, [held, cut], calls))
        clock.advance(0.5)
        with pytest.raises(errors.Failed, match="deadline of 0.5 s exceeded"):
            await cut
        cancelled = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(4), timeout=0.5))
        await until(lambda: settled(dispatcher, [held, cancelled], calls))
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert not clock.pending()  # its deadline timer went with it
        calls[0]["release"].set()
        await until(lambda: calls[0]["returned"] and not worker.queues["m"].tasks)
        return await held

    assert y_of(asyncio.run(scenario())[0]) == 90
    assert [call["xs"] for call in calls] == [[9]]  # the chunks still queued never left
    assert dispatcher.enqueued == 0 and worker.outstanding == 0


def test_a_partial_batch_for_an_idle_worker_waits_while_chunks_keep_arriving():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, batch_size=8)
    dispatcher = dispatcher_of(registry)

    async def scenario():
        tasks = []
        for x in range(5):  # one new request per loop turn: a burst being read
            tasks.append(asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))))
            await until(lambda tasks=tasks: dispatcher.enqueued == len(tasks))
        return await asyncio.gather(*tasks)

    answers = asyncio.run(scenario())
    assert [call["xs"] for call in calls] == [[0, 1, 2, 3, 4]]
    assert [y_of(answer[0]) for answer in answers] == [0, 10, 20, 30, 40]


def test_a_partial_batch_waits_for_the_clients_of_the_last_call_to_come_back():
    registry = WorkerRegistry()
    calls = []
    worker = add_worker(registry, "w", 1, calls, batch_size=8)
    clock = FakeClock()
    dispatcher = dispatcher_of(registry, clock)

    async def scenario():
        rounds = [await asyncio.gather(*[dispatcher.predict(spec_of(), instances_of(x)) for x in (1, 2, 3)])]
        for _ in range(2):
            tasks = []
            for x in (1, 2, 3):  # the clients come back one after the other
                tasks.append(asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))))
                await until(lambda tasks=tasks: dispatcher.enqueued == len(tasks))
                if x < 3:  # the early ones wait on the settle timer, nothing is sent
                    await until(lambda: worker.queues["m"].timer is not None)
                    assert len(calls) == len(rounds) and clock.pending()
                    clock.advance(SETTLE_SECONDS / 10)
            rounds.append(await asyncio.gather(*tasks))
        return [[y_of(answer[0]) for answer in answers] for answers in rounds]

    assert asyncio.run(scenario()) == [[10, 20, 30]] * 3
    assert [sorted(call["xs"]) for call in calls] == [[1, 2, 3]] * 3  # never a batch of the early ones alone
    assert not clock.pending()  # the last client's return ended the wait


def test_a_partial_batch_waits_at_most_the_settle_time_for_clients_that_do_not_come_back():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, batch_size=8)
    clock = FakeClock()
    dispatcher = dispatcher_of(registry, clock)

    async def scenario():
        await dispatcher.predict(spec_of(), instances_of(1, 2, 3))  # a call of 3 returns
        task = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(4)))  # only one request follows
        await until(lambda: settled(dispatcher, [task], calls) and clock.pending())
        (timer,) = clock.pending()
        clock.advance(SETTLE_SECONDS / 2)
        await until(lambda: settled(dispatcher, [task], calls))
        sent_before = len(calls)
        clock.advance(SETTLE_SECONDS / 2)
        await until(task.done)
        return timer.when, sent_before, task.result()

    deadline, sent_before, answer = asyncio.run(scenario())
    assert deadline == SETTLE_SECONDS and sent_before == 1
    assert y_of(answer[0]) == 40 and [call["xs"] for call in calls] == [[1, 2, 3], [4]]


def test_a_lone_request_to_a_batched_worker_does_not_wait_for_the_settle_time():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, batch_size=8)
    clock = FakeClock()
    dispatcher = dispatcher_of(registry, clock)

    async def scenario():
        task = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(3)))
        await until(task.done)  # the clock never moves: a wait on it would never end
        return task.result()

    answers = asyncio.run(scenario())
    assert y_of(answers[0]) == 30 and len(calls) == 1
    assert not clock.timers


def test_a_cancelled_request_leaves_the_queue(monkeypatch):
    from mindspore_serving.master import dispatcher as dispatcher_module

    monkeypatch.setattr(dispatcher_module, "MAX_CALL_INSTANCES", 1)  # every chunk is a full call
    registry = WorkerRegistry()
    calls = []
    worker = add_worker(registry, "w", 1, calls, batch_size=1, hold=True)
    dispatcher = dispatcher_of(registry)

    async def scenario():
        held = []
        for x in range(dispatcher_module.MAX_CALLS_IN_FLIGHT):
            held.append(asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))))
            await until(lambda n=x + 1: len(calls) == n)
        queued = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(100)))
        kept = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(101)))
        await until(lambda: settled(dispatcher, held + [queued, kept], calls))
        queued.cancel()
        await until(queued.done)
        held[0].cancel()  # its call goes on; the answer is dropped
        for call in calls:
            call["release"].set()
        await until(lambda: len(calls) == dispatcher_module.MAX_CALLS_IN_FLIGHT + 1)
        calls[-1]["release"].set()
        return await kept, await asyncio.gather(*held[1:]), dispatcher.enqueued

    kept, others, enqueued = asyncio.run(scenario())
    assert calls[-1]["xs"] == [101]
    assert y_of(kept[0]) == 1010
    assert [y_of(answer[0]) for answer in others] == [10 * x for x in range(1, dispatcher_module.MAX_CALLS_IN_FLIGHT)]
    assert worker.outstanding == 0 and enqueued == 0


def test_a_request_whose_client_goes_away_counts_as_cancelled_and_one_cut_by_the_stop_as_a_server_error():
    from mindspore_serving.frontends.drain import Drain, GuardedDispatcher

    registry = WorkerRegistry()
    calls = []
    worker = add_worker(registry, "w", 1, calls, batch_size=1, hold=True)
    dispatcher = dispatcher_of(registry)
    drain = Drain()
    guarded = GuardedDispatcher(dispatcher, drain)

    async def scenario():
        # one instance (its call's own future) and three (chunks joined by a gather): both ways a request waits
        left = [asyncio.ensure_future(guarded.predict(spec_of(), instances_of(*xs))) for xs in ((1,), (2, 3, 4))]
        await until(lambda: settled(dispatcher, left, calls))
        for task in left:
            task.cancel()
        for task in left:
            with pytest.raises(asyncio.CancelledError):
                await task
        stopped = [asyncio.ensure_future(guarded.predict(spec_of(), instances_of(*xs))) for xs in ((5,), (6, 7))]
        await until(lambda: settled(dispatcher, stopped, calls))
        drain.cut("stopping")
        for task in stopped:
            with pytest.raises(errors.ServerStopping, match="stopping"):
                await task
        for call in calls:
            call["release"].set()
        await until(lambda: not worker.outstanding)

    asyncio.run(scenario())
    assert dispatcher.metrics.method("add", 1, "m").outcomes == {
        "success": 0,
        "client_error": 0,
        "server_error": 2,
        "cancelled": 2,
    }
    assert dispatcher.enqueued == 0


# ---------------------------------------------------------------- checks before sending


def tensor(dtype, dims, data=b"", bytes_val=()):
    return pb.Tensor(dtype=dtype, shape=pb.TensorShape(dims=list(dims)), data=data, bytes_val=list(bytes_val))


def instance(**items):
    result = pb.Instance()
    for name, value in items.items():
        result.items[name].CopyFrom(value)
    return result


def test_invalid_instances_are_answered_without_reaching_a_worker():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, batch_size=2)
    bad = instance(x=tensor(pb.MS_INT32, [2], data=b"\0" * 4))
    good = instances_of(1, 2, 3)
    results = asyncio.run(dispatcher_of(registry).predict(spec_of(), [good[0], bad, instance(), good[1], good[2]]))
    assert [(call["xs"], call["sizes"]) for call in calls] == [([1, 2, 3], [2, 1])]  # the valid ones, no gaps
    assert y_of(results[0]) == 10 and y_of(results[3]) == 20 and y_of(results[4]) == 30
    assert isinstance(results[1], errors.InvalidInputs)
    assert results[1].message == (
        "Instances input x check failed, detail: Tensor check failed: input data size 4 invalid"
    )
    assert results[2].message == "Cannot find input x in instance input , servable add, method m"


def test_zero_instances():
    registry = WorkerRegistry()
    add_worker(registry, "w", 1, [])
    with pytest.raises(errors.InvalidInputs) as info:
        asyncio.run(dispatcher_of(registry).predict(spec_of(), []))
    assert str(info.value) == "Instances count of request cannot be 0"


# ---------------------------------------------------------------- limits


def test_enqueued_requests_limit():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, hold=True)
    dispatcher = dispatcher_of(registry)
    dispatcher.max_enqueued_requests = 2

    async def scenario():
        held = [asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))) for x in (1, 2)]
        await until(lambda: sum(len(call["xs"]) for call in calls) == 2)
        with pytest.raises(errors.ServingError) as info:
            await dispatcher.predict(spec_of(), instances_of(3))
        enqueued = dispatcher.enqueued
        for call in calls:
            call["release"].set()
        answers = await asyncio.gather(*held)
        return info.value, enqueued, answers

    error, enqueued, answers = asyncio.run(scenario())
    assert error.code == errors.FAILED
    assert str(error) == "Serving Error: enqueued requests count exceeds the limit 2"
    assert enqueued == 2
    assert [y_of(answer[0]) for answer in answers] == [10, 20]
    assert dispatcher.enqueued == 0
    assert sum(len(call["xs"]) for call in calls) == 2  # the refused request never reached the worker


def test_enqueued_bytes_limit_refuses_as_overloaded_but_a_request_alone_always_goes():
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, hold=True)
    dispatcher = dispatcher_of(registry)
    one = sum(instance.ByteSize() for instance in instances_of(1))
    dispatcher.max_enqueued_bytes = one  # a second request would pass it

    async def scenario():
        held = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(1, 2)))  # alone: over, but goes
        await until(lambda: calls)
        with pytest.raises(errors.Overloaded) as info:
            await dispatcher.predict(spec_of(), instances_of(3))
        calls[0]["release"].set()
        return info.value, await held

    error, answers = asyncio.run(scenario())
    assert str(error) == f"Serving Error: enqueued requests size exceeds the limit {one} bytes (--max_enqueued_mb)"
    assert [y_of(answer) for answer in answers] == [10, 20]
    assert dispatcher.enqueued_bytes == 0


def test_enqueued_count_is_released_after_errors():
    registry = WorkerRegistry()
    dispatcher = dispatcher_of(registry)
    dispatcher.max_enqueued_requests = 1
    for _ in range(3):
        with pytest.raises(errors.ServableUnavailable):
            asyncio.run(dispatcher.predict(spec_of(), instances_of(1)))
    assert dispatcher.enqueued == 0


# ---------------------------------------------------------------- lost workers


def unavailable():
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="Socket closed"
    )


def test_a_lost_worker_fails_its_chunk_with_worker_unavailable():
    registry = WorkerRegistry()
    calls = []
    dead = add_worker(registry, "dead", 77, calls, raise_error=unavailable(), hold=True)
    alive = add_worker(registry, "alive", 78, calls, hold=True)

    async def scenario():
        task = asyncio.ensure_future(dispatcher_of(registry).predict(spec_of(), instances_of(0, 1, 2, 3)))
        await until(lambda: len(calls) == 2)
        for call in calls:
            call["release"].set()
        return await task

    results = asyncio.run(scenario())
    by_worker = {call["worker"]: call["xs"] for call in calls}
    assert sorted(by_worker) == ["alive", "dead"]
    text = "Request servable(add) method(m) , servable is not available: the worker (pid 77) stopped while handling it"
    for x in by_worker["dead"]:
        assert isinstance(results[x], errors.WorkerUnavailable)
        assert results[x].code == errors.WORKER_UNAVAILABLE and results[x].message == text
    for x in by_worker["alive"]:
        assert y_of(results[x]) == x * 10
    assert (dead.outstanding, alive.outstanding) == (0, 0)
    assert (dead.served, alive.served) == (0, 1)

    reply = predict_reply(spec_of(), results)
    assert len(reply.instances) == len(reply.error_msg) == 4
    for x in range(4):
        expected = errors.WORKER_UNAVAILABLE if x in by_worker["dead"] else errors.OK
        assert reply.error_msg[x].error_code == expected


def test_every_chunk_lost_gives_one_global_error():
    registry = WorkerRegistry()
    add_worker(registry, "dead", 5, [], batch_size=2, raise_error=unavailable())
    results = asyncio.run(dispatcher_of(registry).predict(spec_of(version=1), instances_of(0, 1, 2)))
    text = (
        "Request servable(add) method(m)  version(1) , servable is not available: the worker (pid 5) stopped "
        "while handling it"
    )
    assert [(result.code, result.message) for result in results] == [(errors.WORKER_UNAVAILABLE, text)] * 3
    reply = predict_reply(spec_of(version=1), results)
    assert len(reply.instances) == 0
    assert [(e.error_code, e.error_msg.decode()) for e in reply.error_msg] == [(errors.WORKER_UNAVAILABLE, text)]


def test_a_lost_worker_fails_each_request_of_a_shared_call_with_its_own_text():
    registry = WorkerRegistry()
    add_worker(registry, "dead", 9, [], batch_size=1, raise_error=unavailable())
    dispatcher = dispatcher_of(registry)

    async def scenario():
        return await asyncio.gather(
            dispatcher.predict(spec_of(version=0), instances_of(1)),
            dispatcher.predict(spec_of(version=1), instances_of(2, 3)),
        )

    newest, first = asyncio.run(scenario())
    tail = "servable is not available: the worker (pid 9) stopped while handling it"
    assert [r.message for r in newest] == [f"Request servable(add) method(m) , {tail}"]
    assert [r.message for r in first] == [f"Request servable(add) method(m)  version(1) , {tail}"] * 2
    assert all(isinstance(r, errors.WorkerUnavailable) for r in newest + first)


def test_a_lost_call_is_logged_with_the_ids_of_all_its_requests(monkeypatch):
    lines = []
    monkeypatch.setattr(log, "warning", lambda message: lines.append((message, log.current_request_id())))
    registry = WorkerRegistry()
    add_worker(registry, "dead", 9, [], batch_size=1, raise_error=unavailable())
    dispatcher = dispatcher_of(registry)

    async def scenario():
        return await asyncio.gather(predict_as(dispatcher, "req-a", [1]), predict_as(dispatcher, "req-b", [2]))

    asyncio.run(scenario())
    # not bound to the first request's id (the call's task copies its context): the line names both
    assert lines == [("call 9-1 to worker pid 9 failed (requests req-a, req-b): UNAVAILABLE Socket closed", None)]


def test_a_closed_channel_counts_as_a_lost_worker():
    registry = WorkerRegistry()
    record = add_worker(registry, "closed", 10, [], raise_error=grpc.aio.UsageError("Channel is closed."))
    results = asyncio.run(dispatcher_of(registry).predict(spec_of(), instances_of(1)))
    assert [(r.code, r.message) for r in results] == [
        (
            errors.WORKER_UNAVAILABLE,
            "Request servable(add) method(m) , servable is not available: the worker (pid 10) "
            "stopped while handling it",
        )
    ]
    assert record.outstanding == 0


def test_other_failures_of_a_call_reach_every_request_in_it():
    registry = WorkerRegistry()
    add_worker(registry, "odd", 11, [], raise_error=ValueError("odd failure"))
    dispatcher = dispatcher_of(registry)

    async def scenario():
        return await asyncio.gather(
            dispatcher.predict(spec_of(), instances_of(1)),
            dispatcher.predict(spec_of(), instances_of(2)),
            return_exceptions=True,
        )

    assert [str(result) for result in asyncio.run(scenario())] == ["odd failure", "odd failure"]
    assert dispatcher.enqueued == 0


def test_a_call_carries_at_most_max_call_bytes_but_a_large_chunk_still_goes(monkeypatch):
    from mindspore_serving.master import dispatcher as dispatcher_module

    size = instances_of(1)[0].ByteSize()
    monkeypatch.setattr(dispatcher_module, "MAX_CALL_BYTES", 2 * size)
    registry = WorkerRegistry()
    calls = []
    add_worker(registry, "w", 1, calls, batch_size=4)
    clock = FakeClock()
    dispatcher = dispatcher_of(registry, clock)

    async def scenario():
        tasks = [
            asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(*xs))) for xs in ([1], [2], [3], [4, 5, 6])
        ]
        # [4, 5, 6] is a partial batch once [3] is answered: it waits for that client, who does not come back
        await until(lambda: settled(dispatcher, tasks, calls) and clock.pending())
        clock.advance(SETTLE_SECONDS)
        return await asyncio.gather(*tasks)

    answers = asyncio.run(scenario())
    assert [call["xs"] for call in calls] == [[1, 2], [3], [4, 5, 6]]
    assert [[y_of(a) for a in answer] for answer in answers] == [[10], [20], [30], [40, 50, 60]]


def test_a_worker_with_python_stages_keeps_two_calls_in_flight():
    """Its Python stages run one call at a time: an idle worker gets what is queued as two calls, a busy one a
    second call with whatever is queued, and a third waits for one of them."""
    registry = WorkerRegistry()
    calls = []
    worker = add_worker(registry, "w", 1, calls, batch_size=1, hold=True, python_stages=True)
    dispatcher = dispatcher_of(registry)

    async def scenario():
        tasks = [asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))) for x in range(5)]
        await until(lambda: settled(dispatcher, tasks, calls))
        idle_split = [call["xs"] for call in calls]
        tasks += [asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))) for x in (5, 6)]
        await until(lambda: settled(dispatcher, tasks, calls))
        waiting = (len(calls), worker.outstanding)
        calls[0]["release"].set()
        await until(lambda: len(calls) == 3)  # one returned: what waited goes at once, not only as a full call
        for call in calls:
            call["release"].set()
        return idle_split, waiting, await asyncio.gather(*tasks)

    idle_split, waiting, answers = asyncio.run(scenario())
    assert idle_split == [[0, 1, 2], [3, 4]]
    assert waiting == (2, 7)
    assert [call["xs"] for call in calls] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [y_of(answer[0]) for answer in answers] == [x * 10 for x in range(7)]
    assert worker.outstanding == 0


def test_the_second_call_of_a_worker_with_python_stages_waits_for_the_clients_just_answered():
    """With a batched model the second call waits, as an idle worker's would, for the clients of the call that just
    returned: they come back one by one and travel together."""
    registry = WorkerRegistry()
    calls = []
    worker = add_worker(registry, "w", 1, calls, batch_size=4, hold=True, python_stages=True)
    clock = FakeClock()
    dispatcher = dispatcher_of(registry, clock)

    async def scenario():
        tasks = [asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(x))) for x in range(4)]
        await until(lambda: settled(dispatcher, tasks, calls))
        calls[0]["release"].set()
        await until(lambda: calls[0]["returned"] and worker.queues["m"].in_flight == 1)
        tasks.append(asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(10))))
        await until(lambda: worker.queues["m"].timer is not None)
        early = len(calls)  # the first client back waits for the other one
        tasks.append(asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(11))))
        await until(lambda: len(calls) == 3)
        for call in calls:
            call["release"].set()
        await asyncio.gather(*tasks)
        return early

    assert asyncio.run(scenario()) == 2
    assert [call["xs"] for call in calls] == [[0, 1], [2, 3], [10, 11]]
    assert not clock.pending()


class FakePredictSocket:
    """A worker's Predict socket as the dispatcher uses it: `begin` records the call at once (when it is written)
    and returns the future of its reply, which the test sets."""

    def __init__(self, events):
        self.events = events
        self.replies = []

    def begin(self, request, timeout=None):
        xs = [int(tensor_to_value(instance.items["x"])[0]) for instance in request.request.instances]
        self.events.append(("sent", xs))
        reply = asyncio.get_running_loop().create_future()
        self.replies.append((request, reply))
        return reply

    def answer(self, index):
        request, reply = self.replies[index]
        reply.set_result(reply_of(request))


def test_the_next_call_leaves_before_the_answered_requests_resume():
    """A call's reply hands its requests back in one event-loop turn; the call of the requests queued meanwhile is
    written in that turn too, before those requests' tasks (each writing its client's reply) run, not after them:
    the worker would sit idle behind them."""
    registry, events = WorkerRegistry(), []
    record = add_worker(registry, "w", 1, [], batch_size=1)
    record.predict = FakePredictSocket(events)
    dispatcher = dispatcher_of(registry)

    async def request(x):
        answers = await dispatcher.predict(spec_of(), instances_of(x))
        events.append(("answered", y_of(answers[0])))

    async def scenario():
        first = asyncio.ensure_future(request(1))
        await until(lambda: len(record.predict.replies) == 1)
        second = [asyncio.ensure_future(request(x)) for x in (2, 3)]
        await until(lambda: dispatcher.enqueued == 3)
        record.predict.answer(0)
        await until(lambda: len(record.predict.replies) == 2)
        record.predict.answer(1)
        await asyncio.gather(first, *second)

    asyncio.run(scenario())
    assert events == [("sent", [1]), ("sent", [2, 3]), ("answered", 10), ("answered", 20), ("answered", 30)]


def test_a_call_that_fails_as_it_is_sent_fails_its_requests_and_the_worker_takes_the_next():
    registry, events = WorkerRegistry(), []
    record = add_worker(registry, "w", 1, [], batch_size=1)
    record.predict = FakePredictSocket(events)
    sent = record.predict.begin
    failures = [ValueError("cannot serialize")]

    def begin(request, timeout=None):
        if failures:
            raise failures.pop()
        return sent(request, timeout)

    record.predict.begin = begin
    dispatcher = dispatcher_of(registry)

    async def scenario():
        with pytest.raises(ValueError, match="cannot serialize"):
            await dispatcher.predict(spec_of(), instances_of(1))
        second = asyncio.ensure_future(dispatcher.predict(spec_of(), instances_of(2)))
        await until(lambda: len(record.predict.replies) == 1)
        record.predict.answer(0)
        return [y_of(answer) for answer in await second]

    assert asyncio.run(scenario()) == [20]
    assert record.outstanding == 0
