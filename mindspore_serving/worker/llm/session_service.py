"""LlmWorker: the master's generation session with an LLM worker (llm_worker.proto).

A session carries every generation the master sends this worker: commands come in on a reader thread and go
to the engine loop with the session as their output sink, and each engine step's outputs go back as one
SessionBatch, so the cost per step does not grow with a thread wake-up and a gRPC message per token. A chat's
messages become its prompt through the runtime's Prompter (worker/llm/prompts.py), which also answers
Tokenize and Detokenize.

While a session has requests and none of them changes (they wait behind other work, a long prompt is being
computed), it sends an empty batch every PROGRESS_INTERVAL_S if the engine completed steps meanwhile: the master
judges a worker hung by the time since its session's last batch, not by one request's wait for a token.

A request with several choices (n / best_of) is one stream: its Tokens name their choice and number their
positions per choice, each choice ends with its own Final, and the stream is done after the last one. When a
choice fails, its Error ends the stream for the master at once, and the worker aborts the other choices.
"""

import functools
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.ipc import llm_session
from mindspore_serving.proto import llm_worker_pb2 as pb
from mindspore_serving.proto import llm_worker_pb2_grpc

TOKEN_TEXTS_CACHED = 1 << 16
"""Single-token texts (top logprobs, scored prompts) a session keeps decoded."""

PROGRESS_INTERVAL_S = 1.0
"""Seconds a session with requests may go without a batch before it sends an empty one, if the engine stepped
meanwhile (the master's token timeout must be well above it)."""


class _StreamState:
    """What the replies keep per stream: the next token index of each choice, the choices finished, whether it
    failed (nothing more is sent then)."""

    def __init__(self):
        self.next_index: defaultdict[int, int] = defaultdict(int)
        self.num_finished = 0
        self.failed = False


class _Session:
    """One master session: submits its commands to the engine loop and turns each step's outputs into one
    SessionBatch (the loop calls `put` and `flush` on its own thread; see EngineLoop's OutputSink)."""

    def __init__(self, runtime, peer: str, progress_interval: float = PROGRESS_INTERVAL_S):
        self.runtime = runtime
        self.peer = peer
        self.progress_interval = progress_interval
        self.special_ids = runtime.tokenizer.special_ids
        self.token_text = functools.lru_cache(maxsize=TOKEN_TEXTS_CACHED)(self._decode_one)
        self.batches: queue.SimpleQueue = queue.SimpleQueue()  # lists of (stream_id, item); None ends
        self._pending: list[tuple[int, object]] = []
        self._live: dict[int, object] = {}  # stream_id -> RequestStream
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
            params = llm_session.params_from_proto(request.params, self.runtime.generation_defaults.sampling)
            if request.messages:
                prompt = self.runtime.prompter.chat(
                    llm_session.read_chat_messages(request.messages),
                    tools=llm_session.read_json(request.tools_json),
                    template_kwargs=llm_session.read_json(request.template_kwargs_json),
                )
            elif request.prompt_token_ids:
                prompt = list(request.prompt_token_ids)
            else:
                prompt = request.prompt
            with self._lock:
                if self._closed:
                    return
                if self._ending:
                    raise errors.WorkerUnavailable(f"the worker of {self.runtime.spec.name} is stopping")
                self._live[stream_id] = self.runtime.submit(
                    prompt, params, request.request_id or None, sink=self, tag=stream_id
                )
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

    def _decode_one(self, token_id: int) -> str:
        """One token's own text, special tokens kept (a top logprob's, a scored prompt token's)."""
        return self.runtime.tokenizer.decode([token_id], skip_special_tokens=False)

    # --- replies (the gRPC handler's thread) ---
    def replies(self) -> Iterator[pb.SessionBatch]:
        streams: dict[int, _StreamState] = {}
        steps = self.runtime.engine_steps()  # the engine's step count when the session last sent something
        while True:
            try:
                batch = self.batches.get(timeout=self.progress_interval)
            except queue.Empty:
                before, steps = steps, self.runtime.engine_steps()
                if steps != before and self._busy():
                    yield llm_session.progress_batch()  # its requests wait, but the engine is not stuck
                continue
            steps = self.runtime.engine_steps()
            if batch is None:
                self.ended.set()
                return
            reply = pb.SessionBatch()
            by_stream: dict[int, pb.StreamEvents] = {}
            for stream_id, item in batch:
                state = streams.get(stream_id)
                if state is None:
                    state = streams[stream_id] = _StreamState()
                if isinstance(item, BaseException):
                    events = [llm_session.error_event(item)]
                elif state.failed:
                    events = []  # the master has the stream's error already: the other choices end unseen
                else:
                    events = llm_session.output_events(
                        item, state.next_index[item.index], self.special_ids, self.token_text
                    )
                    state.next_index[item.index] += len(item.new_token_ids)
                if events:
                    stream_events = by_stream.get(stream_id)
                    if stream_events is None:
                        stream_events = by_stream[stream_id] = reply.streams.add(stream_id=stream_id)
                    stream_events.events.extend(events)
                if isinstance(item, BaseException):
                    self._done(stream_id, streams)
                    continue
                if item.finished:
                    state.num_finished += 1
                    if item.error and not state.failed and state.num_finished < item.num_choices:
                        self._abort_rest(stream_id)
                    state.failed = state.failed or bool(item.error)
                    if state.num_finished >= item.num_choices:
                        self._done(stream_id, streams)
            if reply.streams:
                yield reply

    def _busy(self) -> bool:
        """The session has requests not finished yet."""
        with self._lock:
            return bool(self._live)

    def _abort_rest(self, stream_id: int):
        """A choice failed and its Error ended the stream for the master: the other choices stop too."""
        with self._lock:
            stream = self._live.get(stream_id)
        if stream is not None:
            stream.abort()

    def _done(self, stream_id: int, streams: dict[int, _StreamState]):
        streams.pop(stream_id, None)
        with self._lock:
            self._live.pop(stream_id, None)
            idle = self._ending and not self._live
        if idle:
            self.batches.put(None)


def _answer(what: str, call):
    """call()'s result, or the error to answer with: the request's own fault as it is, anything else logged
    and answered without its text."""
    try:
        return call()
    except (errors.ServingError, ValueError) as err:
        return err
    except Exception:  # pylint: disable=broad-except
        log.exception(f"LLM {what} failed")
        return errors.SystemError_(f"the worker failed to {what}; see its log")


class LlmWorkerServicer(llm_worker_pb2_grpc.LlmWorkerServicer):
    def __init__(self, runtime, progress_interval: float = PROGRESS_INTERVAL_S):
        self.runtime = runtime
        self.progress_interval = progress_interval
        self._sessions: list[_Session] = []
        self._lock = threading.Lock()

    def Session(self, request_iterator, context):
        session = _Session(self.runtime, context.peer(), self.progress_interval)
        with self._lock:
            self._sessions.append(session)
        context.add_callback(session.close)  # cancelled or broken: abort its requests so KV blocks are freed
        threading.Thread(
            target=session.read, args=(request_iterator,), name="llm-session-commands", daemon=True
        ).start()
        try:
            yield from session.replies()
        finally:
            with self._lock:
                self._sessions.remove(session)

    def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeReply:
        return llm_session.tokenize_reply(
            _answer("tokenize", lambda: self.runtime.prompter.tokenize(llm_session.read_tokenize_request(request)))
        )

    def Detokenize(self, request: pb.DetokenizeRequest, context) -> pb.DetokenizeReply:
        return llm_session.detokenize_reply(
            _answer("detokenize", lambda: self.runtime.prompter.detokenize(list(request.token_ids)))
        )

    def end_sessions(self, timeout: float):
        """Ends every session once its running requests are done; waits at most `timeout` seconds in all."""
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.end()
        deadline = time.monotonic() + timeout
        for session in sessions:
            session.ended.wait(max(0.0, deadline - time.monotonic()))
