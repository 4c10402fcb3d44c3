"""Serving a Hugging Face directory: the settings, export and key (spec/hf_serving.py), and the model cache and its
refusals (worker/llm/hf_model.py) with the exporting process replaced by one that writes the manifests only.
The export is the dynamic-shape step graphs, the same for any batch and prompt length: block size 16, max_model_len
rounded up to it. The engine's settings (max_num_seqs, default 32; max_num_batched_tokens, default 512 or twice the
decode tokens of a full batch with its proposals) are llm.yaml's, not the export's. Speculative decoding
(--speculative_config, declare_llm's speculative_config): parsed and refused as vLLM's JSON object, it sets
engine.speculative and leaves the export and its key as they are (any export verifies proposals).

A directory is exported once per key: the same checkpoint and export settings are served from the first export
(whatever the engine's settings and speculation), a changed weights byte, max_model_len or tensor parallelism
exports again, an interrupted export (no marker) exports again. A missing file, a bad checkpoint, heads that tensor
parallelism does not divide and a KV budget too small for one sequence are refused before anything is exported;
engine settings that do not fit each other (max_num_batched_tokens below max_num_seqs) when llm.yaml is loaded.
tests/e2e/test_hf_serving.py serves the fixtures for real.
"""

import dataclasses
import json
import os
import shutil
import threading

import pytest
import yaml

from mindspore_serving.llm.config import SpeculativeConfig
from mindspore_serving.models.llama.config import ExportConfig, LlamaConfig, ModelFile
from mindspore_serving.server import register
from mindspore_serving.spec import hf_serving as plan
from mindspore_serving.spec.hf_serving import HfModelError, HfModelSettings
from mindspore_serving.spec.llm import LlmDeclaration
from mindspore_serving.spec.llm_config import load_serving_config
from mindspore_serving.spec.registry import get_servable_spec, reset_registry
from mindspore_serving.worker.llm import hf_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf")


@pytest.fixture
def exports(monkeypatch):
    """The exporting processes run (their argv); each writes only the manifests of its ranks."""
    runs = []

    def fake(argv, name):
        args = dict(a[2:].split("=", 1) for a in argv if a.startswith("--"))
        model_file = yaml.safe_load(open(args["config"], encoding="utf-8"))
        m, tp = model_file["model"], int(args["tensor_parallel"])
        for rank in range(tp):
            os.makedirs(os.path.join(args["out"], f"rank_{rank}"))
            manifest = {
                "block_size": 16,
                "cache": {
                    "num_layers": m["num_layers"],
                    "num_kv_heads": m["num_kv_heads"] // tp,
                    "head_dim": m.get("head_dim", 16),
                },
            }
            with open(os.path.join(args["out"], f"rank_{rank}", "manifest.json"), "w", encoding="utf-8") as f:
                json.dump(manifest, f)
        runs.append(args)

    monkeypatch.setattr(hf_model, "run_export", fake)
    return runs


@pytest.fixture
def qwen2(tmp_path):
    """A copy of the qwen2 fixture (its files may be changed)."""
    return shutil.copytree(os.path.join(FIXTURES, "qwen2"), str(tmp_path / "Qwen2.5-tiny"))


def settings(model_dir, cache, **values):
    return HfModelSettings.create(model_dir, model_cache=str(cache), **values)


CFG = LlamaConfig(
    vocab_size=512,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    max_seq_len=128,
)


def test_names_lengths_and_export():
    assert plan.default_served_name("/models/Qwen2.5-0.5B-Instruct/") == "Qwen2_5-0_5B-Instruct"
    base = settings("/m/llama", "/c")
    assert base.served_model_name == "llama"
    assert (base.max_num_seqs, base.max_num_batched_tokens, base.speculative) == (None, None, None)
    assert plan.served_max_model_len(base, 131072) == 2048 and plan.served_max_model_len(base, 1024) == 1024
    assert plan.served_max_model_len(base, None) == 2048
    with pytest.raises(HfModelError, match="max_model_len 4096 exceeds the model's max_position_embeddings 1024"):
        plan.served_max_model_len(settings("/m/x", "/c", max_model_len=4096), 1024)
    # one export whatever the batch and prompt lengths: the network holding max_model_len rounded up to the block
    assert plan.graph_len(100) == 112 and plan.graph_len(128) == 128 and plan.graph_len(10) == 16
    for max_model_len in (100, 2048):
        model_file = plan.export_model_file(base, CFG, max_model_len)
        assert model_file.export == ExportConfig(block_size=16) and model_file.export.to_dict() == {"block_size": 16}
        assert model_file.model == dataclasses.replace(CFG, max_seq_len=plan.graph_len(max_model_len))
    assert not hasattr(plan, "default_buckets") and not hasattr(plan, "BUCKET_FIELDS")
    # create's positional order: model_dir, served_model_name, model_cache, speculative_config (serving_server.py's
    # and declare_llm's)
    positional = HfModelSettings.create("/m/x", "x", "/c", {"num_speculative_tokens": 2}, max_num_seqs=4)
    assert positional == HfModelSettings(
        "/m/x", "x", "/c", max_num_seqs=4, speculative=SpeculativeConfig(num_speculative_tokens=2)
    )
    with pytest.raises(TypeError, match="buckets"):  # the per-shape graphs' buckets are gone with them
        settings("/m/llama", "/c", buckets={"decode_batch_buckets": [1, 2]})


@pytest.mark.parametrize(
    "values, message",
    [
        ({"served_model_name": "a/b"}, "served model name 'a/b' is not valid"),
        ({"tensor_parallel": 0}, "tensor_parallel must be an int >= 1"),
        ({"max_model_len": 1}, "max_model_len must be an int >= 2"),
        ({"kv_cache_memory": "2 parsecs"}, "kv_cache_memory '2 parsecs' is not a size"),
        ({"max_num_seqs": 0}, "max_num_seqs must be an int >= 1, got 0"),
        ({"max_num_seqs": "8"}, "max_num_seqs must be an int >= 1, got '8'"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be an int >= 1, got 0"),
        ({"max_num_batched_tokens": True}, "max_num_batched_tokens must be an int >= 1, got True"),
        ({"tensor_parallel": 2, "device_ids": (0,)}, r"1 device id\(s\) \[0\] for tensor_parallel=2"),
    ],
)
def test_bad_settings_are_named(values, message):
    with pytest.raises(HfModelError, match=message):
        settings("/m/llama", "/c", **values)


def test_speculative_config_is_vllms_json_object():
    spec = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=3)
    assert (
        plan.parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}')
        == spec
        == plan.parse_speculative_config({"num_speculative_tokens": 3, "prompt_lookup_max": 3})
    )
    assert plan.parse_speculative_config("null") is None and plan.parse_speculative_config(None) is None
    assert plan.speculative_per_model([], 2) == (None, None)
    assert plan.speculative_per_model(['{"num_speculative_tokens": 3, "prompt_lookup_max": 3}'], 2) == (spec, spec)
    assert plan.speculative_per_model(["null", '{"num_speculative_tokens": 3, "prompt_lookup_max": 3}'], 2) == (
        None,
        spec,
    )
    with pytest.raises(HfModelError, match=r"speculative_config is given 2 time\(s\) for 3 model\(s\)"):
        plan.speculative_per_model(["null", "null"], 3)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"method": "ngram",', r"speculative_config '\{\"method\": \"ngram\",' is not JSON \(Expecting"),
        ("[4]", r"must be an object of SpeculativeConfig fields \(or null: off\), got \[4\]"),
        (
            '{"method": "ngram", "model": "draft"}',
            r"unknown SpeculativeConfig fields \['model'\]; known: "
            r"\['disable_by_batch_size', 'method'",
        ),
        ('{"method": "eagle"}', r"SpeculativeConfig.method must be one of \('ngram',\), got 'eagle'"),
        ('{"num_speculative_tokens": 0}', "SpeculativeConfig.num_speculative_tokens must be >= 1, got 0"),
        ('{"prompt_lookup_min": 3, "prompt_lookup_max": 2}', "prompt_lookup_max=2 is below prompt_lookup_min=3"),
    ],
)
def test_bad_speculative_configs_are_refused(text, message):
    with pytest.raises(HfModelError, match=message):
        settings("/m/llama", "/c", speculative_config=text)


def test_speculation_leaves_the_export_and_its_key(monkeypatch):
    files = {"config.json": "0" * 64}
    plain = plan.export_model_file(settings("/m/llama", "/c"), CFG, 128)
    assert "spec_tokens" not in plain.to_dict()["export"]
    key = plan.cache_key(files, plain, 1)
    spec = settings("/m/llama", "/c", speculative_config={"num_speculative_tokens": 3, "disable_by_batch_size": 8})
    model_file = plan.export_model_file(spec, CFG, 128)
    assert model_file == plain and plan.cache_key(files, model_file, 1) == key
    many = settings("/m/llama", "/c", speculative_config={"num_speculative_tokens": 8, "prompt_lookup_max": 2})
    assert plan.export_model_file(many, CFG, 128) == plain
    # the key: the files' content, the network (max_seq_len: max_model_len rounded up to the block size), the tensor
    # parallelism and the manifest format; not the engine's settings
    assert plan.cache_key(files, plan.export_model_file(settings("/m/llama", "/c"), CFG, 120), 1) == key
    engine_only = settings("/m/llama", "/c", max_num_seqs=4, max_num_batched_tokens=64, kv_cache_memory="1MiB")
    assert plan.cache_key(files, plan.export_model_file(engine_only, CFG, 128), 1) == key
    others = {
        plan.cache_key({"config.json": "1" * 64}, plain, 1),
        plan.cache_key(files, plan.export_model_file(settings("/m/llama", "/c"), CFG, 96), 1),
        plan.cache_key(files, plain, 2),
        plan.cache_key(files, ModelFile(plain.model, ExportConfig(block_size=32)), 1),
    }
    assert len(others) == 4 and key not in others
    assert plan.MANIFEST_VERSION == 3  # the step graphs' format: a cache of the per-shape graphs is exported again
    with monkeypatch.context() as patch:
        patch.setattr(plan, "MANIFEST_VERSION", 2)
        assert plan.cache_key(files, plain, 1) != key

    engine = plan.llm_config(spec, model_file, 128, "tokenizer.json", None)["engine"]
    assert engine["speculative"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 4,
        "disable_by_batch_size": 8,
    }
    unspeculative = plan.llm_config(settings("/m/llama", "/c"), plain, 128, "t.json", None)["engine"]
    assert "speculative" not in unspeculative


def test_max_num_seqs_and_max_num_batched_tokens_are_the_engines():
    """llm.yaml's engine.max_num_seqs: the setting, else 32; engine.max_num_batched_tokens: the setting, else 512,
    or twice the decode tokens of a full batch, each row with its proposed tokens, when that is more."""
    model_file = plan.export_model_file(settings("/m/llama", "/c"), CFG, 128)

    def engine(**values):
        return plan.llm_config(settings("/m/llama", "/c", **values), model_file, 128, "t.json", None)["engine"]

    assert plan.DEFAULT_MAX_NUM_SEQS == 32 and plan.DEFAULT_MAX_NUM_BATCHED_TOKENS == 512
    assert (engine()["max_num_seqs"], engine()["max_num_batched_tokens"]) == (32, 512)
    three = {"num_speculative_tokens": 3}
    assert engine(speculative_config=three)["max_num_batched_tokens"] == 512  # 2 * 32 * (1 + 3) = 256
    assert engine(speculative_config={"num_speculative_tokens": 8})["max_num_batched_tokens"] == 2 * 32 * 9
    assert engine(max_num_seqs=300)["max_num_batched_tokens"] == 600
    assert engine(max_num_seqs=64, speculative_config=three)["max_num_batched_tokens"] == 2 * 64 * 4
    given = engine(max_num_seqs=4, max_num_batched_tokens=64, speculative_config=three)
    assert (given["max_num_seqs"], given["max_num_batched_tokens"]) == (4, 64)
    assert engine(max_num_seqs=4)["max_num_batched_tokens"] == 512
    assert engine(max_num_batched_tokens=1000)["max_num_seqs"] == 32


def test_a_speculating_model_shares_the_plain_models_export(qwen2, tmp_path, exports):
    lines = []
    prepared = hf_model.prepare(
        settings(
            qwen2,
            tmp_path / "cache",
            max_model_len=128,
            speculative_config=('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'),
        ),
        lines.append,
    )
    assert lines[1] == f"Qwen2_5-tiny: exporting the step graphs into {prepared.cache_dir} (max_model_len 128)"
    config = load_serving_config(prepared.config_file)
    assert config.engine.speculative == SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=4)
    assert config.model_file().export == ExportConfig(block_size=16)
    assert config.engine.max_num_batched_tokens == 512  # 2 * 32 * (1 + 4) = 320 is less
    plain = hf_model.prepare(settings(qwen2, tmp_path / "cache", max_model_len=128), lines.append)
    assert not plain.exported and plain.cache_dir == prepared.cache_dir and len(exports) == 1
    assert lines[-2] == f"Qwen2_5-tiny: using the graphs exported at {prepared.cache_dir}"
    assert load_serving_config(plain.config_file).engine.speculative is None


def test_an_export_is_used_until_its_content_or_settings_change(qwen2, tmp_path, exports):
    cache = tmp_path / "cache"
    lines = []
    first = hf_model.prepare(settings(qwen2, cache, max_model_len=128), lines.append)
    assert first.exported and first.name == "Qwen2_5-tiny" and len(exports) == 1
    assert os.path.basename(first.cache_dir).startswith("Qwen2_5-tiny-")
    assert lines[0].startswith("Qwen2_5-tiny: file digests computed for 4 of 4 files")  # lines[0]: the digests
    assert lines[1] == f"Qwen2_5-tiny: exporting the step graphs into {first.cache_dir} (max_model_len 128)"
    config = load_serving_config(first.config_file)
    assert config.model.graphs == (os.path.join(first.cache_dir, "graphs", "rank_0"),)
    assert config.model.tokenizer == os.path.join(qwen2, "tokenizer.json")
    assert config.model.generation_config == os.path.join(qwen2, "generation_config.json")
    assert config.engine.max_model_len == 128 and config.engine.max_num_seqs == 32
    assert config.engine.max_num_batched_tokens == 512 and config.engine.speculative is None
    assert config.model_file().export == ExportConfig(block_size=16)
    assert config.engine.num_blocks == 4 * 8 + 1 and config.model_file().model.max_seq_len == 128
    with open(os.path.join(first.servable_directory, first.name, "servable_config.py"), encoding="utf-8") as f:
        assert 'register.declare_llm(config_file="../../llm.yaml")' in f.read()

    lines.clear()
    again = hf_model.prepare(settings(qwen2, cache, max_model_len=128), lines.append)
    assert not again.exported and again.cache_dir == first.cache_dir and len(exports) == 1
    assert lines[1] == f"Qwen2_5-tiny: using the graphs exported at {first.cache_dir}"
    # the engine's settings are not the graphs': the same export, another configuration
    budget = hf_model.prepare(settings(qwen2, cache, max_model_len=120, kv_cache_memory="1MiB"), lines.append)
    assert budget.cache_dir == first.cache_dir and len(exports) == 1
    assert load_serving_config(budget.config_file).engine.num_blocks == (1 << 20) // (2 * 2 * 16 * 2 * 16 * 4)
    step = hf_model.prepare(
        settings(qwen2, cache, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64), lines.append
    )
    assert not step.exported and step.cache_dir == first.cache_dir and len(exports) == 1
    with open(step.config_file, encoding="utf-8") as stream:
        written = yaml.safe_load(stream)["engine"]
    assert (written["max_num_seqs"], written["max_num_batched_tokens"]) == (4, 64)
    config = load_serving_config(step.config_file)
    assert (config.engine.max_num_seqs, config.engine.max_num_batched_tokens) == (4, 64)
    with pytest.raises(HfModelError, match="max_num_batched_tokens 8 is below max_num_seqs 16"):
        hf_model.prepare(
            settings(qwen2, cache, max_model_len=128, max_num_seqs=16, max_num_batched_tokens=8), lines.append
        )

    changed = [
        settings(qwen2, cache, max_model_len=256),
        settings(qwen2, cache, max_model_len=128, tensor_parallel=2),
    ]
    for count, each in enumerate(changed, start=2):
        assert hf_model.prepare(each, lines.append).exported and len(exports) == count
    assert exports[-1]["tensor_parallel"] == "2"
    with open(os.path.join(qwen2, "model.safetensors"), "r+b") as stream:  # one byte of a weight
        stream.seek(-1, os.SEEK_END)
        last = stream.read(1)
        stream.seek(-1, os.SEEK_END)
        stream.write(bytes([last[0] ^ 1]))
    assert hf_model.prepare(settings(qwen2, cache, max_model_len=128), lines.append).exported

    os.remove(os.path.join(first.cache_dir, plan.MARKER_FILE))  # as an interrupted export leaves it
    with open(os.path.join(qwen2, "model.safetensors"), "r+b") as stream:
        stream.seek(-1, os.SEEK_END)
        stream.write(last)
    assert hf_model.prepare(settings(qwen2, cache, max_model_len=128), lines.append).cache_dir == first.cache_dir
    assert len(exports) == 5


def test_config_json_eos_ids_stand_in_for_a_missing_generation_config(qwen2, tmp_path, exports):
    os.remove(os.path.join(qwen2, "generation_config.json"))
    prepared = hf_model.prepare(settings(qwen2, tmp_path / "cache", max_model_len=64), print)
    config = load_serving_config(prepared.config_file)
    assert config.model.generation_config == os.path.join(prepared.cache_dir, "generation_config.json")
    assert config.model.generation_defaults.eos_token_ids == (511,)


def _drop(name):
    return lambda d: os.remove(os.path.join(d, name))


def _truncate(name):
    def truncate(d):
        path = os.path.join(d, name)
        os.truncate(path, os.path.getsize(path) - 100)

    return truncate


def _edit_config(file="config.json", **fields):
    def edit(d):
        path = os.path.join(d, file)
        data = json.load(open(path, encoding="utf-8"))
        data.update(fields)
        json.dump(data, open(path, "w", encoding="utf-8"))

    return edit


@pytest.mark.parametrize(
    "change, values, message",
    [
        (_drop("config.json"), {}, "the model directory has no config.json"),
        (_drop("model.safetensors"), {}, r"the model directory has no \*.safetensors weights"),
        (_drop("tokenizer.json"), {}, "the model directory has no tokenizer.json"),
        (
            _edit_config(hidden_size=32),
            {},
            r"tensor model.embed_tokens.weight has shape \[512, 64\], config.json implies "
            r"\[512, 32\]",
        ),
        (
            _edit_config(intermediate_size=96),
            {},
            r"tensor model.layers.0.mlp.down_proj.weight has shape \[64, 128\], "
            r"config.json implies \[64, 96\]",
        ),
        (
            _truncate("model.safetensors"),
            {},
            r"model.safetensors: tensor .* does not fit its data offsets; the file is "
            r"truncated or corrupt",
        ),
        (_edit_config(architectures=["GPT2LMHeadModel"]), {}, "architecture 'GPT2LMHeadModel' is not supported"),
        (_edit_config(hidden_act="gelu"), {}, 'hidden_act="gelu" is not supported'),
        (_edit_config("generation_config.json", eos_token_id="x"), {}, "generation_config.json: eos_token_id must be"),
        (
            lambda d: None,
            {"tensor_parallel": 4},
            r"tensor_parallel=4 does not divide the model's num_key_value_heads=2 "
            r".*valid tensor_parallel values: \[1, 2\]",
        ),
        (
            lambda d: None,
            {"kv_cache_memory": "16KiB"},
            r"kv_cache_memory: too little memory for even one sequence: "
            r"\d+ bytes needed for max_model_len=1024, kv_cache_memory is "
            r"16384 \(16KiB\)",
        ),
        (
            lambda d: None,
            {"max_model_len": 2048},
            "max_model_len 2048 exceeds the model's max_position_embeddings 1024",
        ),
    ],
)
def test_refusals_come_before_any_export(qwen2, tmp_path, exports, change, values, message):
    change(qwen2)
    with pytest.raises(HfModelError, match=message):
        hf_model.prepare(settings(qwen2, tmp_path / "cache", **values), print)
    assert not exports


def test_a_failing_export_says_why(qwen2, tmp_path, monkeypatch):
    monkeypatch.setattr(hf_model, "EXPORT_MODULE", "mindspore_serving.no_such_module")
    with pytest.raises(HfModelError, match="exporting Qwen2_5-tiny failed: the exporting process exited with code 1"):
        hf_model.prepare(settings(qwen2, tmp_path / "cache", max_model_len=64), print)


@pytest.fixture
def registry():
    reset_registry()
    yield
    reset_registry()


def _declare(tmp_path, source, name="chat"):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "servable_config.py").write_text("from mindspore_serving.server import register\n" + source)
    exec(compile(source, str(directory / "servable_config.py"), "exec"), {"register": register})
    return get_servable_spec(name)


def test_declare_llm_records_a_model_directory(tmp_path, registry):
    spec = _declare(
        tmp_path,
        "register.declare_llm(model_dir='models/qwen', tensor_parallel=2, max_model_len=512, "
        "kv_cache_memory='1GiB', "
        "speculative_config={'num_speculative_tokens': 2})\n",
    )
    assert spec.extension == LlmDeclaration(
        None,
        HfModelSettings(
            model_dir=str(tmp_path / "chat" / "models" / "qwen"),
            served_model_name="chat",
            model_cache=os.path.abspath("model_cache"),
            tensor_parallel=2,
            max_model_len=512,
            kv_cache_memory="1GiB",
            speculative=SpeculativeConfig(num_speculative_tokens=2),
        ),
    )
    assert list(spec.methods) == ["generate"]


@pytest.mark.parametrize(
    "source, message",
    [
        ("register.declare_llm()\n", "give either config_file"),
        ("register.declare_llm(config_file='a.yaml', model_dir='m')\n", "give either config_file"),
        ("register.declare_llm(model_dir='m', tensor_parallel=0)\n", "servable chat: tensor_parallel must be an int"),
        (
            "register.declare_llm(model_dir='m', speculative_config={'k': 2})\n",
            r"servable chat: speculative_config: unknown SpeculativeConfig fields \['k'\]",
        ),
    ],
)
def test_declare_llm_refusals(tmp_path, registry, source, message):
    with pytest.raises(RuntimeError, match=f"Declare LLM failed, {message}"):
        _declare(tmp_path, source)


def test_declare_llm_takes_no_buckets(tmp_path, registry):
    with pytest.raises(TypeError, match="unexpected keyword argument 'buckets'"):
        _declare(tmp_path, "register.declare_llm(model_dir='m', buckets={'decode_batch_buckets': [1, 4]})\n")


def test_models_are_prepared_side_by_side_as_cores_and_memory_allow(qwen2, tmp_path, monkeypatch, exports):
    weights = os.path.getsize(os.path.join(qwen2, "model.safetensors"))
    three = [settings(qwen2, tmp_path / "cache", served_model_name=f"m{i}") for i in range(3)]
    assert hf_model.preparing_jobs(three, cores=2, available=1 << 40) == 2
    assert hf_model.preparing_jobs(three, cores=16, available=1 << 40) == 3
    assert hf_model.preparing_jobs(three, cores=16, available=2 * 3 * weights) == 2  # three times each one's weights
    assert hf_model.preparing_jobs(three, cores=16, available=weights) == 1

    both = threading.Barrier(2, timeout=30)
    export = hf_model.run_export  # the fixture's

    def side_by_side(argv, name):  # each export waits until the other runs too
        both.wait()
        export(argv, name)

    monkeypatch.setattr(hf_model, "run_export", side_by_side)
    lines = []
    prepared = hf_model.prepare_all(three[:2], lines.append, jobs=2)
    assert [p.name for p in prepared] == ["m0", "m1"] and len(exports) == 2
    assert sorted(line.split(":")[0] for line in lines if "exporting" in line) == ["m0", "m1"]


def test_the_first_failing_model_is_named_and_the_rest_not_begun(qwen2, tmp_path, monkeypatch):
    started = []

    def fake(argv, name):
        started.append(name)
        raise HfModelError(f"exporting {name} failed: no")

    monkeypatch.setattr(hf_model, "run_export", fake)
    models = [settings(qwen2, tmp_path / "cache", served_model_name=f"m{i}") for i in range(3)]
    with pytest.raises(HfModelError) as failed:
        hf_model.prepare_all(models, lambda line: None, jobs=1)
    assert str(failed.value) == f"{qwen2}: exporting m0 failed: no" and started == ["m0"]


def test_max_model_len_defaults_to_what_the_kv_budget_holds():
    """With kv_cache_memory and no max_model_len, the longest sequence the budget holds (its blocks less the scratch
    block) when that is more than the cap of 2048, up to max_position_embeddings; a smaller budget keeps the cap (and
    is refused if it cannot hold that)."""
    from mindspore_serving.models.llama.config import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, max_seq_len=64
    )
    block_bytes = 2 * 2 * 16 * 2 * 8 * 4  # layers, key and value, block, KV heads, head dim, float32
    budget = settings("/m/x", "/c", kv_cache_memory=block_bytes * 201)
    assert plan.served_max_model_len(budget, 32768, cfg) == 200 * 16 + 1
    assert plan.served_max_model_len(budget, 1000, cfg) == 1000
    windowed = dataclasses.replace(cfg, sliding_window=2500)  # a budget never raises it past the window
    assert plan.served_max_model_len(budget, 32768, windowed) == 2500
    small = settings("/m/x", "/c", kv_cache_memory=block_bytes * 11)
    assert plan.served_max_model_len(small, 32768, cfg) == 2048
    assert plan.served_max_model_len(settings("/m/x", "/c"), 32768, cfg) == 2048  # no budget: the cap
    assert (
        plan.served_max_model_len(
            settings("/m/x", "/c", kv_cache_memory=block_bytes * 101, max_model_len=512), 32768, cfg
        )
        == 512
    )
