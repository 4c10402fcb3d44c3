"""Routes a request's instances to workers: checks them, cuts them into chunks of the worker batch size,
sends each chunk to the least busy worker and puts the answers back in request order.

Chunks of concurrent requests bound for the same worker and method wait in that worker's queue and travel
together in one WorkerPredictRequest (a call to a worker costs far more than an instance in it):
- a worker with no call in flight gets what is queued on the next event-loop turn (chunks arriving in the
  current turn join it); for a model with a batch dimension a partial batch first waits a little while more
  is likely to come: clients just answered that have not sent again, or a burst still being read (see
  _WorkerQueue._settle_delay; a lone request never waits);
- a worker with a call in flight gets another one only when a full call (MAX_CALL_INSTANCES, a multiple of
  its batch size) is queued; otherwise the queue is sent when the call returns;
- except for a method with Python stages, which its worker runs one call at a time in one thread: such a worker
  keeps two calls in flight. An idle one gets what is queued as two calls (halves), a busy one a second call with
  what is queued (after the same settle wait). The Python stages of one call then run while the other's model
  stage, answers and returning clients are on their way, instead of the thread idling through them; calls get
  smaller, which costs little next to the Python work;
- a worker that batches continuously itself (an LLM servable: requests join and leave its running batch at every
  step) gets every request at once, in a call of its own: holding a short request back behind a long one, or
  in the same call, would make it wait for the long one to finish.
The worker runs the instances of a call together (so they share model batches) and answers them in order;
the answers are split back to their requests. A lost worker fails every request of its calls at once.
"""

import asyncio
import collections
import functools
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence

import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.instance_checks import check_instance, check_tensor
from mindspore_serving.common.metrics import CANCELLED, SERVER_ERROR, outcome_of_answers, outcome_of_code
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.master.metrics import MasterMetrics
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry, request_repr
from mindspore_serving.proto import internal_pb2
from mindspore_serving.spec.llm import LLM_EXTENSION

DEFAULT_MAX_ENQUEUED_REQUESTS = 10000
DEFAULT_MAX_ENQUEUED_BYTES = 1 << 30  # serialized instances of the requests held at once
DEFAULT_REQUEST_TIMEOUT = 300.0  # seconds a request without a deadline of its own (REST) may take; 0: none
MAX_CALLS_IN_FLIGHT = 2  # per worker and method; the second carries a full call (any call: Python stages)
MAX_CALL_INSTANCES = 64  # instances in one call (at least one batch of the worker)
MAX_CALL_BYTES = 64 << 20  # serialized instances in one call (a larger chunk still goes, alone)
SETTLE_SECONDS = 0.02  # how long a partial batch for an idle worker may wait for more (see _settle_delay)
SETTLE_MAX_SECONDS = 0.1  # ... at most, when answered clients took that long to come back last time


class LoopClock:
    """The dispatcher's time: the monotonic clock and the event loop's timers. Tests pass a clock they move by hand,
    so that the batching window, the settle logic and the deadlines never depend on elapsed time."""

    # the clock the event loops read (uvloop's loop.time() is the same one, in ms as of its turn's start); timers
    # take delays, so the two mix
    now = staticmethod(time.monotonic)

    @staticmethod
    def call_later(delay: float, callback) -> "asyncio.TimerHandle":
        """Calls `callback` once `delay` seconds of this clock have passed; the handle's cancel() stops it."""
        return asyncio.get_running_loop().call_later(delay, callback)


class _Chunk:
    """Instances of one public request bound for one worker call, the future of their answers, the request's
    deadline (clock time, or None) and its id (the one its reply carries, "" when it has none)."""

    __slots__ = ("spec", "instances", "future", "nbytes", "deadline", "queued_at", "request_id")

    def __init__(
        self,
        spec,
        instances: Sequence,
        future: "asyncio.Future",
        deadline: float | None = None,
        nbytes: int | None = None,
        request_id: str = "",
    ):
        self.spec = spec
        self.instances = instances
        self.future = future
        self.nbytes = sum(instance.ByteSize() for instance in instances) if nbytes is None else nbytes
        self.deadline = deadline
        self.queued_at = 0.0
        self.request_id = request_id


class _WorkerQueue:
    """Chunks waiting for one worker and method, and that worker's calls in flight for it."""

    def __init__(self, dispatcher: "Dispatcher", worker: WorkerRecord, method_name: str = ""):
        self.dispatcher = dispatcher
        self.stats = dispatcher.metrics.method(worker.servable_name, worker.version_number, method_name)
        self.worker = worker
        self.clock = dispatcher.clock
        self.continuous = LLM_EXTENSION in worker.extensions  # the worker batches continuously (see the module)
        signature = worker.methods.get(method_name)
        # its Python stages run one call at a time: a second call keeps them busy while the first is elsewhere
        self.pipelined = not self.continuous and signature is not None and not signature.only_model_stage
        self.batch_size = max(1, worker.batch_size)
        self.max_instances = max(self.batch_size, MAX_CALL_INSTANCES // self.batch_size * self.batch_size)
        self.pending: collections.deque[_Chunk] = collections.deque()
        self.pending_count = 0
        self.in_flight = 0
        self.scheduled = False  # a flush is due (next turn, or `timer`)
        self.timer = None  # the delayed flush while a partial batch waits
        self.arrived = False  # a chunk came since the last flush attempt
        self.settle_until = None  # end of the wait for a burst being read
        self.owed = 0  # instances answered whose clients have not sent anything since
        self.owed_since = None  # when the oldest of them was answered
        self.owed_limit = SETTLE_SECONDS  # how long to wait for them: twice their last return, within limits
        self.tasks: set[asyncio.Task] = set()  # the calls in flight (a task needs a reference until it is done)

    def put(self, item: _Chunk):
        item.queued_at = self.clock.now()
        self.pending.append(item)
        self.pending_count += len(item.instances)
        self.arrived = True
        if self.owed:
            self.owed = max(0, self.owed - len(item.instances))
            if not self.owed:  # every answered client is back: next time, wait up to twice as long as that took
                took = self.clock.now() - self.owed_since
                self.owed_limit = min(SETTLE_MAX_SECONDS, max(SETTLE_SECONDS, 2 * took))
                self.owed_since = None
        if self.timer is not None and (self.pending_count >= self.batch_size or not self.owed):
            self.timer.cancel()  # the batch is full, or everyone answered is back: no more waiting
            self.timer = None
            self.scheduled = False
        self._schedule()

    def _may_send(self) -> bool:
        if self.continuous:
            return bool(self.pending)
        if not self.pending or self.in_flight >= MAX_CALLS_IN_FLIGHT:
            return False
        # an idle worker takes whatever is there; a busy one only full calls (pipelined: a second call)
        return self.in_flight == 0 or self.pipelined or self.pending_count >= self.max_instances

    def _schedule(self):
        if not self.scheduled and self._may_send():
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)  # the next turn: chunks arriving now join

    def _settle_delay(self) -> float | None:
        """How long a partial batch for an idle worker still waits (0: one more loop turn), or None.

        Only for a model with a batch dimension, where every batch costs as much as a full one. It waits while
        as many instances have not arrived since calls returned as those calls answered (clients that send
        their next request once answered), at most `owed_limit` (SETTLE_SECONDS, or twice as long as they took
        to come back last time, up to SETTLE_MAX_SECONDS); or while chunks keep arriving turn after turn (a
        burst being read), at most SETTLE_SECONDS. A lone request never waits."""
        if (
            self.continuous
            or self.batch_size == 1
            or (self.in_flight and not self.pipelined)
            or self.pending_count >= self.batch_size
        ):
            self.settle_until = None
            return None
        now = self.clock.now()
        if self.owed:
            if now < self.owed_since + self.owed_limit:
                return self.owed_since + self.owed_limit - now
            self.owed, self.owed_since, self.owed_limit = 0, None, SETTLE_SECONDS  # they are not coming back
        if self.arrived:
            if self.settle_until is None:
                self.settle_until = now + SETTLE_SECONDS
            if now < self.settle_until:
                self.arrived = False
                return 0.0
        self.settle_until = None
        return None

    def _flush(self):
        self.timer = None
        delay = self._settle_delay()
        if delay is not None:
            if delay > 0:
                self.timer = self.clock.call_later(delay, self._flush)
            else:
                asyncio.get_running_loop().call_soon(self._flush)  # a loop turn, not time: see _settle_delay
            return
        self.scheduled = False
        self.arrived = False
        while self._may_send():
            limit = 1 if self.continuous else self.max_instances  # continuous: one request's chunk per call
            if self.pipelined and self.in_flight == 0 and self.pending_count > 1:
                limit = min(limit, (self.pending_count + 1) // 2)  # two calls: the second's Python follows the first's
            chunks, count, nbytes = [], 0, 0
            while self.pending and (
                not chunks
                or (
                    count + len(self.pending[0].instances) <= limit
                    and nbytes + self.pending[0].nbytes <= MAX_CALL_BYTES
                )
            ):
                item = self.pending.popleft()
                size = len(item.instances)
                self.pending_count -= size
                if item.future.done():  # its request was cancelled before the chunk left
                    self.worker.outstanding -= size
                    continue
                chunks.append(item)
                count += size
                nbytes += item.nbytes
            if chunks:
                self.in_flight += 1
                task = asyncio.ensure_future(self._call(chunks, count, *self._send(chunks)))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    def _send(self, chunks: list[_Chunk]) -> tuple[str, Awaitable]:
        """Sends the chunks to the worker as one call, now: the replies to earlier calls that this event-loop turn
        also hands back (each resuming its request's task) would otherwise go first, the worker idle meanwhile.
        Returns the call's id and what its reply is awaited with."""
        worker = self.worker
        first = chunks[0].spec
        request_id = f"{worker.pid}-{next(self.dispatcher._ids)}"
        request = internal_pb2.WorkerPredictRequest(request_id=request_id)
        spec = request.request.servable_spec
        spec.name = first.name
        spec.method_name = first.method_name
        spec.version_number = worker.version_number
        instances = request.request.instances
        now, queue_time = self.clock.now(), self.stats.queue
        for item in chunks:
            instances.extend(item.instances)
            queue_time.observe(now - item.queued_at)
        request.request_sizes.extend([len(item.instances) for item in chunks])
        request.client_request_ids.extend([item.request_id for item in chunks])  # the worker's log lines name them
        # the call lasts as long as the latest of its requests may: none is cut before its own deadline
        deadlines = [item.deadline for item in chunks]
        timeout = None if None in deadlines else max(0.001, max(deadlines) - self.clock.now())
        # the worker's Predict socket when it offers one (ipc/predict_socket.py: a fraction of gRPC's cost)
        call = worker.predict.begin if worker.predict is not None else worker.stub.Predict
        try:
            return request_id, call(request, timeout=timeout)
        except Exception as err:  # raised where the reply is awaited (_call), which answers the chunks with it
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(err)
            return request_id, failed

    async def _call(self, chunks: list[_Chunk], count: int, request_id: str, sent: Awaitable):
        worker = self.worker
        try:
            reply = await sent
        except ipc.CONNECTION_ERRORS as err:
            # this task runs in a copy of the context of the request that queued the first chunk: unbound there (only
            # in this task), the line does not end with that request's id but names all of them
            log.bind_request_id(None)
            detail = f"{err.code().name} {err.details()}" if isinstance(err, grpc.aio.AioRpcError) else err
            log.warning(f"call {request_id} to worker pid {worker.pid} failed ({_requests_of(chunks)}): {detail}")
            what = worker.lost_reason or f"the worker (pid {worker.pid}) stopped while handling it"
            for item in chunks:
                error = errors.WorkerUnavailable(
                    f"Request {request_repr(item.spec.name, item.spec.method_name, item.spec.version_number)}, "
                    f"servable is not available: {what}"
                )
                _set_result(item.future, [error] * len(item.instances))
            return
        except asyncio.CancelledError:
            for item in chunks:
                item.future.cancel()
            raise
        except BaseException as err:
            for item in chunks:
                if not item.future.done():
                    item.future.set_exception(err)
            if not isinstance(err, Exception):
                raise
            return
        finally:
            worker.outstanding -= count
            self.in_flight -= 1
            if self.batch_size > 1:  # only partial batches wait for answered clients to come back
                if not self.owed:
                    self.owed_since = self.clock.now()
                self.owed += count
            self._schedule()
        try:
            _split_reply(worker, reply, chunks, count)
        except Exception as err:  # a malformed reply: the requests still get an answer
            for item in chunks:
                if not item.future.done():
                    item.future.set_exception(err)


def _requests_of(chunks: list[_Chunk]) -> str:
    """The public requests of a call as a log line names them, by the ids their replies carry."""
    ids = [item.request_id or "(no id)" for item in chunks]
    return ("request " if len(ids) == 1 else "requests ") + ", ".join(ids)


def _merge_parts(reasons: list[str | None], parts: list[list[int]], part_answers: list[list]) -> list:
    """The answers of a request cut into parts, in its order; invalid instances (a reason) get InvalidInputs."""
    results: list = [errors.InvalidInputs(reason) if reason else None for reason in reasons]
    for part, answers in zip(parts, part_answers):
        for index, answer in zip(part, answers):
            results[index] = answer
    return results


def _set_result(future: "asyncio.Future", result):
    if not future.done():  # a cancelled request no longer waits for its answers
        future.set_result(result)


def _split_reply(worker: WorkerRecord, reply, chunks: list[_Chunk], count: int):
    """Hands each chunk the answers of its instances: the Instance message or a ServingError."""
    instances, error_msgs = reply.instances, reply.error_msg
    answered = min(len(instances), len(error_msgs))
    position = 0
    for item in chunks:
        answers = []
        for index in range(position, position + len(item.instances)):
            if index >= answered:
                answers.append(
                    errors.SystemError_(f"Serving Error: the worker answered {answered} of {count} instances")
                )
                continue
            error = error_msgs[index]
            if error.error_code:
                answers.append(errors.make_error(error.error_code, error.error_msg.decode(errors="replace")))
            else:
                answers.append(instances[index])
        position += len(item.instances)
        worker.served += 1
        _set_result(item.future, answers)


class Dispatcher:
    def __init__(self, registry: WorkerRegistry, clock=None, metrics: MasterMetrics | None = None):
        self.registry = registry
        self.metrics = metrics if metrics is not None else MasterMetrics()
        self.clock = clock if clock is not None else LoopClock()
        self.max_enqueued_requests = DEFAULT_MAX_ENQUEUED_REQUESTS
        self.max_enqueued_bytes = DEFAULT_MAX_ENQUEUED_BYTES
        self.enqueued_bytes = 0
        self.request_timeout = DEFAULT_REQUEST_TIMEOUT
        self.enqueued = 0
        self._ids = itertools.count(1)

    async def predict(self, spec, instances: Sequence, timeout: float | None = None) -> list:
        """Answers every instance of a request; raises ServingError for a request-wide failure.

        `timeout`: the seconds the request may take (a gRPC client's deadline); None: `request_timeout` (0: none).
        The calls to workers carry the deadline; past it the request fails with "deadline ... exceeded". They
        also carry the request's id, the one the front end bound to this task's log lines (log.bind_request_id),
        so that the worker's lines about the request name it too."""
        if not instances:
            raise errors.InvalidInputs("Instances count of request cannot be 0")
        if self.enqueued >= self.max_enqueued_requests:
            self.metrics.rejected += 1
            raise errors.ServingError(
                errors.FAILED, f"Serving Error: enqueued requests count exceeds the limit {self.max_enqueued_requests}"
            )
        nbytes = sum(instance.ByteSize() for instance in instances)
        if self.enqueued and self.enqueued_bytes + nbytes > self.max_enqueued_bytes:  # one alone always goes
            self.metrics.rejected += 1
            raise errors.Overloaded(
                f"Serving Error: enqueued requests size exceeds the limit "
                f"{self.max_enqueued_bytes} bytes (--max_enqueued_mb)"
            )
        if timeout is None:
            timeout = self.request_timeout or None
        # an unknown servable or method is refused before it is counted: clients do not make new label values
        candidates = self.registry.candidates(spec.name, spec.method_name, spec.version_number)
        stats = self.metrics.method(spec.name, candidates[0].version_number, spec.method_name)
        started = self.clock.now()
        outcome = SERVER_ERROR
        self.enqueued += 1
        self.enqueued_bytes += nbytes
        try:
            pending, merge = self._answers(
                spec,
                candidates,
                instances,
                None if timeout is None else self.clock.now() + timeout,
                nbytes,
                log.current_request_id() or "",
            )
            answers = await (pending if timeout is None else self._within(pending, timeout, spec))
            if merge is not None:
                answers = merge(answers)
            outcome = outcome_of_answers(answers)
            return answers
        except errors.ServingError as err:
            outcome = outcome_of_code(err.code)
            raise
        except asyncio.CancelledError as err:  # the client went away, or the stopping server cut the request
            if not errors.cut_by_stop(err):
                outcome = CANCELLED
            raise
        finally:
            self.enqueued -= 1
            self.enqueued_bytes -= nbytes
            stats.outcomes[outcome] += 1
            stats.latency.observe(self.clock.now() - started)
            stats.instances.observe(len(instances))

    async def _within(self, pending: "asyncio.Future", timeout: float, spec):
        """What `pending` gives, or errors.Failed once `timeout` seconds have passed: then `pending` is cancelled
        (and with it the request's chunks: those still queued never leave). One timer on the dispatcher's clock."""
        expired = []

        def expire():
            expired.append(True)
            pending.cancel()

        timer = self.clock.call_later(timeout, expire)
        try:
            return await pending
        except asyncio.CancelledError:
            if not expired:  # the request itself was cancelled
                raise
            raise errors.Failed(
                f"Request {request_repr(spec.name, spec.method_name, spec.version_number)}, "
                f"deadline of {timeout:g} s exceeded"
            ) from None
        finally:
            timer.cancel()

    def _answers(
        self,
        spec,
        candidates: list[WorkerRecord],
        instances: Sequence,
        deadline: float | None,
        nbytes: int | None = None,
        request_id: str = "",
    ) -> tuple["asyncio.Future", Callable[[list], list] | None]:
        """Queues the request: invalid instances get their error, the rest go to workers in chunks of at most a
        batch. Returns a future of the answers and, when the request was cut, the function that puts the chunks'
        answers (a list per chunk) back in the request's order."""
        input_names = candidates[0].input_names(spec.method_name)
        reasons = [
            check_instance(instance.items, input_names, spec.name, spec.method_name, check_tensor)
            for instance in instances
        ]
        batch = max(w.batch_size for w in candidates) if len(candidates) > 1 else candidates[0].batch_size
        if len(instances) <= batch and not any(reasons):  # the common case: one chunk, all instances valid
            return self._enqueue(spec, candidates, instances, deadline, nbytes, request_id), None
        valid = [index for index, reason in enumerate(reasons) if reason is None]
        parts = [valid[start : start + batch] for start in range(0, len(valid), max(1, batch))]
        futures = [
            self._enqueue(spec, candidates, [instances[i] for i in part], deadline, request_id=request_id)
            for part in parts
        ]
        return asyncio.gather(*futures), functools.partial(_merge_parts, reasons, parts)

    def _enqueue(
        self,
        spec,
        candidates: list[WorkerRecord],
        instances: Sequence,
        deadline: float | None = None,
        nbytes: int | None = None,
        request_id: str = "",
    ) -> "asyncio.Future":
        """Queues one chunk for the least busy worker; the future gets one answer per instance (`nbytes`: their
        serialized size, when the caller knows it; `request_id`: the request's, for the worker's log)."""
        worker = self.registry.pick(candidates)
        queue = worker.queues.get(spec.method_name)
        if queue is None:
            queue = worker.queues[spec.method_name] = _WorkerQueue(self, worker, spec.method_name)
        future = asyncio.get_running_loop().create_future()
        worker.outstanding += len(instances)
        queue.put(_Chunk(spec, instances, future, deadline, nbytes, request_id))
        return future
