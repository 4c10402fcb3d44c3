"""Chat templates as Hugging Face renders them: each fixture model's own template and tokenizer give the ids of
transformers' apply_chat_template (tests/fixtures/hf/<name>/expected.json), through the master <-> worker wire;
HF's conventions (tojson, raise_exception, strftime_now, loop controls, the sandbox); the bundled model's
template renders what its old format string did; the model's generation defaults."""

import datetime
import json
import os
import re
from types import SimpleNamespace

import pytest

from mindspore_serving.common import errors
from mindspore_serving.ipc import llm_session
from mindspore_serving.llm.chat_template import ChatTemplate, ChatTemplateError, LegacyChatTemplate, select_template
from mindspore_serving.llm.generation_defaults import GenerationDefaults
from mindspore_serving.llm.tool_call_formats import detect_tool_call_parser
from mindspore_serving.models.llama.tokenizer import TextTokenizer
from mindspore_serving.worker.llm.prompts import NO_TEMPLATE, Prompter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf")
BUNDLED_TOKENIZER = os.path.join(ROOT, "mindspore_serving", "models", "llama", "tiny", "tokenizer.json")
CASE_FIELDS = {"name", "messages", "add_generation_prompt", "ids", "text", "tools", "error"}
MODEL_OWN_TEMPLATE = SimpleNamespace(chat_template=None, chat_message=None)


def prompter(directory, model=MODEL_OWN_TEMPLATE):
    return Prompter(TextTokenizer.from_file(directory), model, max_prompt_chars=100_000)


def fixture_cases():
    for name in ("llama2_linear", "llama3", "mistral", "qwen2", "qwen3"):
        path = os.path.join(FIXTURES, name, "expected.json")
        if not os.path.isfile(path):
            yield pytest.param(name, None, id=name, marks=pytest.mark.skip(reason=f"no fixture {name}"))
            continue
        with open(path, encoding="utf-8") as stream:
            for case in json.load(stream)["chat"]["cases"]:
                yield pytest.param(name, case, id=f"{name}-{case['name']}")


@pytest.fixture(scope="module")
def prompters():
    return {}


@pytest.mark.parametrize("name, case", list(fixture_cases()))
def test_the_models_own_template_gives_apply_chat_templates_ids(prompters, name, case):
    if name not in prompters:
        prompters[name] = prompter(os.path.join(FIXTURES, name))
    extra = {key: value for key, value in case.items() if key not in CASE_FIELDS}  # e.g. enable_thinking
    request = llm_session.TokenizeRequest(
        name,
        messages=case["messages"],
        tools=case.get("tools"),
        add_generation_prompt=case["add_generation_prompt"],
        chat_template_kwargs=extra or None,
    )
    wire = llm_session.read_tokenize_request(llm_session.tokenize_request(request))  # as the worker gets it
    if "error" in case:  # the template's raise_exception: the client's error, with the template's message
        with pytest.raises(errors.InvalidInputs) as refused:
            prompters[name].tokenize(wire)
        assert refused.value.message == case["error"]
        return
    tokenized = prompters[name].tokenize(wire)
    assert tokenized.prompt == case["text"]
    assert tokenized.token_ids == case["ids"]


def test_tool_calls_and_tools_reach_the_template_through_the_wire():
    with open(os.path.join(FIXTURES, "qwen2", "expected.json"), encoding="utf-8") as stream:
        case = next(c for c in json.load(stream)["chat"]["cases"] if c["name"] == "tool_call_round_trip")
    assert any("tool_calls" in m for m in case["messages"])
    request = llm_session.TokenizeRequest("qwen2", messages=case["messages"], tools=case["tools"])
    wire = llm_session.read_tokenize_request(llm_session.tokenize_request(request))
    assert wire.messages == [{"content": m.get("content"), **m} for m in case["messages"]]
    assert wire.tools == case["tools"]
    without_tools = prompter(os.path.join(FIXTURES, "qwen2")).chat(case["messages"][:1])
    assert "get_weather" not in without_tools.text


def test_openai_style_tool_calls_render_as_the_templates_expect():
    """OpenAI sends a call's arguments as JSON text and ids beside it: the template gets the arguments object and
    renders transformers' text (the oracle's messages give it the object)."""
    with open(os.path.join(FIXTURES, "qwen2", "expected.json"), encoding="utf-8") as stream:
        case = next(c for c in json.load(stream)["chat"]["cases"] if c["name"] == "tool_call_round_trip")
    messages = json.loads(json.dumps(case["messages"]))
    call = messages[1]["tool_calls"][0]
    call["id"] = "call_abc"
    call["function"]["arguments"] = json.dumps(call["function"]["arguments"], separators=(",", ":"))
    messages[2]["tool_call_id"] = "call_abc"
    request = llm_session.TokenizeRequest("qwen2", messages=messages, tools=case["tools"])
    tokenized = prompter(os.path.join(FIXTURES, "qwen2")).tokenize(
        llm_session.read_tokenize_request(llm_session.tokenize_request(request))
    )
    assert (tokenized.prompt, tokenized.token_ids) == (case["text"], case["ids"])
    assert call["function"]["arguments"] == '{"city":"Paris"}'  # the request's messages are left as they were
    call["function"]["arguments"] = "not json"  # passed as sent
    assert "not json" in prompter(os.path.join(FIXTURES, "qwen2")).chat(messages, tools=case["tools"]).text


@pytest.mark.parametrize(
    "name, parser",
    [("qwen2", "hermes"), ("qwen3", "hermes"), ("llama3", None), ("llama2_linear", None), ("mistral", None)],
)
def test_the_tool_call_format_a_models_template_prompts_for(name, parser):
    assert detect_tool_call_parser(prompter(os.path.join(FIXTURES, name)).tools_template_text) == parser


def test_a_generation_and_tokenize_agree_on_the_chats_ids():
    qwen = prompter(os.path.join(FIXTURES, "llama3"))
    messages = [{"role": "user", "content": "hi"}]
    chat = qwen.chat(messages)
    assert chat.token_ids.count(qwen.tokenizer.bos_id) == 1  # the template's BOS, not a second from the tokenizer
    assert qwen.tokenize(llm_session.TokenizeRequest("m", messages=messages)).token_ids == list(chat.token_ids)
    both = qwen.tokenize(llm_session.TokenizeRequest("m", messages=messages, add_special_tokens=True)).token_ids
    assert both[:2] == [qwen.tokenizer.bos_id] * 2  # asked for: the tokenizer's BOS too, as HF would do


# --- the bundled model ------------------------------------------------------------------------------------


def test_the_bundled_template_renders_what_its_old_format_string_did():
    bundled = prompter(BUNDLED_TOKENIZER)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "bye"},
    ]
    old_text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"
    chat = bundled.chat(messages)
    assert chat.text == "<s>" + old_text
    assert chat.token_ids == bundled.tokenizer.encode(old_text)  # the ids the old format string gave
    legacy = Prompter(
        bundled.tokenizer,
        SimpleNamespace(chat_template="{messages}<|assistant|>\n", chat_message="<|{role}|>\n{content}\n"),
        100_000,
    )
    assert legacy.chat(messages) == (old_text, chat.token_ids)


def test_a_model_without_a_template_refuses_chats(tmp_path):
    with open(BUNDLED_TOKENIZER, "rb") as source:
        (tmp_path / "tokenizer.json").write_bytes(source.read())
    bare = prompter(str(tmp_path))
    with pytest.raises(errors.InvalidInputs, match="^" + re.escape(NO_TEMPLATE)):
        bare.chat([{"role": "user", "content": "hi"}])
    assert bare.tokenize(llm_session.TokenizeRequest("m", prompt="hi")).token_ids == bare.tokenizer.encode("hi")


def test_a_configured_template_wins_over_the_models_own():
    own = prompter(
        BUNDLED_TOKENIZER, SimpleNamespace(chat_template="{{ eos_token }}{{ messages[0].content }}", chat_message=None)
    )
    assert own.chat([{"role": "user", "content": "hi"}]).text == "</s>hi"


# --- Hugging Face's conventions ---------------------------------------------------------------------------


def render(template, messages=(), **kwargs):
    return ChatTemplate(template, {"bos_token": "<s>"}).render(list(messages), **kwargs)


def test_tojson_is_hfs():
    value = {"city": "Zürich", "html": "<b>&"}
    assert render("{{ x | tojson }}", x=value) == json.dumps(value, ensure_ascii=False)
    assert render("{{ x | tojson(indent=2) }}", x=value) == json.dumps(value, ensure_ascii=False, indent=2)


def test_raise_exception_is_a_client_error_with_the_templates_message():
    with pytest.raises(ChatTemplateError, match="^Conversation roles must alternate$") as refused:
        render("{{ raise_exception('Conversation roles must alternate') }}")
    assert isinstance(refused.value, errors.InvalidInputs)


def test_strftime_now_loop_controls_and_generation_blocks():
    today = datetime.datetime.now().strftime("%d %b %Y")
    assert render("{{ strftime_now('%d %b %Y') }}") in (today, datetime.datetime.now().strftime("%d %b %Y"))
    looped = render(
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.content }}{% endfor %}",
        [{"content": c} for c in "abcd"],
    )
    assert looped == "ab"
    assert render("{% generation %}{{ bos_token }}x{% endgeneration %}") == "<s>x"


def test_trim_blocks_and_lstrip_blocks_as_hf():
    assert render("  {% if true %}\nA\n  {% endif %}\nB") == "A\nB"


def test_tools_documents_and_generation_prompt_reach_the_template():
    template = "{{ tools | length }}|{{ documents[0].title }}|{{ add_generation_prompt }}|{{ tools is none }}"
    assert render(template, tools=[{"a": 1}], documents=[{"title": "T"}]) == "1|T|True|False"
    assert render("{{ tools is none }}{{ documents is none }}") == "TrueTrue"


@pytest.mark.parametrize(
    "template, message",
    [
        ("{{ messages[0].content.upper() }}", "'dict object' has no attribute 'content'"),
        ("{{ nothing.here }}", "'nothing' is undefined"),
        ("{{ messages.append(1) }}", "unsafe"),
        ("{{ ''.__class__.__mro__ }}", ""),
    ],
)
def test_failures_and_sandbox_refusals_are_client_errors(template, message):
    try:
        text = render(template, [{"role": "user"}])
    except ChatTemplateError as err:
        assert err.message.startswith("the chat template failed on these messages") and message in err.message
    else:  # the sandbox renders unsafe attributes as undefined (empty)
        assert not message and text == ""


def test_continue_final_message():
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</>\n{% endfor %}"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    assert (
        render(template, messages, add_generation_prompt=False, continue_final_message=True)
        == "<user>hi</>\n<assistant>Hel"
    )
    with pytest.raises(ChatTemplateError, match="cannot both be set"):
        render(template, messages, continue_final_message=True)


def test_a_template_that_does_not_compile_is_refused_when_loaded():
    with pytest.raises(ValueError, match=r"not valid Jinja: .* \(line 1\)"):
        ChatTemplate("{% for m in messages %}")


def test_named_templates_pick_default_or_tool_use():
    named = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    assert (select_template(named), select_template(named, tools=True)) == ("D", "T")
    assert select_template(named[:1], tools=True) == "D"
    with pytest.raises(ValueError, match="none named 'default'"):
        select_template(named[1:])
    assert select_template("S", tools=True) == "S"


def test_legacy_template_renders_as_before():
    legacy = LegacyChatTemplate("{messages}<|assistant|>\n", "<|{role}|>\n{content}\n")
    assert legacy.render([{"role": "user", "content": "hi"}]) == "<|user|>\nhi\n<|assistant|>\n"
    assert legacy.add_special_tokens and not ChatTemplate("x").add_special_tokens


# --- generation defaults ----------------------------------------------------------------------------------


def test_generation_defaults_from_the_models_config():
    defaults = GenerationDefaults.from_config(
        {"eos_token_id": [508, 511], "temperature": 0.6, "top_p": 0.9, "do_sample": True, "bos_token_id": 507}
    )
    assert defaults.sampling == {"temperature": 0.6, "top_p": 0.9}
    assert defaults.stop_ids(tokenizer_eos=511) == (508, 511)
    assert defaults.apply({"temperature": 0.0, "max_new_tokens": 5}) == {
        "temperature": 0.0,
        "top_p": 0.9,
        "max_new_tokens": 5,
    }
    assert GenerationDefaults.from_config({"eos_token_id": 2}).stop_ids(7) == (2,)
    assert GenerationDefaults().stop_ids(7) == (7,) and GenerationDefaults().stop_ids(None) == ()


@pytest.mark.parametrize(
    "data, message",
    [
        ({"eos_token_id": "2"}, "eos_token_id must be a token id or a list"),
        ({"eos_token_id": []}, "eos_token_id must be"),
        ({"top_k": -5}, "top_k must be an int >= -1"),
        ([], "must hold a JSON object"),
    ],
)
def test_bad_generation_defaults_are_named(data, message):
    with pytest.raises(ValueError, match=message):
        GenerationDefaults.from_config(data)


def test_every_fixtures_generation_config_loads():
    for name in ("llama2_linear", "llama3", "mistral", "qwen2", "qwen3"):
        with open(os.path.join(FIXTURES, name, "generation_config.json"), encoding="utf-8") as stream:
            GenerationDefaults.from_config(json.load(stream))
