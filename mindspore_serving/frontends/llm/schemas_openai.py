"""Request bodies of OpenAI's `/v1/completions` and `/v1/chat/completions`, and how they become engine
parameters (`generation_params`). Unknown fields are refused with OpenAI's "Unrecognized request argument
supplied: <name>". vLLM's extra sampling fields (top_k, min_p, repetition_penalty, min_tokens, bad_words,
allowed_token_ids, prompt_logprobs, structured_outputs, guided_*, ...) are accepted.

Chat's `tools` go to the chat template (also with tool_choice "none", as vLLM); "required" or a named
function constrains the output to JSON calls (tool_calls.py), and an assistant's earlier tool_calls and the
tool messages answering them cross to the template as they are.

Refused: `suffix` (no served model has a fill-in-the-middle template), a stream with best_of > n (the best
choices are known only at the end), a stream with prompt_logprobs (as vLLM), top_logprobs without
logprobs=true, two output constraints at once (a forced tool_choice is one), tools or tool_choice that are
not OpenAI's shapes.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mindspore_serving.common.errors import InvalidParam
from mindspore_serving.frontends.llm.output_constraints import (
    GUIDED_FIELDS,
    Constraint,
    ResponseFormat,
    StructuredOutputs,
    one_constraint,
    request_constraints,
)
from mindspore_serving.frontends.llm.params import sampling_params, stop_list
from mindspore_serving.frontends.llm.tool_calls import check_tools, tool_choice_constraint
from mindspore_serving.llm.sampling_params import MAX_TOP_LOGPROBS
from mindspore_serving.master.llm_types import ChatMessage

UNKNOWN_FIELD = "Unrecognized request argument supplied: {name}"
MAX_STOP_SEQUENCES = 4
MAX_COMPLETION_LOGPROBS = 5
"""OpenAI's limit of /v1/completions' logprobs (chat's top_logprobs goes to 20)."""
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def _refuse(name: str, why: str = "is not supported by this server") -> InvalidParam:
    return InvalidParam(f"'{name}' {why}", name)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = None


class OpenAiRequest(BaseModel):
    """The fields both generation routes share; each maps to one SamplingParams field (`engine_params`)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    """Token id (as text) -> bias in [-100, 100]."""
    response_format: ResponseFormat | None = None
    user: str | None = None
    """Informational only."""
    # vLLM's extra sampling parameters
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    """Score the prompt: the reply holds vLLM's `prompt_logprobs` (not streamed)."""
    logprobs_mode: Literal["raw", "processed"] | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | bool | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    """Accepted and ignored: one grammar engine serves every constraint."""
    guided_whitespace_pattern: str | None = None
    """Accepted and ignored."""

    def check(self) -> None:
        """Refuses combinations the API does not allow; InvalidParam names the field."""
        if self.stream_options is not None and not self.stream:
            raise InvalidParam(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options"
            )
        if self.stream and self.prompt_logprobs is not None:
            raise InvalidParam("'prompt_logprobs' is not available when 'stream' is enabled", "prompt_logprobs")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options is not None and self.stream_options.include_usage)

    def constraints(self) -> list[Constraint]:
        """The output constraints the request names (output_constraints.py)."""
        guided = {name: getattr(self, name) for name, _ in GUIDED_FIELDS}
        return request_constraints(self.response_format, self.structured_outputs, guided)

    def engine_params(self, max_new_tokens: int | None, structured_output: dict | None = None, **route_params) -> dict:
        """The engine's sampling parameters: the fields the request set (None: the engine's default)."""
        return sampling_params(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias or None,
            seed=self.seed,
            stop=stop_list(self.stop, MAX_STOP_SEQUENCES),
            stop_token_ids=self.stop_token_ids,
            min_tokens=self.min_tokens,
            bad_words=self.bad_words or None,
            allowed_token_ids=self.allowed_token_ids or None,
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logprobs_mode=self.logprobs_mode,
            n=self.n,
            structured_output=structured_output,
            **route_params,
        )


class CompletionRequest(OpenAiRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0)
    """0 with echo: only the prompt, scored when logprobs is set (finish_reason "length")."""
    suffix: str | None = None
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    best_of: int | None = Field(None, ge=1)

    def check(self) -> None:
        super().check()
        if self.suffix:
            raise _refuse("suffix", "is not supported: this model has no fill-in-the-middle template")
        if self.stream and self.best_of is not None and self.best_of > (self.n or 1):
            raise InvalidParam(
                f"'best_of' greater than 'n' cannot be streamed (best_of={self.best_of}, "
                f"n={self.n or 1}): the best choices are known only at the end",
                "best_of",
            )

    def prompt_inputs(self) -> list[str | list[int]]:
        """The prompts: texts, or token ids (lm-evaluation-harness sends a batch of token-id prompts by
        default)."""
        prompt = self.prompt
        prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        for index, item in enumerate(prompts):
            where = "prompt" if len(prompts) == 1 else f"prompt.{index}"
            if not item:
                raise InvalidParam(f"'{where}' must not be empty", where)
            if isinstance(item, list) and any(t < 0 for t in item):
                raise InvalidParam(f"'{where}' token ids must be >= 0", where)
        return prompts

    def max_new_tokens(self) -> int:
        return COMPLETIONS_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def scores_prompt(self) -> bool:
        """echo with logprobs: the prompt's tokens come first in the logprobs, scored by the engine."""
        return bool(self.echo) and self.logprobs is not None

    def engine_prompt_logprobs(self) -> int | None:
        """The prompt scoring the engine does: vLLM's prompt_logprobs, and echo's logprobs alternatives."""
        wanted = [k for k in (self.prompt_logprobs, self.logprobs if self.scores_prompt else None) if k is not None]
        return max(wanted) if wanted else None

    def generation_params(self) -> dict:
        return self.engine_params(
            self.max_new_tokens(),
            one_constraint(self.constraints()),
            top_logprobs=self.logprobs or None,
            best_of=self.best_of,
            prompt_logprobs=self.engine_prompt_logprobs(),
        )


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessageIn(BaseModel):
    """A message of `messages`: a role and its content, an assistant's earlier tool calls, a tool's result.
    The fields the openai client writes back when a reply's message is resent (refusal, annotations, audio,
    function_call, all null) are accepted too."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None
    reasoning_content: str | None = None

    def text(self, index: int) -> str | None:
        if self.content is None or isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise _refuse(
                    f"messages.{index}.content", f"parts of type {part.type!r} are not supported; send text parts"
                )
            texts.append(part.text)
        return "".join(texts)

    def for_template(self, index: int) -> ChatMessage | dict[str, Any]:
        """A ChatMessage when the message is a role and a text; else a dict of its fields set (the chat
        template sees tool_calls, tool_call_id, name, ...)."""
        text = self.text(index)
        others = self.model_dump(exclude={"role", "content"}, exclude_none=True)
        if text is not None and not others:
            return ChatMessage(role=self.role, content=text)
        return {"role": self.role, "content": text, **others}


class ChatCompletionRequest(OpenAiRequest):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's: more variables for the chat template (e.g. enable_thinking)."""
    metadata: dict | None = None
    store: bool | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _max_tokens(self):
        if (
            self.max_completion_tokens is not None
            and self.max_tokens is not None
            and self.max_completion_tokens != self.max_tokens
        ):
            raise ValueError("give one of max_tokens and max_completion_tokens")
        return self

    def check(self) -> None:
        super().check()
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParam("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
        self.effective_tool_choice()

    def effective_tool_choice(self) -> str | dict[str, Any]:
        """ "none", "auto", "required" or the named function (tool_calls.check_tools: InvalidParam naming the
        field when tools or tool_choice are wrong)."""
        return check_tools(self.tools, self.tool_choice)

    def constraints(self) -> list[Constraint]:
        """The output constraints, a forced tool_choice's JSON ("required", a named function) among them."""
        found = super().constraints()
        forced = tool_choice_constraint(self.tools, self.effective_tool_choice(), self.parallel_tool_calls is not False)
        if forced is not None:
            found.append(("tool_choice", {"type": forced.type, "value": forced.value}))
        return found

    def chat_messages(self) -> list[ChatMessage | dict[str, Any]]:
        return [m.for_template(i) for i, m in enumerate(self.messages)]

    def max_new_tokens(self) -> int | None:
        """None leaves the engine's default (OpenAI's "as many as fit" needs the prompt's length)."""
        return self.max_completion_tokens or self.max_tokens

    def generation_params(self) -> dict:
        top_logprobs = self.top_logprobs if self.logprobs else None
        return self.engine_params(
            self.max_new_tokens(),
            one_constraint(self.constraints()),
            top_logprobs=top_logprobs or None,
            prompt_logprobs=self.prompt_logprobs,
        )
