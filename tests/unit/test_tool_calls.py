"""Tool calls of the chat API (frontends/llm/tool_calls.py): for any output and any split of it into chunks, the
streamed deltas add up to the message of the whole output, each call announced by one delta with its id, type
and name and then given its arguments; the formats' examples (malformed calls stay content); the constraints of
a forced tool_choice compile in llguidance and their output is read back; the request's tools are checked."""

import json

import llguidance
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mindspore_serving.common.errors import InvalidParam
from mindspore_serving.frontends.llm import tool_calls as tc
from mindspore_serving.llm.tool_call_formats import TOOL_CALL_PARSERS, detect_tool_call_parser

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
SCALARS = (
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False) | TEXT
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8
)
ARGUMENTS = st.dictionaries(TEXT, VALUES, max_size=4)
CALLS = st.lists(st.tuples(NAMES, ARGUMENTS), max_size=3)
# text around calls, with the pieces a splitter must not take for a call (or must take for one that fails)
TRICKY = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<tool_",
        "<",
        "{",
        "}",
        ";",
        " ",
        "\n",
        "\t",
        "<|python_tag|>",
        '{"name": 1}',
        '{"name": "x", "arguments": {}}',
        "é",
        "天",
    ]
)
CONTENT = st.lists(TRICKY | TEXT, max_size=6).map("".join)


def dumps(value, style) -> str:
    """JSON as a model may write it: spaced or not, indented or not, escaped or not."""
    indent, spaced, ascii_only = style
    return json.dumps(value, indent=indent, ensure_ascii=ascii_only, separators=(", ", ": ") if spaced else (",", ":"))


STYLES = st.tuples(st.sampled_from([None, 2]), st.booleans(), st.booleans())


@st.composite
def hermes_outputs(draw):
    """Content, then calls each between its tags, whitespace around, text between or after them; the last call
    maybe unclosed; or mangled calls."""
    parts = [draw(CONTENT)]
    calls = draw(CALLS)
    for index, (name, arguments) in enumerate(calls):
        body = dumps({"name": name, "arguments": arguments}, draw(STYLES))
        if draw(st.integers(0, 9)) == 0:
            body = body[: draw(st.integers(0, len(body)))]  # malformed: stays content
        closed = index < len(calls) - 1 or draw(st.booleans())
        parts.append(
            draw(st.sampled_from(["", "\n", "\n\n", " "]))
            + "<tool_call>\n"
            + body
            + "\n"
            + ("</tool_call>" if closed else "")
        )
        if closed:
            parts.append(draw(st.sampled_from(["", "\n", " \n"]) | CONTENT))
    return "".join(parts)


@st.composite
def llama3_outputs(draw):
    """Calls as LLaMA 3 writes them (maybe after <|python_tag|>, joined by ";"), or any text."""
    calls = draw(CALLS)
    if not calls or draw(st.integers(0, 5)) == 0:
        return draw(CONTENT)
    key = draw(st.sampled_from(["parameters", "arguments"]))
    text = draw(st.sampled_from(["; ", ";", ";\n"])).join(
        dumps({"name": name, key: arguments}, draw(STYLES)) for name, arguments in calls
    )
    if draw(st.integers(0, 9)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return draw(st.sampled_from(["", " ", "\n"])) + draw(st.sampled_from(["", "<|python_tag|>"])) + text


@st.composite
def chunked(draw, outputs):
    """(output, its chunks): cut at any points, a chunk may be empty."""
    text = draw(outputs)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0] + cuts + [len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:])]


def streamed(parser_name, chunks):
    stream = tc.ToolCallStream(tc.get_parser(parser_name, tc.sequential_ids()))
    deltas = []
    for chunk in chunks:
        deltas.extend(stream.feed(chunk))
    deltas.extend(stream.finish())
    return deltas, stream.calls


def whole(parser_name, text):
    return tc.assistant_message(*tc.get_parser(parser_name, tc.sequential_ids()).parse(text))


def check_stream_shape(deltas):
    """Content deltas are non-empty text; a call's first delta carries index, id, type, name and empty
    arguments, later ones only arguments; calls are numbered 0, 1, ... in order."""
    seen = []
    for delta in deltas:
        assert len(delta) == 1
        if "content" in delta:
            assert isinstance(delta["content"], str) and delta["content"]
            continue
        (part,) = delta["tool_calls"]
        if part["index"] not in seen:
            assert part["index"] == len(seen)
            seen.append(part["index"])
            assert set(part) == {"index", "id", "type", "function"} and part["type"] == "function"
            assert part["id"].startswith("call_") and part["function"]["arguments"] == ""
            assert set(part["function"]) == {"name", "arguments"}
        else:
            assert part["index"] == seen[-1] and set(part) == {"index", "function"}
            assert set(part["function"]) == {"arguments"}
    return len(seen)


PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(chunked(hermes_outputs()))
def test_hermes_streamed_deltas_add_up_to_the_whole_message(case):
    text, chunks = case
    deltas, calls = streamed("hermes", chunks)
    message = whole("hermes", text)
    assert tc.fold_deltas(deltas) == message
    assert check_stream_shape(deltas) == calls == len(message.get("tool_calls", ()))
    for call in message.get("tool_calls", ()):
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


@PROPERTY
@given(chunked(llama3_outputs()))
def test_llama3_streamed_deltas_add_up_to_the_whole_message(case):
    text, chunks = case
    deltas, calls = streamed("llama3_json", chunks)
    message = whole("llama3_json", text)
    assert tc.fold_deltas(deltas) == message
    assert check_stream_shape(deltas) == calls == len(message.get("tool_calls", ()))


@settings(max_examples=100, deadline=None)
@given(CALLS.filter(bool), CONTENT.filter(lambda t: "<tool_call>" not in t), STYLES)
def test_hermes_reads_back_every_call_written(calls, before, style):
    text = before + "".join(
        f"<tool_call>\n{dumps({'name': n, 'arguments': a}, style)}\n</tool_call>\n" for n, a in calls
    )
    content, parsed = tc.get_parser("hermes", tc.sequential_ids()).parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == [(n, a) for n, a in calls]
    assert content == (before.rstrip() or None)


@settings(max_examples=100, deadline=None)
@given(CALLS.filter(bool), STYLES)
def test_llama3_reads_back_every_call_written(calls, style):
    text = "<|python_tag|>" + "; ".join(dumps({"name": n, "parameters": a}, style) for n, a in calls)
    content, parsed = tc.get_parser("llama3_json").parse(text)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in parsed] == [(n, a) for n, a in calls]


# --- examples ----------------------------------------------------------------------------------------------


def feed_all(parser, chunks):
    stream = tc.ToolCallStream(parser)
    deltas = [d for chunk in chunks for d in stream.feed(chunk)]
    return deltas, stream.finish()


def test_hermes_example_and_its_stream():
    text = (
        'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    parser = tc.get_parser("hermes", tc.sequential_ids())
    content, calls = parser.parse(text)
    assert content == "Let me check."
    assert calls == [
        tc.ToolCall("call_0", "get_weather", '{"city":"Paris","unit":"°C"}'),
        tc.ToolCall("call_1", "get_time", "{}"),
    ]
    assert tc.assistant_message(content, calls) == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"°C"}'},
            },
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    }
    deltas, last = feed_all(tc.get_parser("hermes", tc.sequential_ids()), ["Let me check.\n\n<tool", "_call>\n{"])
    assert deltas == [{"content": "Let me check."}]  # the rest is undecided: held back, and content at the end
    assert last == [{"content": "\n\n<tool_call>\n{"}]


def test_hermes_malformed_or_foreign_calls_stay_content():
    parser = tc.get_parser("hermes")
    for text in [
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>',  # a brace short
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',  # arguments not an object
        '<tool_call>\n{"name": "f", "arguments": {}} trailing\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>',
        "a <tool_call",
        "<tool_call>",
    ]:
        assert parser.parse(text) == (text, []), text
        deltas, last = feed_all(parser, list(text))
        assert tc.fold_deltas(deltas + last) == {"role": "assistant", "content": text}


def test_hermes_arguments_given_as_json_text_and_an_unclosed_last_call():
    content, calls = tc.get_parser("hermes").parse('<tool_call>{"name": "f", "arguments": "{\\"a\\": [1]}"}')
    assert content is None and [(c.name, c.arguments) for c in calls] == [("f", '{"a":[1]}')]


def test_llama3_examples():
    parser = tc.get_parser("llama3_json", tc.sequential_ids())
    content, calls = parser.parse(
        '<|python_tag|>{"name": "f", "parameters": {"q": "x"}}; {"name": "g", "arguments": {}}'
    )
    assert content is None and calls == [tc.ToolCall("call_0", "f", '{"q":"x"}'), tc.ToolCall("call_1", "g", "{}")]
    for text in [
        '{"name": "f", "parameters": {}} and then text',
        '{"a": 1}',
        "{not json",
        "<|python_tag|>",
        '<|python_tag|>print("hi")',
    ]:
        assert parser.parse(text) == (text, [])
    deltas, last = feed_all(parser, ["Hel", "lo {"])
    assert deltas == [{"content": "Hel"}, {"content": "lo {"}] and last == []
    deltas, last = feed_all(parser, [" <|python", "_tag|>{"])
    assert deltas == [] and last == [{"content": " <|python_tag|>{"}]


def test_no_parser_streams_everything_as_content():
    deltas, last = feed_all(None, ["<tool_call>", "{}"])
    assert deltas == [{"content": "<tool_call>"}, {"content": "{}"}] and last == []


def test_ids_are_openai_style():
    ids = {tc.new_call_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(i.startswith("call_") and len(i) == 29 and i[5:].isalnum() and i.isascii() for i in ids)


def test_finish_reason():
    assert tc.finish_reason("stop", True) == "tool_calls"
    assert tc.finish_reason("stop", True, "required") == "tool_calls"
    assert tc.finish_reason("stop", True, {"type": "function", "function": {"name": "f"}}) == "stop"
    assert tc.finish_reason("length", True) == "length"
    assert tc.finish_reason("stop", False) == "stop"


def test_the_registry_names_the_configurations_formats():
    assert set(tc.PARSERS) >= set(TOOL_CALL_PARSERS)
    assert tc.get_parser("hermes").name == "hermes"
    with pytest.raises(KeyError, match="hermes"):
        tc.get_parser("nope")


# --- forced tool_choice ------------------------------------------------------------------------------------


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "now"}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def compiles(structured) -> dict:
    assert structured.type == "json"
    schema = json.loads(structured.value)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    return schema


def test_required_and_named_constraints_compile():
    schema = compiles(tc.tool_choice_constraint(TOOLS, "required"))
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    first, second = schema["items"]["anyOf"]
    assert first["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    assert first["properties"]["parameters"] == TOOLS[0]["function"]["parameters"]
    assert second["properties"]["parameters"] == tc.NO_PARAMETERS
    assert compiles(tc.tool_choice_constraint(TOOLS, "required", parallel_tool_calls=False))["maxItems"] == 1
    assert compiles(tc.tool_choice_constraint(TOOLS, NAMED)) == TOOLS[0]["function"]["parameters"]
    assert (
        compiles(tc.tool_choice_constraint(TOOLS, {"type": "function", "function": {"name": "now"}}))
        == tc.NO_PARAMETERS
    )
    assert tc.tool_choice_constraint(TOOLS, "auto") is None and tc.tool_choice_constraint(TOOLS, "none") is None


def test_forced_tool_calls_read_the_constrained_output():
    ids = tc.sequential_ids()
    assert tc.forced_tool_calls('{"city": "Zürich"}', TOOLS, NAMED, ids) == [
        tc.ToolCall("call_0", "get_weather", '{"city":"Zürich"}')
    ]
    text = '[{"name": "now", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    assert tc.forced_tool_calls(text, TOOLS, "required", ids) == [
        tc.ToolCall("call_1", "now", "{}"),
        tc.ToolCall("call_2", "get_weather", '{"city":"Oslo"}'),
    ]
    for bad in ['{"city": "Zü', "[]", '[{"name": "other", "parameters": {}}]', '{"city": 1']:
        assert tc.forced_tool_calls(bad, TOOLS, "required") == []
    assert tc.forced_tool_calls('{"city": "Zü', TOOLS, NAMED) == []
    parser = tc.forced_parser(TOOLS, NAMED, tc.sequential_ids())
    deltas, last = feed_all(parser, ['{"ci', 'ty": "Rome"}'])
    assert deltas == [] and tc.fold_deltas(last) == tc.assistant_message(
        None, [tc.ToolCall("call_0", "get_weather", '{"city":"Rome"}')]
    )
    with pytest.raises(ValueError):
        tc.forced_parser(TOOLS, "auto")


# --- the request's tools -----------------------------------------------------------------------------------


def test_check_tools_resolves_tool_choice():
    assert tc.check_tools(TOOLS) == "auto"
    assert tc.check_tools(None) == "none" and tc.check_tools([], "none") == "none"
    assert tc.check_tools(TOOLS, "required") == "required"
    assert tc.check_tools(TOOLS, NAMED) == NAMED


@pytest.mark.parametrize(
    "tools, tool_choice, param, words",
    [
        ({"type": "function"}, None, "tools", "array"),
        ([1], None, "tools[0]", "object"),
        ([{"type": "code", "function": {"name": "f"}}], None, "tools[0].type", "'function'"),
        ([{"type": "function", "function": {"name": "f"}, "extra": 1}], None, "tools[0].extra", "unknown"),
        ([{"type": "function"}], None, "tools[0].function", "object"),
        ([{"type": "function", "function": {"name": "a b"}}], None, "tools[0].function.name", "letters"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": []}}],
            None,
            "tools[0].function.parameters",
            "JSON Schema",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            None,
            "tools[0].function.parameters",
            "'object'",
        ),
        (
            [{"type": "function", "function": {"name": "f", "description": 3}}],
            None,
            "tools[0].function.description",
            "string",
        ),
        (
            [{"type": "function", "function": {"name": "f", "strict": "yes"}}],
            None,
            "tools[0].function.strict",
            "boolean",
        ),
        ([{"type": "function", "function": {"name": "f", "colour": 1}}], None, "tools[0].function.colour", "unknown"),
        (TOOLS + [TOOLS[1]], None, "tools[2].function.name", "duplicate"),
        (TOOLS, "sometimes", "tool_choice", "sometimes"),
        (TOOLS, 3, "tool_choice", "string or an object"),
        (TOOLS, {"type": "function", "function": {"name": "missing"}}, "tool_choice", "missing"),
        (TOOLS, {"type": "function", "name": "now"}, "tool_choice", "expected"),
        (None, "auto", "tool_choice", "needs 'tools'"),
        ([], "required", "tool_choice", "needs 'tools'"),
        (None, NAMED, "tool_choice", "needs 'tools'"),
    ],
)
def test_check_tools_names_the_field(tools, tool_choice, param, words):
    with pytest.raises(InvalidParam) as refused:
        tc.check_tools(tools, tool_choice)
    assert refused.value.param == param and words in refused.value.message


# --- the format a model's chat template prompts for --------------------------------------------------------


def test_detect_from_the_chat_template():
    assert detect_tool_call_parser("{% for m in messages %}<tool_call>{% endfor %}") == "hermes"
    assert detect_tool_call_parser("{%- if message.role == 'ipython' %}") == "llama3_json"
    assert detect_tool_call_parser("{{- '<|python_tag|>' }}") == "llama3_json"
    assert detect_tool_call_parser("{{ messages }}") is None and detect_tool_call_parser(None) is None
