"""The in-process LLM engine: validation, tokenization and incremental detokenization around an `EngineCore`.

    engine = LLMEngine(runner, tokenizer, SchedulerConfig.for_runner(runner, max_num_seqs=32))
    request_id = engine.add_request("Hello", SamplingParams(max_new_tokens=20, temperature=0))
    while engine.has_unfinished():
        for out in engine.step():          # one RequestOutput per request that changed this step
            print(out.request_id, repr(out.new_text), out.finished, out.finish_reason)

Every added request gets exactly one output with `finished=True` (also when aborted or failed) per choice:
a request with several choices (SamplingParams n / best_of) computes its prompt once and forks into them
(llm/choices.py); each output names its choice (`index`) and the request is over once all have finished.
best_of choices are all reported, with their cumulative logprobs: ranking them is the front end's.
`add_request` rejects bad input with `InvalidRequestError` (a ValueError) and the engine keeps
serving every other request. Not thread-safe: call it from one thread (a serving loop owns it).
"""

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import numpy as np

from mindspore_serving.common.errors import Kind
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.detokenizer import IncrementalDetokenizer
from mindspore_serving.llm.engine_core import EngineCore, EngineCoreOutput, StepListener, StepStats
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.logits_processors import TokenSequences, bad_words_token_ids
from mindspore_serving.llm.model_io import ModelRunner
from mindspore_serving.llm.prompt_scores import PromptScores, score_refusal
from mindspore_serving.llm.request import EosIds, FinishReason, Request, RequestStatus, eos_ids
from mindspore_serving.llm.sampler import Sampler
from mindspore_serving.llm.sampling_params import SamplingParams, StructuredOutput
from mindspore_serving.llm.structured_output import GrammarCompiler, GrammarState

PromptIds = Sequence[int]


class EncodedPrompt(NamedTuple):
    """A prompt tokenized already (a chat after its template): the model gets `token_ids`, outputs report
    `text`."""

    text: str
    token_ids: PromptIds


@dataclass
class RequestMetrics:
    """Timestamps (engine clock, seconds) of one request, for TTFT / ITL / E2E metrics."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    last_token_time: float | None
    finished_time: float | None
    num_preemptions: int
    num_cached_tokens: int
    """Prompt tokens found in the prefix cache at the last admission."""

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass
class RequestOutput:
    """One step's news about one request, plus everything it has produced so far."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    new_token_ids: list[int]
    new_text: str
    token_ids: list[int]
    """All output token ids so far (including a final EOS or stop token)."""
    text: str
    """All output text streamed so far (cut before a stop string). When finished, the whole text."""
    finished: bool
    finish_reason: FinishReason | None
    new_token_texts: list[str] = field(default_factory=list)
    """The text of each new token (they join to `new_text`; a token may have none yet, e.g. half a UTF-8
    character, whose text then comes with a later token)."""
    new_logprobs: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    new_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    metrics: RequestMetrics | None = None
    error: str | None = None
    error_kind: Kind = Kind.GENERATION
    """What kind of failure `error` is (common/errors.py): a lost agent is unavailable, not a model failure."""
    index: int = 0
    """Which of the request's choices (SamplingParams n / best_of) this output is about; `finished` is that
    choice's, and the request is over once every choice has finished."""
    cumulative_logprob: float = 0.0
    """Sum of the logprobs of the choice's tokens so far."""
    prompt_logprobs: list[float | None] | None = None
    """SamplingParams.prompt_logprobs: log P(prompt token i | tokens before it), None for the first token; set on
    the request's first output only."""
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None
    """With prompt_logprobs: each prompt position's most likely (token id, logprob), most likely first."""
    num_choices: int = 1
    """The request's choices: it is over once this many of its outputs (one per choice) have `finished`."""


class _Group:
    """A live request as added: its id and how many of its choices have not finished."""

    def __init__(self, request_id: str, num_choices: int) -> None:
        self.request_id = request_id
        self.num_choices = num_choices
        self.num_open = num_choices


class _Tracked:
    """What the engine keeps per live choice besides the core's Request."""

    def __init__(self, request: Request, detokenizer: IncrementalDetokenizer | None, group: _Group) -> None:
        self.request = request
        self.detokenizer = detokenizer
        self.group = group
        self.text = ""
        self.logprobs: list[float] = []
        self.cumulative_logprob = 0.0


class LLMEngine:
    """Generates text for many requests at once with continuous batching over a paged KV cache."""

    def __init__(
        self,
        model_runner: ModelRunner,
        tokenizer: Any = None,
        scheduler_config: SchedulerConfig | None = None,
        *,
        eos_token_id: EosIds = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`tokenizer`: a `tokenizers.Tokenizer` or any object with encode(text) (-> ids or an object with
        .ids) and decode(ids); None serves token ids only. `eos_token_id`: the id, or the ids (a request stops
        on any of them), that end a generation; default the tokenizer's `eos_token_id` if it has one.
        `seed`: the generator shared by requests without their own seed."""
        config = scheduler_config or SchedulerConfig.for_runner(model_runner)
        self.core = EngineCore(model_runner, config, Sampler(seed), clock)
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = int(model_runner.vocab_size)
        self.eos_token_ids = eos_ids(
            eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        )
        self._clock = clock
        self._tracked: dict[str, _Tracked] = {}
        """Live choices by their Request's id (a forked choice's id is its parent's with '#<choice>')."""
        self._groups: dict[str, _Group] = {}
        """Live requests by the id they were added with."""
        self._ids = itertools.count()
        self._grammars: GrammarCompiler | None = None
        """Structured output's compiler, built from the tokenizer at the first request that has one."""
        self._score_refusal = score_refusal(model_runner)
        """Why requests for prompt logprobs are refused (None: they are served)."""

    # --- requests -----------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | None = None,
        params: SamplingParams | dict | None = None,
        request_id: str | None = None,
        *,
        prompt_token_ids: PromptIds | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Queues a request (text `prompt`, or `prompt_token_ids`, or both: the ids of a text tokenized already,
        such as a chat's after its template) and returns its id.
        Raises InvalidRequestError, leaving the engine unchanged, when the input is not acceptable."""
        params = self._check_params(params)
        request_id = self._check_request_id(request_id)
        token_ids = self._prompt_ids(prompt, prompt_token_ids)
        self._check_lengths(len(token_ids), params)
        grammar = self._new_grammar(params.structured_output)
        request = Request(
            request_id,
            token_ids,
            params,
            arrival_time=self._clock() if arrival_time is None else arrival_time,
            eos_token_id=self.eos_token_ids,
            prompt=prompt,
        )
        request.grammar = grammar
        request.bad_words_ids = self._bad_words_ids(params)
        if params.prompt_logprobs is not None:
            request.prompt_scores = PromptScores(token_ids, params.prompt_logprobs)
        self.core.add_request(request)
        group = self._groups[request_id] = _Group(request_id, params.num_choices)
        self._track(request, group)
        return request_id

    def _track(self, request: Request, group: _Group) -> None:
        """Starts the engine's bookkeeping of one choice (a request added, or a choice forked off it)."""
        detokenizer = None
        if self.tokenizer is not None:
            params = request.sampling_params
            detokenizer = IncrementalDetokenizer(
                self.tokenizer,
                request.prompt_token_ids,
                params.stop,
                params.include_stop_str_in_output,
                params.skip_special_tokens,
            )
        self._tracked[request.request_id] = _Tracked(request, detokenizer, group)

    def abort(self, request_id: str) -> bool:
        """Stops a request in any state, with all its choices, and frees its KV blocks now; the next `step()`
        returns the final output (reason "abort") of each unfinished choice. False when the id is unknown or the
        request already finished."""
        return self.core.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    @property
    def clock(self) -> Callable[[], float]:
        """The clock of request timestamps (arrival_time and the metrics)."""
        return self._clock

    @property
    def num_unfinished(self) -> int:
        """Requests added and not over (a request is over when all its choices have finished)."""
        return len(self._groups)

    @property
    def stats(self) -> StepStats | None:
        """Statistics of the last step."""
        return self.core.last_stats

    def add_step_listener(self, listener: StepListener) -> None:
        self.core.add_step_listener(listener)

    # --- stepping -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One model step for the current batch; an output for each choice that got tokens or finished."""
        core_outputs = self.core.step()
        forked = {request.request_id: request for request in self.core.take_forked()}
        outputs = []
        for out in core_outputs:
            child = forked.pop(out.request_id, None)
            if child is not None:
                # NOTE: registered at its first output, after the outputs before it: an aborted request whose id
                # it reuses (its final output comes first) has left the books by then.
                self._track(child, self._groups[child.group_id])
            outputs.extend(self._to_outputs(out))
        return outputs

    def generate(
        self,
        prompts: str | PromptIds | Sequence[str | PromptIds],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Runs the prompts to completion and returns their final outputs, in order. A single prompt
        (text or token ids) gives a list of one. A prompt with several choices (n / best_of) gives the final
        output of each choice, in choice order (RequestOutput.index), where one with a single choice gives one.
        Needs an idle engine (outputs of others would be lost)."""
        if self.has_unfinished():
            raise RuntimeError("generate() needs an idle engine; drive it with step() while requests are in flight")
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], (int, np.integer)))
        # one prompt (text, or token ids) is a batch of one
        batch = [cast(str | PromptIds, prompts)] if single else cast(Sequence[str | PromptIds], prompts)
        per_prompt: Sequence[SamplingParams | dict | None] = (
            [params] * len(batch) if params is None or isinstance(params, (SamplingParams, dict)) else params
        )
        if len(per_prompt) != len(batch):
            raise InvalidRequestError(f"generate() got {len(batch)} prompts but {len(per_prompt)} SamplingParams")
        ids = []
        try:
            for prompt, p in zip(batch, per_prompt):
                if isinstance(prompt, str):
                    ids.append(self.add_request(prompt, p))
                else:
                    ids.append(self.add_request(None, p, prompt_token_ids=prompt))
        except InvalidRequestError:
            for request_id in ids:
                self.abort(request_id)
            while self.has_unfinished():
                self.step()
            raise
        final: dict[str, dict[int, RequestOutput]] = {request_id: {} for request_id in ids}
        while self.has_unfinished():
            for out in self.step():
                if out.finished:
                    final[out.request_id][out.index] = out
        return [final[request_id][index] for request_id in ids for index in sorted(final[request_id])]

    # --- internals ----------------------------------------------------------------------------
    def _to_outputs(self, out: EngineCoreOutput) -> list[RequestOutput]:
        """The output of one choice; when a request finishes before it forked (aborted, failed), also the final
        outputs of the choices it never forked, with the same reason."""
        tracked = self._tracked[out.request_id]
        group, request = tracked.group, tracked.request
        output = self._to_output(out)
        outputs = [output]
        if output.finished:
            unforked = request.num_pending_choices
            request.num_pending_choices = 0
            for choice in range(request.choice + 1, request.choice + 1 + unforked):
                outputs.append(
                    RequestOutput(
                        request_id=group.request_id,
                        prompt=request.prompt,
                        prompt_token_ids=list(request.prompt_token_ids),
                        new_token_ids=[],
                        new_text="",
                        token_ids=[],
                        text="",
                        finished=True,
                        finish_reason=output.finish_reason,
                        metrics=output.metrics,
                        error=output.error,
                        error_kind=output.error_kind,
                        index=choice,
                        num_choices=group.num_choices,
                    )
                )
            group.num_open -= 1 + unforked
            if group.num_open <= 0:
                del self._groups[group.request_id]
        return outputs

    def _to_output(self, out: EngineCoreOutput) -> RequestOutput:
        tracked = self._tracked[out.request_id]
        request = tracked.request
        finished, reason = out.finished, out.finish_reason
        texts = [""] * len(out.new_token_ids)  # each new token's text (several tokens: multi-step, speculative)
        tail = ""
        detok = tracked.detokenizer
        if detok is not None:
            for i, token in enumerate(out.new_token_ids):
                update = detok.update([token])
                texts[i] = update.new_text
                if update.stop_string is not None:
                    finished, reason = True, FinishReason.STOP
                    self._finish_for_stop_string(request)
                    out = _cut(out, i + 1, request)
                    texts = texts[: i + 1]
                    break
            if finished:
                tail = detok.flush()
                if detok.stop_string is not None and reason in (FinishReason.LENGTH, FinishReason.STOP):
                    reason = FinishReason.STOP
                    self._finish_for_stop_string(request)
        if texts:
            texts[-1] += tail
        new_text = "".join(texts) or tail
        tracked.text += new_text
        tracked.logprobs.extend(out.new_logprobs)
        tracked.cumulative_logprob += float(sum(out.new_logprobs))
        if finished:
            del self._tracked[out.request_id]
        scores, request.prompt_scores = request.prompt_scores, None  # on the first output only
        if scores is not None and not scores.complete:
            scores = None  # it finished before its prompt was computed (aborted, failed)
        return RequestOutput(
            request_id=tracked.group.request_id,
            prompt=request.prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            new_token_ids=list(out.new_token_ids),
            new_text=new_text,
            new_token_texts=texts,
            token_ids=list(request.output_token_ids),
            text=tracked.text,
            finished=finished,
            finish_reason=reason,
            new_logprobs=list(out.new_logprobs),
            logprobs=list(tracked.logprobs),
            new_top_logprobs=list(out.new_top_logprobs),
            metrics=_metrics(request),
            error=out.error,
            error_kind=out.error_kind,
            index=request.choice,
            cumulative_logprob=tracked.cumulative_logprob,
            num_choices=tracked.group.num_choices,
            prompt_logprobs=None if scores is None else scores.logprobs(),
            prompt_top_logprobs=None if scores is None else scores.top_logprobs(),
        )

    def _finish_for_stop_string(self, request: Request) -> None:
        if not request.finished:
            self.core.finish_request(request.request_id, RequestStatus.FINISHED_STOP)
        elif request.status is RequestStatus.FINISHED_LENGTH:
            request.set_status(RequestStatus.FINISHED_STOP)

    def _check_params(self, params: object) -> SamplingParams:
        if params is None:
            params = SamplingParams()
        elif isinstance(params, dict):
            params = SamplingParams.from_dict(params)
        elif not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"params must be SamplingParams, a dict or None, got {type(params).__name__}")
        bad = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise InvalidRequestError(f"stop_token_ids {bad} are outside the vocabulary [0, {self.vocab_size})")
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError(
                "stop strings need a tokenizer; this engine serves token ids only (use stop_token_ids)"
            )
        if params.prompt_logprobs is not None and self._score_refusal is not None:
            raise InvalidRequestError(f"prompt_logprobs cannot be served by this model: {self._score_refusal}")
        if params.num_choices > self.config.max_num_seqs:
            raise InvalidRequestError(
                f"{params.num_choices} choices (n / best_of) run as {params.num_choices} "
                f"sequences, more than this engine runs at once (max_num_seqs "
                f"{self.config.max_num_seqs}); ask for at most {self.config.max_num_seqs}"
            )
        for name, ids in (
            ("logit_bias", [t for t, _ in params.logit_bias]),
            ("allowed_token_ids", params.allowed_token_ids),
        ):
            bad = sorted({t for t in ids if t >= self.vocab_size})
            if bad:
                raise InvalidRequestError(
                    f"{name} names token ids {bad[:8]} outside the vocabulary [0, {self.vocab_size})"
                )
        if params.bad_words and self.tokenizer is None:
            raise InvalidRequestError(
                "bad_words need a tokenizer; this engine serves token ids only (use logit_bias or allowed_token_ids)"
            )
        return params

    def _bad_words_ids(self, params: SamplingParams) -> TokenSequences:
        """The token sequences of the request's bad words, by this engine's tokenizer (no special tokens)."""
        if not params.bad_words:
            return ()
        return bad_words_token_ids(self._encode_without_special_tokens, params.bad_words)

    def _encode_without_special_tokens(self, text: str) -> list[int]:
        encoded = self.tokenizer.encode(text, add_special_tokens=False)
        return list(getattr(encoded, "ids", encoded))

    def _new_grammar(self, spec: StructuredOutput | None) -> GrammarState | None:
        """The grammar state of a new request's structured output (None: none); InvalidRequestError when it does
        not compile or this engine cannot constrain its output."""
        if spec is None:
            return None
        if self._grammars is None:
            if self.tokenizer is None:
                raise InvalidRequestError(
                    "structured output needs the model's tokenizer; this engine serves token ids only"
                )
            self._grammars = GrammarCompiler.for_tokenizer(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self._grammars.new_matcher(spec)

    def _check_request_id(self, request_id: str | None) -> str:
        if request_id is None:
            request_id = str(next(self._ids))
            while self._id_in_use(request_id):
                request_id = str(next(self._ids))
            return request_id
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError(f"request_id must be a non-empty string, got {request_id!r}")
        if self._id_in_use(request_id):
            raise InvalidRequestError(f"request_id {request_id!r} is already in use by an unfinished request")
        return request_id

    def _id_in_use(self, request_id: str) -> bool:
        """An unfinished request's id, or one of its choices' (llm/choices.py)."""
        return (
            request_id in self._groups or request_id in self._tracked or self.core.get_request(request_id) is not None
        )

    def _prompt_ids(self, prompt: str | None, prompt_token_ids: PromptIds | None) -> list[int]:
        if prompt is None and prompt_token_ids is None:
            raise InvalidRequestError("give a prompt (text) or prompt_token_ids")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise InvalidRequestError(f"prompt must be a string, got {type(prompt).__name__}")
            if not prompt:
                raise InvalidRequestError("prompt is empty; send at least one character")
        if prompt is not None and prompt_token_ids is None:
            if self.tokenizer is None:
                raise InvalidRequestError("this engine has no tokenizer; send prompt_token_ids instead of text")
            char_limit = self.config.max_prompt_chars or 32 * self.config.max_model_len
            if len(prompt) > char_limit:
                raise InvalidRequestError(
                    f"prompt has {len(prompt)} characters, more than this model takes "
                    f"({char_limit}, engine.max_prompt_chars in the LLM config); shorten the "
                    f"prompt"
                )
            encoded = self.tokenizer.encode(prompt)
            token_ids = list(getattr(encoded, "ids", encoded))
            if not token_ids:
                raise InvalidRequestError(f"prompt {prompt[:40]!r} encodes to no tokens")
            return [int(t) for t in token_ids]
        if isinstance(prompt_token_ids, (str, bytes)) or not hasattr(prompt_token_ids, "__len__"):
            raise InvalidRequestError(f"prompt_token_ids must be a list of ints, got {type(prompt_token_ids).__name__}")
        assert prompt_token_ids is not None  # neither a prompt nor ids was refused above
        if len(prompt_token_ids) == 0:
            raise InvalidRequestError("prompt_token_ids is empty; send at least one token")
        if len(prompt_token_ids) >= self.config.max_model_len:  # refused before its ids are looked at one by one
            self._check_lengths(len(prompt_token_ids), SamplingParams())
        token_ids = []
        for t in prompt_token_ids:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < self.vocab_size:
                raise InvalidRequestError(f"prompt_token_ids must hold ints in [0, {self.vocab_size}), got {t!r}")
            token_ids.append(int(t))
        return token_ids

    def _check_lengths(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        limit = self.config.max_model_len
        if num_prompt_tokens >= limit:
            raise InvalidRequestError(
                f"prompt has {num_prompt_tokens} tokens, but max_model_len is {limit} (prompt + new tokens); "
                f"shorten the prompt to at most {limit - 1} tokens"
            )
        if num_prompt_tokens + params.max_new_tokens > limit:
            raise InvalidRequestError(
                f"prompt has {num_prompt_tokens} tokens and max_new_tokens is {params.max_new_tokens}, together "
                f"{num_prompt_tokens + params.max_new_tokens} > max_model_len {limit}; lower max_new_tokens to "
                f"at most {limit - num_prompt_tokens} or shorten the prompt"
            )


def _cut(out: EngineCoreOutput, count: int, request: Request) -> EngineCoreOutput:
    """`out` with only its first `count` new tokens, the request's output without the others: a stop string ended
    it at a token followed by more of the same step (accepted proposed tokens), which it never generates."""
    extra = len(out.new_token_ids) - count
    if extra <= 0:
        return out
    request.pop_output_tokens(extra)
    return dataclasses.replace(
        out,
        new_token_ids=out.new_token_ids[:count],
        new_logprobs=out.new_logprobs[:count],
        new_top_logprobs=out.new_top_logprobs[:count],
    )


def _metrics(request: Request) -> RequestMetrics:
    return RequestMetrics(
        request.arrival_time,
        request.first_scheduled_time,
        request.first_token_time,
        request.last_token_time,
        request.finished_time,
        request.num_preemptions,
        request.num_cached_prompt_tokens,
    )
