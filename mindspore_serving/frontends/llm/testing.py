"""A fake LlmBackend for tests of the HTTP front ends (no engine, no worker).

It answers every prompt with the same scripted pieces of text (one token each), honours max_new_tokens,
stop strings and ignore_eos, validates parameters as the engine does, and can be told to fail before the
first token, fail after n tokens, finish with a given reason, end without its FinalEvent, or stall after
n tokens until it is cancelled. Like the engine, it generates best_of (else n) choices, their tokens
interleaved, each ending with its own FinalEvent: choice c > 0 answers the script with its first piece
suffixed by c ("Hello1, world!"), and `choice_bias[c]` is added to each of its tokens' log-probabilities
(so best_of's pick can be steered). top_logprobs gives each token itself as the most likely alternative,
then fake ones (" alt0", " alt1", ...); prompt_logprobs sends a PromptEvent first, scoring the prompt's
words. `outcomes[request_id]` records how each stream ended: "finished",
"failed", "cancelled" (the consumer's task was cancelled) or "closed" (the iterator was closed early).
"""

import asyncio
import re
import threading
from collections.abc import Callable, Sequence

import orjson

from mindspore_serving.common import errors
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.master.llm_types import (
    FinalEvent,
    GenerationRequest,
    ModelInfo,
    PromptEvent,
    PromptToken,
    Timing,
    TokenEvent,
    Tokenized,
    TokenizeRequest,
    TopLogprob,
)

EOS_TOKEN_ID = 2
EOS_TEXT = "</s>"
FIRST_TOKEN_ID = 10
ALT_TOKEN_ID = 90
"""The fake alternatives' ids: ALT_TOKEN_ID + j is " alt{j}"."""
PROMPT_LOGPROB = -1.0
"""The log-probability of every prompt token after the first."""
TIMING = Timing(queue_time=0.001, time_to_first_token=0.002, inter_token_latency=0.0005, e2e_latency=0.004)
DEFAULT_MODEL = ModelInfo(name="llama_tiny", max_model_len=128, max_num_seqs=4, max_queue_size=8, vocab_size=100)


def render_chat(messages, add_generation_prompt: bool = True) -> str:
    """The fake's chat template (messages: objects with role and content, or dicts)."""
    messages = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return text + "<|assistant|>\n" if add_generation_prompt else text


def fake_token_ids(text: str, add_special_tokens: bool) -> list[int]:
    """The fake's tokenizer: one id per word (FIRST_TOKEN_ID + its length), BOS (1) first when asked."""
    return ([1] if add_special_tokens else []) + [FIRST_TOKEN_ID + len(word) for word in text.split()]


def logprob_of(position: int) -> float:
    return -0.25 * (position + 1)


def alternatives(token_id: int, text: str, logprob: float, count: int) -> list[TopLogprob]:
    """The fake's most likely tokens at a position: the token itself, then " alt0", " alt1", ..."""
    if count == 0:
        return []
    return [TopLogprob(token_id, text, logprob)] + [
        TopLogprob(ALT_TOKEN_ID + j, f" alt{j}", logprob - 1.0 - j) for j in range(count - 1)
    ]


def prompt_pieces(request: GenerationRequest) -> list[tuple[int, str]]:
    """The fake's prompt tokens (id, text): one per word of a text prompt (the spaces around it included, so
    the texts make the prompt again), or the ids of a token-id prompt with their texts as `detokenize` gives
    them ("t5", " t7", ...)."""
    if request.prompt_token_ids is not None:
        return [(i, ("" if n == 0 else " ") + f"t{i}") for n, i in enumerate(request.prompt_token_ids)]
    prompt = render_chat(request.messages) if request.messages is not None else request.prompt
    return [(FIRST_TOKEN_ID + len(piece.strip()), piece) for piece in re.findall(r"\s*\S+(?:\s+$)?", prompt)]


def prompt_scores(pieces: list[tuple[int, str]], count: int) -> PromptEvent:
    """The fake's scored prompt: every token after the first has PROMPT_LOGPROB, " alt0" (-0.5) is likelier and
    the token itself is second among the alternatives."""
    tokens = []
    for position, (token_id, piece) in enumerate(pieces):
        if position == 0:
            tokens.append(PromptToken(token_id, piece, None))
            continue
        alts = [TopLogprob(ALT_TOKEN_ID, " alt0", -0.5), TopLogprob(token_id, piece, PROMPT_LOGPROB)]
        alts += [TopLogprob(ALT_TOKEN_ID + j, f" alt{j}", PROMPT_LOGPROB - j) for j in range(1, count - 1)]
        tokens.append(PromptToken(token_id, piece, PROMPT_LOGPROB, alts[:count]))
    return PromptEvent(tokens)


class FakeLlmBackend:
    def __init__(self, models: Sequence[ModelInfo] | None = None, reply: Sequence[str] = ("Hello", ",", " world", "!")):
        self.served: list[ModelInfo] = list(models) if models is not None else [DEFAULT_MODEL]
        self.down: dict[str, str] = {}
        """Models served but down for now (name -> why), as a master whose worker is restarting reports them."""
        self.reply = list(reply)
        self.requests: list[GenerationRequest] = []
        self.tokenize_requests: list[TokenizeRequest] = []
        self.outcomes: dict[str, str] = {}
        self.fail_before: BaseException | None = None
        self.fail_after: tuple[int, BaseException] | None = None
        self.finish_reason: str | None = None
        self.omit_final = False
        self.stall_after: int | None = None
        self.choice_bias: dict[int, float] = {}
        """Added to every token log-probability of a choice (by choice index)."""
        self.stalled = threading.Event()
        """Set when a stream stalls; a test in another thread can wait on it."""
        self.on_stall: Callable[[], None] | None = None
        """Called (in the event loop) when a stream stalls."""

    def models(self) -> list[ModelInfo]:
        return list(self.served)

    def unavailable_models(self) -> dict[str, str]:
        return dict(self.down)

    def stream(self, request: GenerationRequest):
        return self._stream(request)

    async def tokenize(self, request: TokenizeRequest) -> Tokenized:
        self.tokenize_requests.append(request)
        if self.fail_before is not None:
            raise self.fail_before
        chat = request.messages is not None
        text = render_chat(request.messages, request.add_generation_prompt) if chat else request.prompt
        special = request.add_special_tokens if request.add_special_tokens is not None else not chat
        ids = fake_token_ids(text, special)
        return Tokenized(ids, text, [f"t{i}" for i in ids] if request.return_token_strs else None)

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        if self.fail_before is not None:
            raise self.fail_before
        vocab = next(m.vocab_size for m in self.served if m.name == model)
        for token_id in token_ids:
            if token_id >= vocab:
                raise errors.InvalidInputs(f"token id {token_id} is not in this model's vocabulary [0, {vocab})")
        return " ".join(f"t{i}" for i in token_ids)

    def _script(self, params: SamplingParams, choice: int = 0) -> tuple[list[tuple[int, str, bool, str]], str]:
        """(token id, text it adds, special, its own text) of each token of a choice, and its finish reason,
        stop strings applied."""
        reply = list(self.reply)
        if choice:
            reply[0] += str(choice)
        tokens, text, finish = [], "", "length"
        while len(tokens) < params.max_new_tokens:
            position = len(tokens)
            if position >= len(reply) and not params.ignore_eos:
                tokens.append((EOS_TOKEN_ID, "", True, EOS_TEXT))
                finish = "eos"
                break
            token_id, piece = FIRST_TOKEN_ID + position % len(reply), reply[position % len(reply)]
            stop_at = min((i for i in ((text + piece).find(s) for s in params.stop) if i >= 0), default=-1)
            if stop_at >= 0:
                tokens.append((token_id, (text + piece)[:stop_at][len(text) :], False, piece))
                finish = "stop"
                break
            tokens.append((token_id, piece, False, piece))
            text += piece
        return tokens, finish

    def _token(
        self, params: SamplingParams, choice: int, position: int, token: tuple[int, str, bool, str]
    ) -> TokenEvent:
        token_id, piece, special, alone = token
        logprob = logprob_of(position) + self.choice_bias.get(choice, 0.0)
        return TokenEvent(
            token_id,
            piece,
            logprob,
            special,
            position,
            alternatives(token_id, alone, logprob, params.top_logprobs),
            choice,
        )

    def _final(
        self, params: SamplingParams, prompt: str, choice: int, tokens: list[tuple[int, str, bool, str]], finish: str
    ) -> FinalEvent:
        cumulative = sum(self._token(params, choice, p, t).logprob for p, t in enumerate(tokens))
        return FinalEvent(
            text="".join(t[1] for t in tokens),
            token_ids=[t[0] for t in tokens],
            finish_reason=self.finish_reason or finish,
            prompt_tokens=max(len(prompt.split()), 1),
            completion_tokens=len(tokens),
            timing=TIMING,
            prompt=prompt,
            choice=choice,
            cumulative_logprob=cumulative,
        )

    async def _stream(self, request: GenerationRequest):
        self.requests.append(request)
        if request.model not in {m.name for m in self.served}:
            raise errors.ServableUnavailable(f"Model {request.model} is not a language model")
        if self.fail_before is not None:
            raise self.fail_before
        params = SamplingParams.from_dict(request.params)
        pieces = prompt_pieces(request)
        prompt = "".join(text for _, text in pieces)
        outcome = "closed"
        try:
            if params.prompt_logprobs is not None:
                yield prompt_scores(pieces, params.prompt_logprobs)
            scripts = [self._script(params, choice) for choice in range(params.num_choices)]
            rounds = max(len(tokens) for tokens, _ in scripts)
            unfinished = len(scripts)
            for position in range(rounds + 1):
                if self.fail_after is not None and position == self.fail_after[0]:
                    raise self.fail_after[1]
                if self.stall_after is not None and position == self.stall_after and position < rounds:
                    self.stalled.set()
                    if self.on_stall is not None:
                        self.on_stall()
                    await asyncio.Event().wait()
                for choice, (tokens, finish) in enumerate(scripts):
                    if position < len(tokens):
                        yield self._token(params, choice, position, tokens[position])
                    elif position == len(tokens):
                        unfinished -= 1
                        if not unfinished:
                            outcome = "finished"  # the consumer may close the iterator once it has the last final
                        if not self.omit_final:
                            yield self._final(params, prompt, choice, tokens, finish)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except GeneratorExit:
            if outcome != "finished":
                outcome = "closed"
            raise
        except Exception:
            outcome = "failed"
            raise
        finally:
            self.outcomes[request.request_id] = outcome


class ScriptedLlmBackend(FakeLlmBackend):
    """Answers every request with the same `events` (its parameters checked as the engine checks them)."""

    def __init__(self, events):
        super().__init__()
        self.events = events

    async def _stream(self, request):
        self.requests.append(request)
        SamplingParams.from_dict(request.params)
        for event in self.events:
            yield event


def parse_sse(body: str) -> list[object]:
    """The data of each event of an SSE body, JSON-decoded ("[DONE]" kept as text); raises AssertionError when
    the body is not well-formed: every block ends with an empty line and holds only `data: <one JSON line>`,
    `retry: <ms>` or `: comment` lines."""
    assert body.endswith("\n\n"), f"the stream does not end with an empty line: {body[-40:]!r}"
    events = []
    for block in body[:-2].split("\n\n"):
        data = []
        for line in block.split("\n"):
            assert line, f"empty line inside an event block: {block!r}"
            if line.startswith(":"):
                continue
            field, sep, value = line.partition(": ")
            assert sep, f"not an SSE field line: {line!r}"
            if field == "retry":
                assert value.isdigit(), line
            else:
                assert field == "data", f"unexpected SSE field: {line!r}"
                data.append(value)
        assert len(data) <= 1, f"one data line per event expected: {block!r}"
        if data:
            events.append(data[0] if data[0] == "[DONE]" else orjson.loads(data[0]))
    return events


async def call_asgi(
    app,
    path: str,
    body: bytes,
    disconnect_after_chunks: int | None = None,
    disconnect: asyncio.Event | None = None,
    method: str = "POST",
) -> tuple[int | None, list[bytes]]:
    """Calls an ASGI app as a server would (ASGI spec 2.4) and returns (status or None, body chunks). The
    client disconnects once `disconnect_after_chunks` non-empty body chunks came (0: right after sending the
    request), or when `disconnect` is set (e.g. from FakeLlmBackend.on_stall)."""
    disconnect = disconnect or asyncio.Event()
    state = {"sent": False, "status": None}
    chunks: list[bytes] = []
    if disconnect_after_chunks == 0:
        disconnect.set()

    async def receive():
        if not state["sent"]:
            state["sent"] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            state["status"] = message["status"]
        elif message["type"] == "http.response.body":
            if message.get("body"):
                chunks.append(message["body"])
            if not message.get("more_body", False):
                disconnect.set()
            elif disconnect_after_chunks is not None and len(chunks) >= disconnect_after_chunks:
                disconnect.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    return state["status"], chunks
