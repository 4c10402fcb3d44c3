"""Chat templates as Hugging Face writes them: chat messages -> the prompt text a model was trained on.

A template is Jinja2, rendered the way `transformers`' `apply_chat_template` renders it, so that a model's own
`chat_template` (tokenizer_config.json or chat_template.jinja) gives the same text, hence the same token ids:

- a sandboxed environment (`ImmutableSandboxedEnvironment`: a template cannot reach Python internals or change
  the messages) with `trim_blocks`, `lstrip_blocks`, the `loopcontrols` extension ({% break %}, {% continue %})
  and the `{% generation %}` block (rendered as its body);
- variables: `messages` (a list of dicts: role, content, and whatever else a message carries, such as
  tool_calls), `add_generation_prompt`, `tools` and `documents` (None unless the request has them), the
  tokenizer's special tokens (`bos_token`, `eos_token`, ...) and any extra template variables;
- functions: `raise_exception(message)` (the template refuses the chat: a ChatTemplateError with that message,
  a client error) and `strftime_now(format)`;
- a `tojson` filter as HF's: `json.dumps` with ensure_ascii=False (Jinja's own escapes HTML characters) and
  optional indent, separators and sort_keys.

Tokenize the text without the tokenizer's own special tokens (HF: add_special_tokens=False): the template puts
the BOS token itself where the model wants one. `ChatTemplate.add_special_tokens` says so; the old Python
format-string templates (`LegacyChatTemplate`) did not put it, so their text is tokenized as a plain prompt.
"""

import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mindspore_serving.llm.errors import InvalidRequestError

DEFAULT_TEMPLATE_NAME = "default"
TOOL_TEMPLATE_NAME = "tool_use"


class ChatTemplateError(InvalidRequestError):
    """The template refused the chat (raise_exception) or failed on it: the client's request is at fault."""


class _TemplateRaised(jinja2.TemplateError):
    """raise_exception(message) inside a template: its message reaches the client as it is."""


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's text (HF's assistant-mask support); it
    renders as its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: object) -> NoReturn:
    raise _TemplateRaised(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


def select_template(value: str | Sequence[Mapping] | None, tools: bool = False) -> str | None:
    """The template text of tokenizer_config.json's `chat_template`: a string, or HF's list of named templates
    ({"name": ..., "template": ...}), of which "tool_use" is taken when the request has tools and the model has
    one, else "default". ValueError when the list has no default."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(t, Mapping) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in value
    ):
        raise ValueError('chat_template must be a string or a list of {"name": ..., "template": ...} objects')
    named: dict[str, str] = {t["name"]: t["template"] for t in value}
    if tools and TOOL_TEMPLATE_NAME in named:
        return named[TOOL_TEMPLATE_NAME]
    if DEFAULT_TEMPLATE_NAME not in named:
        raise ValueError(f"chat_template lists templates {sorted(named)} but none named {DEFAULT_TEMPLATE_NAME!r}")
    return named[DEFAULT_TEMPLATE_NAME]


class ChatTemplate:
    """A compiled Jinja chat template and the special tokens it is given. TemplateSyntaxError (a ValueError
    here) when the text is not a valid template."""

    add_special_tokens = False
    """Whether the rendered text is tokenized with the tokenizer's own special tokens (HF: never for chat)."""

    def __init__(self, text: str, special_tokens: Mapping[str, Any] | None = None) -> None:
        try:
            self._template = _ENV.from_string(text)
        except jinja2.TemplateSyntaxError as err:
            raise ValueError(f"the chat template is not valid Jinja: {err.message} (line {err.lineno})") from None
        self.text = text
        self.special_tokens: dict[str, Any] = dict(special_tokens or {})

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[Any] | None = None,
        documents: list[Any] | None = None,
        continue_final_message: bool = False,
        **variables: Any,
    ) -> str:
        """The prompt text of `messages`. ChatTemplateError when the template refuses them (raise_exception) or
        fails on them; its message says why."""
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt cannot both be set: continue "
                "the last message, or start the assistant's reply"
            )
        context = {
            **self.special_tokens,
            **variables,
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "tools": tools,
            "documents": documents,
        }
        try:
            text = self._template.render(**context)
        except _TemplateRaised as err:
            raise ChatTemplateError(err.message or "the chat template refused the messages") from None
        except jinja2.TemplateError as err:  # undefined values used, sandbox refusals
            raise ChatTemplateError(f"the chat template failed on these messages: {err.message or err}") from None
        except (TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as err:
            raise ChatTemplateError(
                f"the chat template failed on these messages: {type(err).__name__}: {err}"
            ) from None
        if continue_final_message:
            text = _cut_after_final_message(text, messages)
        return text


def _cut_after_final_message(text: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """HF's continue_final_message: the text ends where the last message's content ends (no end-of-turn), so
    that the model goes on with that message."""
    if not messages:
        raise ChatTemplateError("continue_final_message needs at least one message")
    final = messages[-1].get("content")
    if isinstance(final, (list, tuple)):
        final = next(
            (part.get("text") for part in reversed(final) if isinstance(part, Mapping) and part.get("type") == "text"),
            None,
        )
    if not isinstance(final, str) or not final.strip() or final.strip() not in text:
        raise ChatTemplateError(
            "continue_final_message is set but the last message's text does not appear in the rendered chat"
        )
    where = text.rindex(final.strip())
    if text[where : where + len(final.lstrip())] == final.lstrip():
        return text[: where + len(final.lstrip())]
    return text[: where + len(final.strip())]


class LegacyChatTemplate:
    """The old configuration form: `template` a Python format string with {messages}, where each message
    rendered with `message_format` ({role}, {content}) goes. Its text does not carry the BOS token, so it is
    tokenized as a plain prompt (with the tokenizer's special tokens)."""

    add_special_tokens = True

    def __init__(self, template: str, message_format: str) -> None:
        self.template = template
        self.message_format = message_format

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[Any] | None = None,
        documents: list[Any] | None = None,
        continue_final_message: bool = False,
        **variables: Any,
    ) -> str:
        del add_generation_prompt, tools, documents, continue_final_message, variables  # the format has none
        try:
            rendered = "".join(
                self.message_format.format(role=m.get("role", ""), content=m.get("content", "")) for m in messages
            )
            return self.template.format(messages=rendered)
        except (KeyError, IndexError, ValueError) as err:
            raise ChatTemplateError(
                f"the chat template failed on these messages: {type(err).__name__}: {err}"
            ) from None
