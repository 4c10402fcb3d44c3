"""Request bodies of OpenAI's `/v1/completions` and `/v1/chat/completions`, and how they become engine
parameters. Unknown fields are refused with OpenAI's "Unrecognized request argument supplied: <name>";
known options the engine cannot honour are refused by name unless they hold their neutral value.
vLLM's extra sampling fields (top_k, repetition_penalty, ignore_eos, stop_token_ids, ...) are accepted.
"""
from typing import Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mindspore_serving.master.llm_types import ChatMessage
from mindspore_serving.common.errors import InvalidParam
from mindspore_serving.frontends.llm.params import sampling_params, stop_list

UNKNOWN_FIELD = "Unrecognized request argument supplied: {name}"
MAX_STOP_SEQUENCES = 4
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def _refuse(name: str, why: str = "is not supported by this server") -> InvalidParam:
    return InvalidParam(f"'{name}' {why}", name)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Optional[bool] = None


class OpenAiRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    n: Optional[int] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, List[str]]] = None
    seed: Optional[int] = None
    presence_penalty: Optional[float] = Field(None, ge=-2, le=2)
    frequency_penalty: Optional[float] = Field(None, ge=-2, le=2)
    logit_bias: Optional[Dict[str, float]] = None
    user: Optional[str] = None
    """Informational only."""
    # vLLM's extra sampling parameters
    top_k: Optional[int] = None
    repetition_penalty: Optional[float] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[List[int]] = None
    skip_special_tokens: Optional[bool] = None
    include_stop_str_in_output: Optional[bool] = None

    def check(self) -> None:
        """Refuses what the engine cannot do; InvalidParam names the field."""
        if self.n not in (None, 1):
            raise _refuse("n", f"must be 1: this server generates one choice per request, got {self.n}")
        if self.stream_options is not None and not self.stream:
            raise InvalidParam("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                               "stream_options")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise _refuse(name, "other than 0 is not supported by this server; use repetition_penalty")
        if self.logit_bias:
            raise _refuse("logit_bias")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options is not None and self.stream_options.include_usage)

    def engine_params(self, max_new_tokens: Optional[int]) -> dict:
        return sampling_params(max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                               top_k=self.top_k, repetition_penalty=self.repetition_penalty, seed=self.seed,
                               stop=stop_list(self.stop, MAX_STOP_SEQUENCES), stop_token_ids=self.stop_token_ids,
                               ignore_eos=self.ignore_eos, skip_special_tokens=self.skip_special_tokens,
                               include_stop_str_in_output=self.include_stop_str_in_output)


class CompletionRequest(OpenAiRequest):
    prompt: Union[str, List[str], List[int], List[List[int]]]
    suffix: Optional[str] = None
    echo: Optional[bool] = False
    logprobs: Optional[int] = Field(None, ge=0, le=5)
    best_of: Optional[int] = None

    def check(self) -> None:
        super().check()
        if self.suffix:
            raise _refuse("suffix")
        if self.best_of not in (None, 1):
            raise _refuse("best_of", f"must be 1: this server generates one choice per request, got {self.best_of}")
        if self.logprobs:
            raise _refuse("logprobs", "above 0 is not supported: the engine reports the log-probability of the "
                                      "sampled token only; use logprobs=0")

    def prompt_text(self) -> str:
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                if prompt and all(isinstance(p, str) for p in prompt):
                    raise _refuse("prompt", f"must hold one prompt: batches are not supported, got {len(prompt)}")
                raise _refuse("prompt", "must be text: token-id prompts are not supported")
            prompt = prompt[0]
        if not prompt:
            raise InvalidParam("'prompt' must not be empty", "prompt")
        return prompt

    def max_new_tokens(self) -> int:
        return self.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, List[ContentPart]]
    name: Optional[str] = None

    def text(self, index: int) -> str:
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise _refuse(f"messages.{index}.content", f"parts of type {part.type!r} are not supported; send "
                                                           f"text parts")
            texts.append(part.text)
        return "".join(texts)


class ChatCompletionRequest(OpenAiRequest):
    messages: List[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    response_format: Optional[dict] = None
    tools: Optional[list] = None
    tool_choice: Optional[Union[str, dict]] = None
    parallel_tool_calls: Optional[bool] = None
    metadata: Optional[dict] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None

    @model_validator(mode="after")
    def _max_tokens(self):
        if self.max_completion_tokens is not None and self.max_tokens is not None \
                and self.max_completion_tokens != self.max_tokens:
            raise ValueError("give one of max_tokens and max_completion_tokens")
        return self

    def check(self) -> None:
        super().check()
        if self.top_logprobs:
            raise _refuse("top_logprobs", "above 0 is not supported: the engine reports the log-probability of "
                                          "the sampled token only")
        if self.tools:
            raise _refuse("tools")
        if self.tool_choice not in (None, "none", "auto"):
            raise _refuse("tool_choice")
        if self.response_format not in (None, {"type": "text"}):
            raise _refuse("response_format", "other than {\"type\": \"text\"} is not supported by this server")

    def chat_messages(self) -> List[ChatMessage]:
        return [ChatMessage(role=m.role, content=m.text(i)) for i, m in enumerate(self.messages)]

    def max_new_tokens(self) -> Optional[int]:
        """None leaves the engine's default (OpenAI's "as many as fit" needs the prompt's length)."""
        return self.max_completion_tokens or self.max_tokens
