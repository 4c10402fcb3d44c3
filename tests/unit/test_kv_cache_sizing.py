"""engine.kv_cache_memory and engine.kv_cache_memory_fraction end to end without MindSpore: the configuration
turns a budget into engine.num_blocks with a (fake) rank manifest, the agents' starter measures a fraction once and
hands every agent its blocks, and the worker's engine takes the blocks its agents hold."""

import json
import os

import pytest
from llm_setup import bundled_config, write_config

from mindspore_serving.llm.kv_budget import FRACTION, MEMORY, NUM_BLOCKS, KvCacheCapacity
from mindspore_serving.spec.llm_config import ConfigError, load_serving_config
from mindspore_serving.worker.llm import agents as agents_module
from mindspore_serving.worker.llm import kv_cache
from mindspore_serving.worker.llm.runtime import LlmRuntime

BLOCK = 4 * 2 * 16 * 2 * 32 * 4  # the tiny model's rank: 4 layers, K and V, 16 tokens, 2 heads of 32, float32
MANIFEST = {
    "block_size": 16,
    "max_seq_len": 256,
    "cache": {"num_layers": 4, "num_kv_heads": 2, "head_dim": 32, "dtype": "float32"},
}
WEIGHTS = 1 << 20


@pytest.fixture
def graphs(tmp_path):
    """A rank directory with a manifest and 1 MiB of "weights"."""
    directory = tmp_path / "rank_0"
    directory.mkdir()
    (directory / "manifest.json").write_text(json.dumps(MANIFEST), encoding="utf-8")
    (directory / "weights.bin").write_bytes(b"\0" * WEIGHTS)
    return directory


def config_with(tmp_path, graphs_dir, device_type="CPU", **engine):
    data = bundled_config()
    data["model"]["graphs"] = [str(graphs_dir)]
    data["engine"].pop("num_blocks")
    data["agents"]["device_type"] = device_type
    return write_config(tmp_path, data=data, **engine)


def test_kv_cache_memory_gives_the_blocks(tmp_path, graphs):
    config = load_serving_config(config_with(tmp_path, graphs, kv_cache_memory="16MiB"))
    assert config.kv_cache.kind == MEMORY and config.kv_cache.value == 16 << 20
    assert config.engine.num_blocks == 512
    assert load_serving_config(config_with(tmp_path, graphs, kv_cache_memory=17 * BLOCK)).engine.num_blocks == 17


def test_too_little_kv_cache_memory_is_refused_at_load(tmp_path, graphs):
    with pytest.raises(
        ConfigError,
        match=r"^'engine.kv_cache_memory': too little memory for even one sequence: "
        r"557056 bytes needed for max_model_len=256, kv_cache_memory is 556032 "
        r"\(543KiB\)$",
    ):
        load_serving_config(config_with(tmp_path, graphs, kv_cache_memory="543KiB"))
    with pytest.raises(ConfigError, match="engine.kv_cache_memory 'lots' is not a size"):
        load_serving_config(config_with(tmp_path, graphs, kv_cache_memory="lots"))


def test_only_one_way_of_sizing(tmp_path, graphs):
    with pytest.raises(
        ConfigError,
        match="give only one of engine.num_blocks, engine.kv_cache_memory and engine.kv_cache_memory_fraction",
    ):
        load_serving_config(config_with(tmp_path, graphs, num_blocks=64, kv_cache_memory_fraction=0.5))
    config = load_serving_config(config_with(tmp_path, graphs))  # none given: num_blocks' default, as before
    assert config.kv_cache.kind == NUM_BLOCKS and config.engine.num_blocks == 1024


def test_before_the_export_a_budget_loads_with_the_least_blocks(tmp_path):
    config = load_serving_config(config_with(tmp_path, tmp_path / "not_exported", kv_cache_memory="1GiB"))
    assert config.engine.num_blocks == 17  # one sequence of 256 and the scratch block, until the graphs exist


def test_fraction_is_measured_once_for_the_ranks_started(tmp_path, graphs):
    config = load_serving_config(config_with(tmp_path, graphs, kv_cache_memory_fraction=0.5))
    assert config.kv_cache.kind == FRACTION and config.engine.num_blocks == 17
    weights = kv_cache.weight_bytes(str(graphs))
    assert WEIGHTS < weights < WEIGHTS + 1024  # the weights file and the manifest
    available = 64 << 20
    assert kv_cache.measured_num_blocks(config, [0], available) == (available // 2 - weights) // BLOCK
    with pytest.raises(
        RuntimeError,
        match=r"engine.kv_cache_memory_fraction: too little memory for even one "
        r"sequence: 557056 bytes needed for max_model_len=256, kv_cache_memory "
        r"is -\d+ \(0.5 of 2 MiB available, less 1.0 MiB of weights",
    ):
        kv_cache.measured_num_blocks(config, [0], 2 << 20)
    memory = load_serving_config(config_with(tmp_path, graphs, kv_cache_memory="16MiB"))
    assert kv_cache.measured_num_blocks(memory, [0]) is None  # every process computes it alike


def test_fraction_is_refused_off_cpu(tmp_path, graphs):
    config = load_serving_config(config_with(tmp_path, graphs, device_type="GPU", kv_cache_memory_fraction=0.9))
    with pytest.raises(
        RuntimeError, match="measured on CPU hosts only; the agents run on GPU.*give engine.kv_cache_memory"
    ):
        kv_cache.measured_num_blocks(config, [0], 1 << 30)


def test_mem_available():
    text = "MemTotal:       16303156 kB\nMemFree:         1024 kB\nMemAvailable:    8151578 kB\n"
    assert kv_cache.mem_available(text) == 8151578 * 1024
    with pytest.raises(ValueError, match="no MemAvailable"):
        kv_cache.mem_available("MemTotal: 1 kB\n")
    assert kv_cache.host_available_bytes() > 0


def test_agents_get_the_measured_blocks(monkeypatch):
    started = []

    class FakePopen:
        def __init__(self, args, **_):
            started.append(args)
            self.stdin = open(os.devnull, "wb")  # pylint: disable=consider-using-with

    monkeypatch.setattr(agents_module.subprocess, "Popen", FakePopen)
    for blocks in (None, 300):
        _, read_fd = agents_module._spawn("llm.yaml", 0, "unix:x", None, "", blocks)
        os.close(read_fd)
    assert not any(arg.startswith("--num_blocks") for arg in started[0])
    assert started[1][-1] == "--num_blocks=300"


class FakeRunner:
    num_blocks = 300


def test_the_engine_takes_the_blocks_the_agents_hold(tmp_path, graphs):
    runtime = LlmRuntime.__new__(LlmRuntime)  # its agents are what this fakes
    runtime.runner = FakeRunner()
    runtime.config = load_serving_config(config_with(tmp_path, graphs, kv_cache_memory_fraction=0.5))
    scheduler = runtime._scheduler_config()  # pylint: disable=protected-access
    assert scheduler.num_blocks == 300 and scheduler.max_num_seqs == runtime.config.engine.max_num_seqs
    assert kv_cache.capacity(runtime.config, 300) == KvCacheCapacity(300, 16, 256, BLOCK)
    runtime.config = load_serving_config(config_with(tmp_path, graphs, num_blocks=64))
    assert runtime._scheduler_config().num_blocks == 64  # pylint: disable=protected-access
