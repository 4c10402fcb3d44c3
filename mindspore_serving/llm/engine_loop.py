"""Runs an LLMEngine in its own thread so that callers in other threads (gRPC handlers, asyncio front ends,
tests) can submit requests, stream their outputs and abort them.

    loop = EngineLoop(engine, max_waiting=256, request_timeout=0)
    stream = loop.submit("Once upon a time", {"max_new_tokens": 16, "temperature": 0})
    for output in stream:            # RequestOutput objects, the last one has finished=True
        print(output.new_text, end="")
    loop.close()

A request with several choices (n / best_of) streams the outputs of all of them (RequestOutput.index), each choice
ending with its own finished output; the stream ends after the last choice's.

The engine itself is not thread-safe: every call into it happens on the loop thread; other threads only
put commands on a queue. The requests' streams (`_streams`, each stream's queue or sink) are the loop thread's too,
with one exception: `close()` ends them from the caller's thread when the loop thread does not stop in time (stuck
in a model step). So every touch of them, on either thread, holds `_lock`; the loop thread takes it only around
those touches, never around a call into the engine, so `close()` always gets it. Once `close()` (or a failure of
the loop) has ended the streams, `_ended` is set and whatever the loop thread still produces is dropped.

A request submitted with a `sink` does not queue its outputs on its own stream: the loop hands them to
`sink.put(stream, item)` and calls `sink.flush()` once per loop iteration, so a consumer of many requests
(the worker's session with the master) gets one batch per engine step instead of one wake-up per token.
"""

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.llm.engine import EncodedPrompt, LLMEngine, RequestOutput
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.step_report import StepReport

_END = object()


class OutputSink(Protocol):
    """Receives the outputs of the requests submitted with it, on the loop thread (or on the thread of a `close()`
    that gave up on it), under the loop's lock: neither method may block."""

    def put(self, stream: "RequestStream", item: RequestOutput | BaseException) -> None:
        """`item`: a RequestOutput, or the exception that ends the request."""

    def flush(self) -> None:
        """Called once per loop iteration after `put`s: hand the collected items on together."""


@dataclass
class _Add:
    request_id: str
    prompt: Any
    params: Any
    stream: "RequestStream"
    arrival_time: float  # engine clock at submit: time in queue counts the wait for the loop thread too


@dataclass
class _Abort:
    request_id: str


class RequestStream:
    """The outputs of one request, in order; iterate it (blocking) or call `get`."""

    def __init__(self, loop: "EngineLoop", request_id: str, sink: OutputSink | None = None, tag: Any = None):
        self.loop = loop
        self.request_id = request_id
        self.sink = sink
        self.tag = tag  # the sink's own key for this request
        self._outputs: queue.Queue = queue.Queue()
        self.final: RequestOutput | None = None
        """The last finished output (of the last choice to finish)."""
        self.finals: list[RequestOutput] = []
        """Each choice's finished output, in the order they came (the reader's side)."""
        self.error: BaseException | None = None
        self._num_finished = 0  # choices whose finished output the loop has delivered (the loop's side)

    def _put(self, item: RequestOutput | BaseException) -> None:
        if self.sink is None:
            self._outputs.put(item)
        else:
            self.sink.put(self, item)
            self.loop._dirty.add(self.sink)

    def get(self, timeout: float | None = None) -> RequestOutput | None:
        """The next RequestOutput; raises the request's error; None after the last output."""
        item = self._outputs.get(timeout=timeout)
        if item is _END:
            self._outputs.put(_END)
            return None
        if isinstance(item, BaseException):
            self._outputs.put(_END)
            raise item
        output: RequestOutput = item
        if output.finished:
            self.finals.append(output)
            if len(self.finals) >= output.num_choices:
                self.final = output
                self._outputs.put(_END)
        return output

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            item = self.get()
            if item is None:
                return
            yield item

    def result(self) -> RequestOutput:
        """Blocks until the request finishes and returns its last output (with several choices, the last one to
        finish: `finals` has them all)."""
        for _ in self:
            pass
        assert self.final is not None  # the stream ends after the last choice's final output, or raises
        return self.final

    def abort(self) -> None:
        self.loop.abort(self.request_id)


class EngineLoop:
    close_timeout = 10.0
    """Seconds `close()` waits for the loop thread before it ends the streams itself."""

    def __init__(
        self,
        engine: LLMEngine,
        max_waiting: int = 256,
        request_timeout: float = 0.0,
        name: str = "llm-engine",
        stats_interval: float = 0.0,
    ):
        self.engine = engine
        self.stats_interval = stats_interval  # seconds between statistics lines while busy (0: none)
        self.report = StepReport()
        engine.add_step_listener(self.report.add)
        self.max_waiting = max_waiting
        self.request_timeout = request_timeout  # seconds from submit, on the engine clock, before an abort (0: none)
        self._commands: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # guards _streams, _ended, the streams' puts and _dirty (module docstring)
        self._streams: dict[str, RequestStream] = {}
        self._ended = False  # every stream has been ended: the loop's later outputs are dropped
        self._deadlines: dict[str, float] = {}
        self._ids = 0
        self._ids_lock = threading.Lock()
        self._admitted = 0  # requests accepted and not yet finished (for back-pressure)
        self._dirty: set[OutputSink] = set()  # sinks with items not yet flushed (loop thread only)
        self._closed = threading.Event()
        self.steps_done = 0
        """Engine steps completed: while it has work, the engine progresses as long as this grows (any thread
        reads it; a worker's sessions report it to the master, whose watchdog judges a hang by it)."""
        self.failure: str | None = None
        self.closed_reason = "the LLM engine is stopped"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- called from any thread ----
    def submit(
        self,
        prompt: str | Sequence[int] | EncodedPrompt,
        params: Any = None,
        request_id: str | None = None,
        sink: OutputSink | None = None,
        tag: Any = None,
    ) -> RequestStream:
        """Queues a request (a prompt str, a list of token ids or an EncodedPrompt); raises errors.Overloaded
        when too many wait.
        With `sink`, its outputs go to the sink (see the module docstring), `tag` being its key there."""
        if self._closed.is_set():
            raise errors.WorkerUnavailable(self.closed_reason)
        with self._ids_lock:
            limit = self.engine_capacity()
            if self._admitted >= limit:
                raise errors.Overloaded(
                    f"Model is overloaded: {self._admitted} requests are in the engine, its limit "
                    f"(max_num_seqs {self.engine.config.max_num_seqs} running + max_queue_size {self.max_waiting} "
                    "waiting); retry later"
                )
            self._admitted += 1
            if request_id is None:
                self._ids += 1
                request_id = f"req-{self._ids}"
        stream = RequestStream(self, request_id, sink, tag)
        with self._lock:  # a command queued after _end_all drained the queue would never be answered
            if self._ended:
                self._release()
                raise errors.WorkerUnavailable(self.closed_reason)
            self._commands.put(_Add(request_id, prompt, params, stream, self.engine.clock()))
        return stream

    def engine_capacity(self) -> int:
        """Requests the engine holds at once: the running ones plus `max_waiting` waiting."""
        return self.engine.config.max_num_seqs + self.max_waiting

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def close(self, reason: str = "the LLM engine is stopping") -> None:
        """Stops the loop; every request not finished yet fails with `reason`, an unavailable error (its worker
        is stopping or restarting: a client may retry). Returns within about `close_timeout` seconds: a loop
        thread still busy then (a model step that hangs) is left behind, its requests failed all the same."""
        if not self._closed.is_set():
            self.closed_reason = reason
            self._closed.set()
            self._commands.put(None)
            self._thread.join(timeout=self.close_timeout)
            if self._thread.is_alive():
                log.error(
                    f"the LLM engine loop did not stop within {self.close_timeout} s; its requests fail without it"
                )
            self._end_all(errors.WorkerUnavailable(reason))

    # ---- the loop thread ----
    def _run(self) -> None:
        try:
            while not self._closed.is_set():
                block = not self.engine.has_unfinished()
                if not self._drain(block):
                    break
                self._expire()
                outputs: Sequence[RequestOutput] = ()
                if self.engine.has_unfinished():
                    outputs = self.engine.step()
                    self.steps_done += 1
                with self._lock:
                    for output in outputs:
                        self._deliver(output)
                    self._flush()
                if self.stats_interval and (
                    self.report.due(self.stats_interval) or (self.report.pending and not self.engine.has_unfinished())
                ):
                    log.info(self.report.line())
        except Exception as err:  # the engine itself broke: every request gets the reason
            log.exception("LLM engine loop failed")
            self.failure = f"{type(err).__name__}: {err}"
            self.closed_reason = f"the LLM engine is stopped: {self.failure}"
            self._closed.set()
            if isinstance(err, errors.WorkerUnavailable):
                # e.g. its model runner lost an agent before the worker closed this loop: still "retry later"
                self._end_all(errors.WorkerUnavailable(str(err)))
            else:
                self._end_all(errors.ServingError(errors.SYSTEM_ERROR, f"LLM engine failed: {self.failure}"))

    def _drain(self, block: bool) -> bool:
        """Applies queued commands; returns False when the loop must end."""
        while True:
            try:
                command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
            except queue.Empty:
                return True
            block = False
            if command is None:
                return False
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Abort):
                with self._lock:
                    known = command.request_id in self._streams
                if known:
                    self.engine.abort(command.request_id)
                    # the engine reports the aborted request in its next step's outputs

    def _add(self, command: _Add) -> None:
        try:
            if isinstance(command.prompt, str):
                self.engine.add_request(
                    command.prompt, command.params, request_id=command.request_id, arrival_time=command.arrival_time
                )
            elif isinstance(command.prompt, EncodedPrompt):
                self.engine.add_request(
                    command.prompt.text,
                    command.params,
                    request_id=command.request_id,
                    prompt_token_ids=list(command.prompt.token_ids),
                    arrival_time=command.arrival_time,
                )
            else:
                self.engine.add_request(
                    None,
                    command.params,
                    request_id=command.request_id,
                    prompt_token_ids=list(command.prompt),
                    arrival_time=command.arrival_time,
                )
        except (InvalidRequestError, ValueError, TypeError) as err:
            self._release()
            with self._lock:
                command.stream._put(err if isinstance(err, errors.ServingError) else errors.InvalidInputs(str(err)))
            return
        with self._lock:
            if self._ended:  # close() gave up on this thread while the engine took the request
                self._release()
                command.stream._put(errors.WorkerUnavailable(self.closed_reason))
                return
            self._streams[command.request_id] = command.stream
        if self.request_timeout > 0:
            self._deadlines[command.request_id] = command.arrival_time + self.request_timeout

    def _expire(self) -> None:
        if not self._deadlines:
            return
        now = self.engine.clock()
        for request_id, deadline in list(self._deadlines.items()):
            if now >= deadline:
                del self._deadlines[request_id]
                log.warning(f"request {request_id} exceeded the request timeout of {self.request_timeout} s")
                self.engine.abort(request_id)

    def _deliver(self, output: RequestOutput) -> None:
        """Hands one output to its stream (under _lock)."""
        stream = self._streams.get(output.request_id)
        if stream is None:
            return
        stream._put(output)
        if output.finished:
            stream._num_finished += 1
        if stream._num_finished >= output.num_choices:
            del self._streams[output.request_id]
            self._deadlines.pop(output.request_id, None)
            self._release()

    def _flush(self) -> None:
        """Flushes the sinks that got items (under _lock)."""
        while self._dirty:
            self._dirty.pop().flush()

    def _release(self) -> None:
        with self._ids_lock:
            self._admitted -= 1

    def _end_all(self, error: BaseException) -> None:
        """Ends every stream, and every request still queued, with `error`; from either thread (module
        docstring). Later outputs of the loop thread are dropped."""
        with self._lock:
            self._ended = True
            for stream in self._streams.values():
                stream._put(error)
            self._streams.clear()
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if isinstance(command, _Add):
                    command.stream._put(error)
            self._flush()
