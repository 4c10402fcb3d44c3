"""Prompter: what the worker makes of a request's input before the engine sees it, and /tokenize, /detokenize.

A chat becomes its prompt through the model's chat template (llm/chat_template.py): the one the LLM
configuration names (`model.chat_template`), else the model's own next to its tokenizer (chat_template.jinja,
tokenizer_config.json). The text is tokenized here, as the template wants it (without the tokenizer's special
tokens: the template writes BOS itself), and goes to the engine with its ids. /tokenize answers with the very
ids a generation of the same input gets; /detokenize turns ids back into text, special tokens included.

OpenAI clients send an assistant message's tool call arguments as JSON text, while Hugging Face's templates
expect the object (they write it with `tojson`): JSON text of an object is handed to the template as the object.
Their assistant message that only calls tools has content null: the template gets "" (as vLLM gives it), so that
a template that writes every message's content does not fail on it.
"""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mindspore_serving.common import errors
from mindspore_serving.ipc.llm_session import Tokenized, TokenizeRequest
from mindspore_serving.llm.chat_template import ChatTemplate, LegacyChatTemplate, select_template
from mindspore_serving.llm.engine import EncodedPrompt

Template = ChatTemplate | LegacyChatTemplate
RESERVED_VARIABLES = frozenset(("messages", "add_generation_prompt", "tools", "documents", "continue_final_message"))
NO_TEMPLATE = (
    "this model has no chat template: send a prompt, or set 'model.chat_template' in its LLM "
    "configuration (a Jinja file)"
)


class Prompter:
    """`tokenizer`: a TextTokenizer (models/llama/tokenizer.py); `model`: the LLM configuration's model section
    (spec/llm_config.py ModelSection); `max_prompt_chars`: the longest text tokenized. A template that does not
    compile raises ValueError here, when the worker starts."""

    def __init__(self, tokenizer, model, max_prompt_chars: int):
        self.tokenizer = tokenizer
        self.max_prompt_chars = max_prompt_chars
        self._templates: dict[bool, Template] = {}  # with tools -> the template; empty: none
        special = tokenizer.special_tokens
        if model.chat_message is not None:
            legacy = LegacyChatTemplate(model.chat_template, model.chat_message)
            self._templates = {False: legacy, True: legacy}
        elif model.chat_template is not None:
            template = ChatTemplate(model.chat_template, special)
            self._templates = {False: template, True: template}
        elif tokenizer.chat_template is not None:
            try:
                texts = {tools: select_template(tokenizer.chat_template, tools) for tools in (False, True)}
                compiled = {text: ChatTemplate(text, special) for text in set(texts.values())}
            except ValueError as err:
                raise ValueError(f"the model's chat template (next to its tokenizer): {err}") from None
            self._templates = {tools: compiled[text] for tools, text in texts.items()}

    @property
    def has_chat_template(self) -> bool:
        return bool(self._templates)

    @property
    def tools_template_text(self) -> str | None:
        """The Jinja text a chat with tools is rendered with (None: no template, or an old-style one)."""
        return getattr(self._templates.get(True), "text", None)

    def chat(
        self,
        messages: Sequence[dict],
        add_generation_prompt: bool = True,
        tools=None,
        documents=None,
        continue_final_message: bool = False,
        add_special_tokens: bool | None = None,
        template_kwargs: dict | None = None,
    ) -> EncodedPrompt:
        """The prompt of a chat (its text and ids); ChatTemplateError (a client error) when the template refuses
        the messages or fails on them."""
        if not self._templates:
            raise errors.InvalidInputs(NO_TEMPLATE)
        template = self._templates[bool(tools)]
        reserved = sorted(set(template_kwargs or ()) & RESERVED_VARIABLES)
        if reserved:
            raise errors.InvalidInputs(
                f"chat_template_kwargs may not set {', '.join(reserved)}: the request's own fields do"
            )
        text = template.render(
            [_template_message(m) for m in messages],
            add_generation_prompt,
            tools=tools,
            documents=documents,
            continue_final_message=continue_final_message,
            **(template_kwargs or {}),
        )
        if add_special_tokens is None:
            add_special_tokens = template.add_special_tokens
        return EncodedPrompt(text, self.encode(text, add_special_tokens))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > self.max_prompt_chars:
            raise errors.InvalidInputs(
                f"the prompt has {len(text)} characters, more than this model takes "
                f"({self.max_prompt_chars}); shorten it"
            )
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def tokenize(self, request: TokenizeRequest) -> Tokenized:
        if request.messages is not None:
            if request.chat_template_kwargs is not None and not isinstance(request.chat_template_kwargs, dict):
                raise errors.InvalidInputs("chat_template_kwargs must be an object")
            text, ids = self.chat(
                request.messages,
                request.add_generation_prompt,
                request.tools,
                request.documents,
                request.continue_final_message,
                request.add_special_tokens,
                request.chat_template_kwargs,
            )
        else:
            text = request.prompt or ""
            ids = self.encode(text, True if request.add_special_tokens is None else request.add_special_tokens)
        ids = list(ids)
        strs = [self.tokenizer.id_to_token(i) or "" for i in ids] if request.return_token_strs else None
        return Tokenized(ids, text, strs)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        vocab = self.tokenizer.vocab_size
        bad = next((i for i in token_ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise errors.InvalidInputs(f"token id {bad} is not in this model's vocabulary [0, {vocab})")
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)


def _template_message(message: Mapping) -> dict:
    """A copy of a chat message whose tool calls' arguments, when JSON text of an object, are that object, and whose
    null content next to tool calls is ""."""
    message = dict(message)
    if isinstance(message.get("tool_calls"), list):
        message["tool_calls"] = [_template_call(call) for call in message["tool_calls"]]
        if message.get("content") is None:
            message["content"] = ""
    return message


def _template_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:  # not JSON: the template gets the text as sent
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": arguments}}
