"""Tool calling of OpenAI's chat completions: the request's `tools` and `tool_choice` checked, the constraint a
forced choice puts on the output, and the calls read out of the output, whole or streamed. Pure logic.

How calls are read depends on `tool_choice`:
  * "auto": the model writes calls in its own family's format; a parser of that format (`get_parser(name)`,
    the names of llm/tool_call_formats.py) splits the text into content and calls;
  * "required" or a named function: the output is constrained to plain JSON (`tool_choice_constraint`), as vLLM
    does, whatever the model's own format: a non-empty array of {"name", "parameters"}, or the named function's
    arguments object; `forced_parser` reads it;
  * "none": no calls are read.

A call's `arguments` is JSON text (OpenAI sends a string), serialized compactly from the parsed object
(`arguments_json`), so that a streamed call and the same call answered whole carry the very same text.

Streaming (`ToolCallStream`) gives OpenAI's deltas: {"content": ...} for text, and for call i one delta with
its id, type and name (arguments "") then its arguments. A call is announced only once it is decided, i.e. its
text parsed (Hermes: at `</tool_call>`, or at the end of an unclosed last one; LLaMA 3 and forced choices: at
the end, since a later part that does not parse makes the whole output content), so its arguments come in one
fragment; text that may still turn out to be part of a call is held back until then. The deltas folded
(`fold_deltas`) equal the message of the whole text (`assistant_message(*parser.parse(text))`) for any split of
the text into chunks.
"""

import itertools
import json
import re
import secrets
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mindspore_serving.common.errors import InvalidParam
from mindspore_serving.llm.sampling_params import StructuredOutput
from mindspore_serving.llm.tool_call_formats import HERMES, LLAMA3_JSON

CALL_ID_PREFIX = "call_"
CALL_ID_LENGTH = 24
_ID_ALPHABET = string.ascii_letters + string.digits
TOOL_CHOICES = ("none", "auto", "required")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""OpenAI's pattern of a function name."""
TOOL_FIELDS = ("type", "function")
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
NO_PARAMETERS = {"type": "object", "properties": {}}
"""The parameters of a function that declares none."""

IdGenerator = Callable[[], str]
Event = str | tuple[str, str]
"""What a splitter decides: content text, or a call (name, arguments JSON text)."""


def new_call_id() -> str:
    """An OpenAI-style call id: "call_" and 24 random letters and digits."""
    return CALL_ID_PREFIX + "".join(secrets.choice(_ID_ALPHABET) for _ in range(CALL_ID_LENGTH))


def sequential_ids(prefix: str = CALL_ID_PREFIX) -> IdGenerator:
    """Deterministic ids "call_0", "call_1", ... (for tests: a stream and a whole parse given one each agree)."""
    counter = itertools.count()
    return lambda: f"{prefix}{next(counter)}"


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    """JSON without NaN/Infinity (which would not serialize back to JSON)."""
    return json.loads(text, parse_constant=_no_constant)


def arguments_json(arguments: Any) -> str:
    """The `arguments` text of a call: its parsed arguments as compact JSON, non-ASCII kept as is."""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """JSON text of an object."""

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def assistant_message(content: str | None, calls: Sequence[ToolCall] = ()) -> dict:
    """OpenAI's `message` of a non-streamed choice; `tool_calls` only when there are calls."""
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [call.to_openai() for call in calls]
    return message


def finish_reason(reason: str, called: bool, tool_choice: Any = None) -> str:
    """The choice's finish reason: "tool_calls" when the model stopped after calling tools, except for a named
    tool_choice, where OpenAI keeps "stop" (the call was forced, not chosen). "length" and other reasons stay:
    a client must know the output was cut."""
    if called and reason == "stop" and not isinstance(tool_choice, Mapping):
        return "tool_calls"
    return reason


# ------------------------------------------------------------------------------------------ the request


def _bad(param: str, why: str) -> InvalidParam:
    return InvalidParam(f"Invalid '{param}': {why}", param)


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


def check_tools(tools: Sequence | None, tool_choice: Any = None) -> str | dict:
    """Validates OpenAI's `tools` and `tool_choice`; InvalidParam names the field at fault. Returns the
    effective tool_choice: "none", "auto", "required" or {"type": "function", "function": {"name": ...}}; when
    absent, "auto" with tools and "none" without. No tools (None or []) allows only tool_choice "none"."""
    tools = [] if tools is None else tools
    if not isinstance(tools, (list, tuple)):
        raise _bad("tools", f"expected an array of tools, got {_type_name(tools)}")
    names = set()
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, Mapping):
            raise _bad(where, f"expected an object, got {_type_name(tool)}")
        unknown = sorted(set(tool) - set(TOOL_FIELDS))
        if unknown:
            raise _bad(f"{where}.{unknown[0]}", f"unknown field; a tool has {list(TOOL_FIELDS)}")
        if tool.get("type") != "function":
            raise _bad(f"{where}.type", f"expected 'function', got {tool.get('type')!r}")
        name = _check_function(tool.get("function"), f"{where}.function")
        if name in names:
            raise _bad(f"{where}.function.name", f"duplicate function name {name!r}; tool names must be unique")
        names.add(name)
    return _check_choice(tool_choice, names)


def _check_function(function, where: str) -> str:
    if not isinstance(function, Mapping):
        raise _bad(where, f"expected an object, got {_type_name(function)}")
    unknown = sorted(set(function) - set(FUNCTION_FIELDS))
    if unknown:
        raise _bad(f"{where}.{unknown[0]}", f"unknown field; a function has {list(FUNCTION_FIELDS)}")
    name = function.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise _bad(f"{where}.name", f"expected 1 to 64 letters, digits, '_' or '-', got {name!r}")
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise _bad(f"{where}.description", f"expected a string, got {_type_name(function['description'])}")
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, Mapping):
            raise _bad(f"{where}.parameters", f"expected a JSON Schema object, got {_type_name(parameters)}")
        if parameters.get("type", "object") != "object":
            raise _bad(
                f"{where}.parameters",
                f"the parameters of function {name!r} must be a JSON Schema of "
                f"type 'object', got type {parameters.get('type')!r}",
            )
    if function.get("strict") is not None and not isinstance(function["strict"], bool):
        raise _bad(f"{where}.strict", f"expected a boolean, got {_type_name(function['strict'])}")
    return name


def _check_choice(tool_choice, names) -> str | dict:
    if tool_choice is None:
        return "auto" if names else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICES:
            raise _bad("tool_choice", f"expected one of {list(TOOL_CHOICES)} or a named function, got {tool_choice!r}")
        if tool_choice != "none" and not names:
            raise _bad("tool_choice", f"tool_choice {tool_choice!r} needs 'tools'")
        return tool_choice
    if not isinstance(tool_choice, Mapping):
        raise _bad("tool_choice", f"expected a string or an object, got {_type_name(tool_choice)}")
    function = tool_choice.get("function")
    if (
        tool_choice.get("type") != "function"
        or not isinstance(function, Mapping)
        or set(tool_choice) != {"type", "function"}
        or set(function) != {"name"}
        or not isinstance(function["name"], str)
    ):
        raise _bad("tool_choice", 'expected {"type": "function", "function": {"name": <a tool\'s name>}}')
    if not names:
        raise _bad("tool_choice", "a named tool_choice needs 'tools'")
    if function["name"] not in names:
        raise _bad("tool_choice", f"no tool is named {function['name']!r}; the tools are {sorted(names)}")
    return {"type": "function", "function": {"name": function["name"]}}


def _named(tool_choice) -> str | None:
    return tool_choice["function"]["name"] if isinstance(tool_choice, Mapping) else None


def _parameters(tools: Sequence[Mapping]) -> dict[str, dict]:
    """Each function's parameters schema, by name (NO_PARAMETERS for one that declares none)."""
    return {tool["function"]["name"]: dict(tool["function"].get("parameters") or NO_PARAMETERS) for tool in tools}


def tool_choice_constraint(
    tools: Sequence[Mapping] | None, tool_choice: Any, parallel_tool_calls: bool = True
) -> StructuredOutput | None:
    """The structured output a forced tool_choice generates under (of checked tools/tool_choice): "required": a
    non-empty JSON array (at most one item when parallel_tool_calls is false) of {"name": <a tool's name>,
    "parameters": <its arguments>}, one schema per tool; a named function: its arguments object. None for
    "auto" and "none": the model writes freely and calls are parsed from its text."""
    named = _named(tool_choice)
    schemas = _parameters(tools or ())
    if named is not None:
        return StructuredOutput("json", json.dumps(schemas[named]))
    if tool_choice != "required":
        return None
    items = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for name, schema in schemas.items()
    ]
    array = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not parallel_tool_calls:
        array["maxItems"] = 1
    return StructuredOutput("json", json.dumps(array))


# ------------------------------------------------------------------------------------------ parsers


def _arguments_of(value: Any) -> str | None:
    """A call's arguments as compact JSON: an object, or JSON text of one (some models quote them); absent or
    null: no arguments. None: not arguments."""
    if value is None:
        value = {}
    elif isinstance(value, str):
        try:
            value = _loads(value)
        except ValueError:
            return None
    return arguments_json(value) if isinstance(value, dict) else None


def _call_of(value: Any, keys: tuple[str, ...] = ("arguments", "parameters")) -> tuple[str, str] | None:
    """(name, arguments JSON) of a parsed {"name": ..., "arguments" | "parameters": {...}}, else None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    key = next((k for k in keys if k in value), None)
    arguments = _arguments_of(value[key] if key else None)
    return None if arguments is None else (value["name"], arguments)


class ToolParser:
    """Splits a model's output into content and tool calls. `ids` makes the calls' ids (new_call_id; inject a
    deterministic one in tests). Subclasses give `_split` (and `splitter` when they can decide text before the
    end)."""

    name = ""

    def __init__(self, ids: IdGenerator | None = None):
        self.ids = ids or new_call_id

    def _split(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        """(content, [(name, arguments JSON)]) of the whole output."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content or None, calls) of the whole output; text that looks like a call but does not parse stays
        content."""
        content, calls = self._split(text)
        return content or None, [ToolCall(self.ids(), name, arguments) for name, arguments in calls]

    def splitter(self) -> "_Splitter":
        """A fresh streaming splitter: by default it holds everything back until the end."""
        return _WholeText(self._split)


class _Splitter:
    """Decides streamed text: feed() and finish() return the events decided so far, in order."""

    def feed(self, text: str) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError


class _WholeText(_Splitter):
    """Holds the whole output and splits it at the end."""

    def __init__(self, split: Callable[[str], tuple[str, list[tuple[str, str]]]]):
        self._split = split
        self._text: list[str] = []

    def feed(self, text: str) -> list[Event]:
        self._text.append(text)
        return []

    def finish(self) -> list[Event]:
        content, calls = self._split("".join(self._text))
        self._text = []
        return ([content] if content else []) + list(calls)


class _PassThrough(_Splitter):
    """No tools: everything is content as it comes."""

    def feed(self, text: str) -> list[Event]:
        return [text] if text else []

    def finish(self) -> list[Event]:
        return []


OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def _partial_open(text: str) -> int:
    """The length of the longest end of `text` that begins OPEN without completing it."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:size]):
            return size
    return 0


class HermesParser(ToolParser):
    """Hermes, Qwen2, Qwen2.5, Qwen3: each call is `<tool_call>` {"name": ..., "arguments": {...}}
    `</tool_call>` (the last one may be left unclosed at the end). Content is the text outside the calls, less
    the whitespace next to a call; a `<tool_call>` whose body is not such an object stays content, tags
    included."""

    name = HERMES

    @staticmethod
    def body_call(body: str) -> tuple[str, str] | None:
        try:
            return _call_of(_loads(body.strip()))
        except ValueError:
            return None

    def _split(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        segments: list[str] = []  # the text between calls (segments[k] precedes calls[k])
        calls: list[tuple[str, str]] = []
        segment, position = [], 0
        while True:
            start = text.find(OPEN, position)
            if start < 0:
                segment.append(text[position:])
                break
            end = text.find(CLOSE, start + len(OPEN))
            body_end, after = (end, end + len(CLOSE)) if end >= 0 else (len(text), len(text))
            call = self.body_call(text[start + len(OPEN) : body_end])
            if call is None:
                segment.append(text[position:after])
            else:
                segment.append(text[position:start])
                segments.append("".join(segment))
                calls.append(call)
                segment = []
            position = after
        segments.append("".join(segment))
        content = []
        for index, piece in enumerate(segments):
            if index > 0:
                piece = piece.lstrip()
            if index < len(calls):
                piece = piece.rstrip()
            content.append(piece)
        return "".join(content), calls

    def splitter(self) -> _Splitter:
        return _HermesSplitter()


class _HermesSplitter(_Splitter):
    """HermesParser's split, decided as text arrives: content goes out at once but for whitespace and a partial
    `<tool_call>` at its end; a call's text is held until `</tool_call>` (or the end) decides it."""

    def __init__(self):
        self._buffer = ""  # outside a call: undecided text; inside: the text after OPEN
        self._inside = False
        self._held = ""  # inside: the whitespace before OPEN (content unless the call parses)
        self._after_call = False  # outside: the segment follows a call, its leading whitespace is dropped
        self._scan = 0  # inside: where CLOSE may begin

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            if self._inside:
                end = self._buffer.find(CLOSE, self._scan)
                if end < 0:
                    self._scan = max(0, len(self._buffer) - len(CLOSE) + 1)
                    return events
                self._decide(self._buffer[:end], self._buffer[: end + len(CLOSE)], events)
                self._buffer = self._buffer[end + len(CLOSE) :]
                continue
            if self._after_call:
                self._buffer = self._buffer.lstrip()
                if not self._buffer:
                    return events
                self._after_call = False
            start = self._buffer.find(OPEN)
            if start < 0:
                cut = len(self._buffer[: len(self._buffer) - _partial_open(self._buffer)].rstrip())
                _content(events, self._buffer[:cut])
                self._buffer = self._buffer[cut:]
                return events
            before = self._buffer[:start]
            text_before = before.rstrip()
            _content(events, text_before)
            self._held = before[len(text_before) :]
            self._buffer = self._buffer[start + len(OPEN) :]
            self._inside, self._scan = True, 0

    def _decide(self, body: str, raw: str, events: list[Event]):
        """A call's body is complete: a call, or (with its tags and the whitespace before it) content."""
        call = HermesParser.body_call(body)
        if call is None:
            _content(events, self._held + OPEN + raw)
        else:
            events.append(call)
            self._after_call = True
        self._held, self._inside = "", False

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._inside:
            self._decide(self._buffer, self._buffer, events)
        else:  # after a call, feed() has dropped the whitespace
            _content(events, self._buffer)
        self._buffer = ""
        return events


def _content(events: list[Event], text: str):
    if text:
        events.append(text)


PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    """LLaMA 3.1/3.2's JSON tool calls: the whole output (after leading whitespace) is `{"name": ...,
    "parameters": {...}}` ("arguments" is read too), several separated by ";", optionally after
    `<|python_tag|>`. Anything else, or a part that does not parse, makes the whole output content."""

    name = LLAMA3_JSON

    def _split(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        body = text.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :]
        elif not body.startswith("{"):
            return text, []
        calls = _json_calls(body, ("parameters", "arguments"))
        return ("", calls) if calls else (text, [])

    def splitter(self) -> _Splitter:
        return _Llama3Splitter(self._split)


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_WHITESPACE = re.compile(r"\s*")


def _json_calls(body: str, keys: tuple[str, ...]) -> list[tuple[str, str]]:
    """The calls of `body`: JSON call objects separated by ";" (a trailing ";" allowed); [] unless all parse."""
    calls, position = [], _WHITESPACE.match(body).end()
    while position < len(body):
        try:
            value, position = _DECODER.raw_decode(body, position)
        except ValueError:
            return []
        call = _call_of(value, keys)
        if call is None:
            return []
        calls.append(call)
        position = _WHITESPACE.match(body, position).end()
        if position < len(body):
            if body[position] != ";":
                return []
            position = _WHITESPACE.match(body, position + 1).end()
    return calls


class _Llama3Splitter(_Splitter):
    """Content passes at once when the output does not start like a call; one that does is held to the end."""

    def __init__(self, split):
        self._split = split
        self._text = ""
        self._mode = None  # None: undecided, "content", or "whole"

    def feed(self, text: str) -> list[Event]:
        if self._mode == "content":
            return [text] if text else []
        self._text += text
        if self._mode == "whole":
            return []
        start = self._text.lstrip()
        if not start or (PYTHON_TAG.startswith(start) and start != PYTHON_TAG):
            return []
        if start.startswith("{") or start.startswith(PYTHON_TAG):
            self._mode = "whole"
            return []
        self._mode, text, self._text = "content", self._text, ""
        return [text]

    def finish(self) -> list[Event]:
        if self._mode == "content":
            return []
        content, calls = self._split(self._text)
        self._text = ""
        return ([content] if content else []) + list(calls)


class _ForcedParser(ToolParser):
    """The JSON output of a forced tool_choice: the named function's arguments object, or the "required" array
    of {"name", "parameters"}. Output that is not that (e.g. cut by max_tokens) is content."""

    def __init__(self, tools: Sequence[Mapping], tool_choice: Any, ids: IdGenerator | None = None):
        super().__init__(ids)
        self.names = set(_parameters(tools))
        self.named = _named(tool_choice)
        if self.named is None and tool_choice != "required":
            raise ValueError(f"tool_choice {tool_choice!r} does not force calls")
        self.name = f"forced:{self.named or 'required'}"

    def _split(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        try:
            value = _loads(text)
        except ValueError:
            return text, []
        if self.named is not None:
            return ("", [(self.named, arguments_json(value))]) if isinstance(value, dict) else (text, [])
        if not isinstance(value, list) or not value:
            return text, []
        calls = [_call_of(item, ("parameters",)) for item in value]
        if any(call is None or call[0] not in self.names for call in calls):
            return text, []
        return "", calls


def forced_parser(tools: Sequence[Mapping], tool_choice: Any, ids: IdGenerator | None = None) -> ToolParser:
    """The parser of a forced tool_choice's output ("required" or a named function; ValueError otherwise)."""
    return _ForcedParser(tools, tool_choice, ids)


def forced_tool_calls(
    text: str, tools: Sequence[Mapping], tool_choice: Any, ids: IdGenerator | None = None
) -> list[ToolCall]:
    """The calls of a forced tool_choice's output; [] when the text is not the constrained JSON (then it is
    content, e.g. an output cut by max_tokens)."""
    return forced_parser(tools, tool_choice, ids).parse(text)[1]


PARSERS: dict[str, Callable[..., ToolParser]] = {}
"""The parsers of the model families' formats, by name (llm/tool_call_formats.py TOOL_CALL_PARSERS)."""


def register_parser(name: str, factory: Callable[..., ToolParser]):
    """Makes `get_parser(name)` build `factory(ids=...)`."""
    PARSERS[name] = factory


def get_parser(name: str, ids: IdGenerator | None = None) -> ToolParser:
    """The parser named `name`; KeyError naming the known ones when there is none."""
    if name not in PARSERS:
        raise KeyError(f"no tool call parser {name!r}; known: {sorted(PARSERS)}")
    return PARSERS[name](ids=ids)


register_parser(HERMES, HermesParser)
register_parser(LLAMA3_JSON, Llama3JsonParser)

# ------------------------------------------------------------------------------------------ streaming


class ToolCallStream:
    """OpenAI's chat deltas of a streamed output. `parser`: a ToolParser, or None (no tools: all content).
    feed(text) and finish() return the deltas decided so far: {"content": ...}, or for a call a first delta
    {"tool_calls": [{"index", "id", "type": "function", "function": {"name", "arguments": ""}}]} and then
    {"tool_calls": [{"index", "function": {"arguments": <JSON text>}}]}. `calls` counts the calls announced."""

    def __init__(self, parser: ToolParser | None):
        self.parser = parser
        self._splitter = parser.splitter() if parser is not None else _PassThrough()
        self._ids = parser.ids if parser is not None else new_call_id
        self.calls = 0

    def feed(self, text: str) -> list[dict]:
        return self._deltas(self._splitter.feed(text))

    def finish(self) -> list[dict]:
        return self._deltas(self._splitter.finish())

    def _deltas(self, events: Iterable[Event]) -> list[dict]:
        deltas: list[dict] = []
        for event in events:
            if isinstance(event, str):
                if deltas and "content" in deltas[-1]:
                    deltas[-1]["content"] += event
                elif event:
                    deltas.append({"content": event})
                continue
            name, arguments = event
            index, self.calls = self.calls, self.calls + 1
            deltas.append(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": self._ids(),
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})
        return deltas


def fold_deltas(deltas: Iterable[Mapping]) -> dict:
    """The message that streamed deltas add up to, as assistant_message gives it (to compare the two)."""
    content, calls = [], {}
    for delta in deltas:
        if delta.get("content"):
            content.append(delta["content"])
        for part in delta.get("tool_calls") or ():
            call = calls.setdefault(part["index"], {"id": None, "name": None, "arguments": []})
            if "id" in part:
                call["id"] = part["id"]
            function = part.get("function") or {}
            if "name" in function:
                call["name"] = function["name"]
            call["arguments"].append(function.get("arguments") or "")
    return assistant_message(
        "".join(content), [ToolCall(c["id"], c["name"], "".join(c["arguments"])) for _, c in sorted(calls.items())]
    )
