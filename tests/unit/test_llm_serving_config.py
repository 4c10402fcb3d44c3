"""The LLM servable's YAML configuration: the bundled file loads, every bad field is named, CPU binding rules."""

import json
import os

import pytest
from llm_setup import CONFIG as BUNDLED
from llm_setup import bundled_config, write_config

from mindspore_serving.common.cpu_affinity import bind_process
from mindspore_serving.spec.llm_config import AgentSection, ConfigError, load_serving_config


def write(tmp_path, change):
    """The bundled config with absolute paths, changed by `change(data)`, written to tmp_path."""
    data = bundled_config()
    change(data)
    return write_config(tmp_path, start_port=data["agents"].get("start_port", 0), data=data)


def test_bundled_config_loads():
    config = load_serving_config(BUNDLED)
    assert config.agents.warmup  # the default: graphs compiled before the agent reports ready
    assert config.engine.max_num_seqs == 16 and config.engine.block_size == 16
    assert config.agents.cpu_affinity == "auto" and config.agents.num_ranks == 1
    assert config.stats_interval == 10.0 and config.request_timeout == 0.0
    assert config.with_agent_port(0).agents == AgentSection(
        config.agents.device_type, config.agents.device_ids, config.agents.host, 0, "auto"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["engine"].update(num_blockz=3), r"'engine' has unknown field\(s\) \['num_blockz'\]"),
        (lambda d: d["agents"].update(device_ids=[]), "'agents.device_ids' must be a non-empty list"),
        (lambda d: d["agents"].update(device_type="TPU"), "'agents.device_type' must be CPU, GPU, Ascend or null"),
        (lambda d: d["agents"].update(start_port=70000), "'agents.start_port' must be 0"),
        (lambda d: d["agents"].update(cpu_affinity="all"), "'agents.cpu_affinity' must be null, auto"),
        (lambda d: d["agents"].update(warmup="no"), "'agents.warmup' must be true or false, got 'no'"),
        (lambda d: d["agents"].update(cpu_affinity=[[0], [1]]), r"one non-empty list of core ids >= 0 per rank \(1"),
        (lambda d: d["agents"].update(cpu_affinity=[[-1]]), "'agents.cpu_affinity' must be"),
        (lambda d: d["engine"].update(max_model_len=100000), "'engine.max_model_len' 100000 exceeds"),
        (lambda d: d["engine"].update(block_size=8), "'engine.block_size' is 8 but the graphs were exported with"),
        (lambda d: d["engine"].update(max_queue_size=0), "'engine.max_queue_size' must be an int >= 1"),
        (lambda d: d["engine"].update(request_timeout=-1), "'engine.request_timeout' must be a number of seconds"),
        (lambda d: d["engine"].update(stats_interval="often"), "'engine.stats_interval' must be a number of seconds"),
        (
            lambda d: d["model"].update(chat_template="no_such.jinja"),
            r"'model.chat_template': '.*no_such.jinja' does "
            r"not exist",
        ),
        (
            lambda d: d["model"].update(chat_template="{% for m in messages %}"),
            r"'model.chat_template' "
            r"\(model.chat_template\): the chat "
            r"template is not valid Jinja",
        ),
        (
            lambda d: d["model"].update(chat_template="{{ x }}", chat_message="{role}"),
            "'model.chat_message' goes only with an old-style",
        ),
        (lambda d: d["model"].update(chat_message="{role}"), "'model.chat_message' goes with an old-style"),
        (lambda d: d["model"].update(generation_config="missing.json"), "'model.generation_config': .* does not exist"),
        (
            lambda d: d["model"].update(tool_call_parser="mistral"),
            r"'model.tool_call_parser' must be one of \['hermes', "
            r"'llama3_json'\] or null",
        ),
        (lambda d: d["model"].pop("config"), "'model.config' is missing"),
        (lambda d: d.update(extra={}), r"'<top level>' has unknown field\(s\) \['extra'\]"),
    ],
)
def test_bad_fields_are_named(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_serving_config(write(tmp_path, change))


def test_explicit_cpu_affinity_per_rank(tmp_path):
    path = write(tmp_path, lambda d: d["agents"].update(device_ids=[0, 1], cpu_affinity=[[0, 1], [2]]))
    agents = load_serving_config(path).agents
    assert agents.cpus_of(0, "CPU") == [0, 1] and agents.cpus_of(1, "GPU") == [2]


@pytest.mark.parametrize(
    "ranks, cores, expected",
    [
        (1, 2, [[1]]),  # a small host: the agent on the last core, core 0 left to the others
        (1, 16, [list(range(1, 16))]),
        (2, 16, [list(range(9, 16)), list(range(2, 9))]),
        (1, 1, [[0]]),
        (3, 2, [[0], [1], [0]]),  # more ranks than cores: one core each, shared
    ],
)
def test_auto_cpu_affinity_shares_all_cores_but_one(ranks, cores, expected):
    agents = AgentSection(device_ids=tuple(range(ranks)), cpu_affinity="auto")
    assert [agents.cpus_of(rank, "CPU", cpu_count=cores) for rank in range(ranks)] == expected


def test_no_binding_off_cpu_or_when_unset():
    assert AgentSection(cpu_affinity="auto").cpus_of(0, "GPU", cpu_count=8) is None
    assert AgentSection(cpu_affinity="auto").cpus_of(0, "Ascend", cpu_count=8) is None
    assert AgentSection().cpus_of(0, "CPU", cpu_count=8) is None


def test_bind_sets_every_thread_of_the_process():
    import threading

    before = os.sched_getaffinity(0)
    started, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), release.wait(10)))
    thread.start()
    started.wait(10)
    core = sorted(before)[-1]
    try:
        assert bind_process(AgentSection(cpu_affinity=((core,),)).cpus_of(0, "CPU")) == [core]
        assert all(os.sched_getaffinity(int(t)) == {core} for t in os.listdir("/proc/self/task"))
        assert bind_process(AgentSection().cpus_of(0, "CPU")) is None
    finally:
        release.set()
        thread.join()
        bind_process(sorted(before))


def test_stats_interval_and_agent_port_survive_replacement(tmp_path):
    config = load_serving_config(write(tmp_path, lambda d: d["engine"].update(stats_interval=0, request_timeout=5)))
    moved = config.with_agent_port(7300)
    assert (moved.stats_interval, moved.request_timeout, moved.agents.start_port) == (0.0, 5.0, 7300)


def test_chat_template_forms(tmp_path):
    (tmp_path / "chat.jinja").write_text("{{ bos_token }}{{ messages[0].content }}", encoding="utf-8")
    model = load_serving_config(write(tmp_path, lambda d: d["model"].update(chat_template="chat.jinja"))).model
    assert (model.chat_template, model.chat_message) == ("{{ bos_token }}{{ messages[0].content }}", None)
    inline = load_serving_config(write(tmp_path, lambda d: d["model"].update(chat_template="{{ messages }}"))).model
    assert (inline.chat_template, inline.chat_message) == ("{{ messages }}", None)
    legacy = load_serving_config(write(tmp_path, lambda d: d["model"].update(chat_template="{messages}>"))).model
    assert (legacy.chat_template, legacy.chat_message) == ("{messages}>", "<|{role}|>\n{content}\n")
    assert load_serving_config(BUNDLED).model.chat_template is None  # the model's own, next to its tokenizer


def test_tool_call_parser_named_or_left_to_the_chat_template(tmp_path):
    assert load_serving_config(BUNDLED).model.tool_call_parser is None
    named = write(tmp_path, lambda d: d["model"].update(tool_call_parser="llama3_json"))
    assert load_serving_config(named).model.tool_call_parser == "llama3_json"


def test_generation_config_next_to_the_tokenizer_or_named(tmp_path):
    tokenizer = bundled_config()["model"]["tokenizer"]
    (tmp_path / "tokenizer.json").write_bytes(open(tokenizer, "rb").read())
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [5, 7], "temperature": 0.6, "top_p": 0.9, "do_sample": True}), encoding="utf-8"
    )
    next_to = write(tmp_path, lambda d: d["model"].update(tokenizer=str(tmp_path / "tokenizer.json")))
    model = load_serving_config(next_to).model
    assert model.generation_config == str(tmp_path / "generation_config.json")
    assert model.generation_defaults.sampling == {"temperature": 0.6, "top_p": 0.9}
    assert model.generation_defaults.eos_token_ids == (5, 7)
    (tmp_path / "bad.json").write_text(json.dumps({"top_p": 2}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"'model.generation_config' \(bad.json\): top_p must be in \(0, 1\]"):
        load_serving_config(write(tmp_path, lambda d: d["model"].update(generation_config="bad.json")))
    assert load_serving_config(BUNDLED).model.generation_defaults.eos_token_ids == ()
