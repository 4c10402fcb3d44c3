"""LlmWorker: the master's generation session with an LLM worker (llm_worker.proto).

A session carries every generation the master sends this worker: commands come in on a reader thread and go
to the engine loop with the session as their output sink, and each engine step's outputs go back as one
SessionBatch, so the cost per step does not grow with a thread wake-up and a gRPC message per token.
"""
import json
import queue
import threading
import time
from typing import Dict, Iterator, List, Tuple

import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.proto import llm_worker_pb2 as pb
from mindspore_serving.proto import llm_worker_pb2_grpc

VALIDATION, OVERLOADED, UNAVAILABLE, GENERATION = "validation", "overloaded", "unavailable", "generation"


def render_chat(template: str, message_format: str, messages) -> str:
    """The prompt of a chat: each message rendered with `message_format`, then put into `template`."""
    rendered = "".join(message_format.format(role=m.role, content=m.content) for m in messages)
    return template.format(messages=rendered)


def error_kind(err: BaseException) -> str:
    if isinstance(err, errors.Overloaded):
        return OVERLOADED
    if isinstance(err, errors.InvalidInputs):
        return VALIDATION
    if isinstance(err, (errors.ServableUnavailable, errors.WorkerUnavailable)):
        return UNAVAILABLE
    return GENERATION


def final_event(output) -> pb.GenerateEvent:
    metrics = output.metrics
    final = pb.Final(text=output.text, finish_reason=output.finish_reason.value if output.finish_reason else "error",
                     prompt_tokens=len(output.prompt_token_ids), completion_tokens=len(output.token_ids),
                     prompt=output.prompt or "")
    final.token_ids.extend(output.token_ids)
    if metrics is not None:
        final.queue_time = metrics.queue_time or 0.0
        final.time_to_first_token = metrics.time_to_first_token or 0.0
        final.e2e_latency = metrics.e2e_latency or 0.0
        if metrics.first_token_time is not None and metrics.last_token_time is not None and len(output.token_ids) > 1:
            final.inter_token_latency = (metrics.last_token_time - metrics.first_token_time) / (len(output.token_ids) - 1)
    return pb.GenerateEvent(final=final)


def output_events(output, index: int) -> List[pb.GenerateEvent]:
    """The events of one RequestOutput: a Token per new token with its own text, then the Final (or the
    Error) when it is the request's last output. `index` numbers the first new token."""
    events = []
    texts = output.new_token_texts or [""] * (len(output.new_token_ids) - 1) + [output.new_text]
    for position, token_id in enumerate(output.new_token_ids):
        logprob = output.new_logprobs[position] if position < len(output.new_logprobs) else 0.0
        events.append(pb.GenerateEvent(token=pb.Token(id=token_id, text=texts[position], logprob=logprob,
                                                      index=index + position)))
    if output.finished:
        events.append(pb.GenerateEvent(error=pb.Error(kind=GENERATION, message=output.error)) if output.error
                      else final_event(output))
    return events


def error_event(err: BaseException) -> pb.GenerateEvent:
    if not isinstance(err, errors.ServingError):
        err = errors.InvalidInputs(str(err)) if isinstance(err, ValueError) else errors.ServingError(
            errors.SYSTEM_ERROR, str(err))
    return pb.GenerateEvent(error=pb.Error(kind=error_kind(err), message=err.message))


class _Session:
    """One master session: submits its commands to the engine loop and turns each step's outputs into one
    SessionBatch (the loop calls `put` and `flush` on its own thread; see EngineLoop's OutputSink)."""

    def __init__(self, runtime, peer: str):
        self.runtime = runtime
        self.peer = peer
        self.batches: "queue.SimpleQueue" = queue.SimpleQueue()  # lists of (stream_id, item); None ends
        self._pending: List[Tuple[int, object]] = []
        self._live: Dict[int, object] = {}  # stream_id -> RequestStream
        self._lock = threading.Lock()
        self._closed = False
        self._ending = False
        self.ended = threading.Event()

    # --- OutputSink (engine loop thread) ---
    def put(self, stream, item):
        self._pending.append((stream.tag, item))

    def flush(self):
        if self._pending:
            batch, self._pending = self._pending, []
            self.batches.put(batch)

    # --- commands (reader thread) ---
    def read(self, commands: Iterator[pb.SessionCommand]):
        try:
            for command in commands:
                if command.WhichOneof("command") == "generate":
                    self._generate(command.stream_id, command.generate)
                else:
                    with self._lock:
                        stream = self._live.get(command.stream_id)
                    if stream is not None:
                        stream.abort()
        except grpc.RpcError:
            pass  # the master went away: handled below like the end of its commands
        except Exception:  # pylint: disable=broad-except
            log.exception(f"LLM session with {self.peer} failed reading its commands")
        self.close()

    def _generate(self, stream_id: int, request: pb.GenerateRequest):
        try:
            params = json.loads(request.params_json) if request.params_json else {}
            if not isinstance(params, dict):
                raise errors.InvalidInputs("parameters must be a JSON object")
            if request.messages:
                model = self.runtime.config.model
                prompt = render_chat(model.chat_template, model.chat_message, request.messages)
            else:
                prompt = request.prompt
            with self._lock:
                if self._closed:
                    return
                if self._ending:
                    raise errors.ServableUnavailable("the worker is stopping")
                self._live[stream_id] = self.runtime.submit(prompt, params, request.request_id or None,
                                                            sink=self, tag=stream_id)
        except (errors.ServingError, ValueError) as err:
            self.batches.put([(stream_id, err)])

    def end(self):
        """No more requests will come: end the replies once the running requests are done."""
        with self._lock:
            self._ending = True
            idle = not self._live
        if idle:
            self.batches.put(None)

    def close(self):
        """The session is over (the master closed it or went away): abort what still runs, end the replies."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live, self._live = list(self._live.values()), {}
        for stream in live:
            stream.abort()
        if live:
            log.warning(f"LLM session with {self.peer} ended with {len(live)} request(s) running: aborted")
        self.batches.put(None)

    # --- replies (the gRPC handler's thread) ---
    def replies(self) -> Iterator[pb.SessionBatch]:
        counts: Dict[int, int] = {}
        while True:
            batch = self.batches.get()
            if batch is None:
                self.ended.set()
                return
            reply = pb.SessionBatch()
            by_stream: Dict[int, pb.StreamEvents] = {}
            for stream_id, item in batch:
                events = by_stream.get(stream_id)
                if events is None:
                    events = by_stream[stream_id] = reply.streams.add(stream_id=stream_id)
                if isinstance(item, BaseException):
                    events.events.append(error_event(item))
                    self._done(stream_id, counts)
                    continue
                index = counts.get(stream_id, 0)
                events.events.extend(output_events(item, index))
                counts[stream_id] = index + len(item.new_token_ids)
                if item.finished:
                    self._done(stream_id, counts)
            yield reply

    def _done(self, stream_id: int, counts: Dict[int, int]):
        counts.pop(stream_id, None)
        with self._lock:
            self._live.pop(stream_id, None)
            idle = self._ending and not self._live
        if idle:
            self.batches.put(None)


class LlmWorkerServicer(llm_worker_pb2_grpc.LlmWorkerServicer):
    def __init__(self, runtime):
        self.runtime = runtime
        self._sessions: List[_Session] = []
        self._lock = threading.Lock()

    def Session(self, request_iterator, context):
        session = _Session(self.runtime, context.peer())
        with self._lock:
            self._sessions.append(session)
        context.add_callback(session.close)  # cancelled or broken: abort its requests so KV blocks are freed
        threading.Thread(target=session.read, args=(request_iterator,), name="llm-session-commands",
                         daemon=True).start()
        try:
            yield from session.replies()
        finally:
            with self._lock:
                self._sessions.remove(session)

    def end_sessions(self, timeout: float):
        """Ends every session once its running requests are done; waits at most `timeout` seconds in all."""
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.end()
        deadline = time.monotonic() + timeout
        for session in sessions:
            session.ended.wait(max(0.0, deadline - time.monotonic()))
