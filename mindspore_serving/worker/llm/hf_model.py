"""Prepares a Hugging Face model directory for serving: checks it, finds or exports its graphs in the model cache,
and writes the LLM configuration and the servable that serve them.

    prepared = prepare(HfModelSettings.create("/models/Qwen2.5-0.5B", model_cache="/abs/model_cache"))
    prepared.config_file          # <cache>/<name>-<key>/llm.yaml, rewritten at every start
    prepared.servable_directory   # <cache>/<name>-<key>/servables, holding <name>/servable_config.py

serving_server.py --model runs it before starting the servables; a worker runs it for a servable declared with
`register.declare_llm(model_dir=...)`. What is computed (settings, key, configuration) is
`spec/hf_serving.py`; this module does the I/O:

* checks before anything is exported (errors name files relative to the model directory, as a client may read
  them when a load request fails): config.json (through `models.llama.hf.config`, which refuses what it does
  not compute), the weights' headers against it, tokenizer.json, tensor parallelism, the KV-cache budget;
* the key: sha256 of config.json, the weights files (streamed), the index and tokenizer files, with the export
  settings; a file's digest is read from the model cache's digest index (`digest_index.py`) while its size, mtime,
  ctime and inode are those it was hashed with, so that a restart does not read the weights again.
  `<cache>/<name>-<key>/` holding export.json (written last) is a complete export and is used as it is; otherwise
  the graphs are exported there by a child process (`models.llama.hf.export`; MindSpore loads only there), which
  prints a line per phase. A lock file per cache directory makes concurrent starts wait for one export;
* writes model.yaml (network and block size), llm.yaml and servables/<name>/servable_config.py, each only when its
  content changes, and loads llm.yaml as a worker would (so a bad value fails here, before anything starts).
"""

import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil
import yaml

from mindspore_serving.llm.generation_defaults import GenerationDefaults
from mindspore_serving.models.llama.config import ModelFile
from mindspore_serving.models.llama.hf.config import UnsupportedModelError, hf_llama_config, read_json
from mindspore_serving.models.llama.hf.weights import SafetensorsCheckpoint, check_checkpoint
from mindspore_serving.models.llama.manifest import MANIFEST
from mindspore_serving.spec import hf_serving as plan
from mindspore_serving.spec.hf_serving import HfModelError, HfModelSettings
from mindspore_serving.spec.llm_config import GENERATION_CONFIG_FILE, ConfigError, load_serving_config
from mindspore_serving.worker.llm import digest_index

EXPORT_MODULE = "mindspore_serving.models.llama.hf.export"
FAILED = "export failed: "
"""How the exporting process says why it failed (models/llama/hf/export.py)."""
TOKENIZER_FILE = "tokenizer.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PreparedModel:
    name: str
    cache_dir: str
    config_file: str
    """The LLM configuration (llm.yaml) of the cache directory."""
    servable_directory: str
    """Holds `<name>/servable_config.py`, which declares config_file."""
    exported: bool
    """The graphs were exported by this call (False: found in the cache)."""


@dataclass(frozen=True)
class _Checked:
    model_file: ModelFile
    max_model_len: int
    digests: dict[str, str]
    eos_token_ids: list


def file_digest(path: str) -> str:
    """sha256 of a file's bytes, read in chunks (a weights file may be many GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check(settings: HfModelSettings, log: Callable[[str], None] = print) -> _Checked:
    """Reads and checks the directory; HfModelError naming what is missing or not served."""
    model_dir = settings.model_dir
    if not os.path.isdir(model_dir):
        raise HfModelError(f"the model directory {os.path.basename(model_dir)} does not exist")
    try:
        config_json = read_json(model_dir, "config.json")
        max_pos = config_json.get("max_position_embeddings")
        max_pos = max_pos if isinstance(max_pos, int) and max_pos > 0 else None
        max_len = plan.served_max_model_len(settings, max_pos)
        cfg, extras = hf_llama_config(config_json, max_len)
        raised = plan.served_max_model_len(settings, max_pos, cfg)  # what a KV-cache budget holds, when more
        if raised != max_len:
            max_len = raised
            cfg, extras = hf_llama_config(config_json, max_len)
        generation = read_json(model_dir, GENERATION_CONFIG_FILE, required=False)
        checkpoint = SafetensorsCheckpoint(model_dir)
        check_checkpoint(cfg, {name: checkpoint.shape(name) for name in checkpoint.names()})
    except UnsupportedModelError as err:
        raise HfModelError(str(err)) from None
    if generation is not None:  # refused now rather than when the served configuration is loaded, after the export
        try:
            GenerationDefaults.from_config(generation)
        except ValueError as err:
            raise HfModelError(f"{GENERATION_CONFIG_FILE}: {err}") from None
    if not os.path.isfile(os.path.join(model_dir, TOKENIZER_FILE)):
        raise HfModelError(
            f"the model directory has no {TOKENIZER_FILE} (a Hugging Face fast tokenizer); save the "
            f"tokenizer with transformers' save_pretrained to write one"
        )
    model_file = plan.export_model_file(settings, cfg, max_len)
    plan.check_kv_cache_memory(settings, model_file, max_len)
    files = sorted({entry[0] for entry in checkpoint.entries.values()})
    files += [name for name in plan.KEY_FILES if os.path.isfile(os.path.join(model_dir, name))]
    index_file = os.path.join(settings.model_cache, digest_index.INDEX_FILE)
    found = digest_index.file_digests({name: os.path.join(model_dir, name) for name in files}, index_file, file_digest)
    log(f"{settings.served_model_name}: {found.summary(index_file)}")
    digests = found.digests
    return _Checked(model_file, max_len, digests, list(extras["eos_token_ids"]))


def _complete(cache_dir: str, key: str, tp: int) -> bool:
    try:
        with open(os.path.join(cache_dir, plan.MARKER_FILE), encoding="utf-8") as stream:
            marker = json.load(stream)
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("key") == key
        and all(os.path.isfile(os.path.join(cache_dir, d, MANIFEST)) for d in plan.rank_dirs(tp))
    )


def _write(path: str, text: str):
    """Writes `text` to `path` when its content differs (atomically: a temporary file renamed)."""
    try:
        with open(path, encoding="utf-8") as stream:
            if stream.read() == text:
                return
    except OSError:
        pass
    with open(path + ".tmp", "w", encoding="utf-8") as stream:
        stream.write(text)
    os.replace(path + ".tmp", path)


def _export(settings: HfModelSettings, checked: _Checked, cache_dir: str, key: str, log: Callable[[str], None]):
    """Exports into cache_dir (emptied first) in a child process, then writes the marker."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.makedirs(cache_dir)
    model_yaml = _write_model_file(checked.model_file, cache_dir)
    tp = settings.tensor_parallel
    log(
        f"{settings.served_model_name}: exporting the step graphs{f' of {tp} ranks' if tp > 1 else ''} "
        f"into {cache_dir} (max_model_len {checked.max_model_len})"
    )
    argv = [
        sys.executable,
        "-m",
        EXPORT_MODULE,
        f"--model_dir={settings.model_dir}",
        f"--config={model_yaml}",
        f"--out={os.path.join(cache_dir, plan.GRAPHS_DIR)}",
        f"--tensor_parallel={tp}",
        f"--device={settings.device_type or 'CPU'}",
        f"--source=hf:{settings.served_model_name} {key[:16]}",
    ]
    start = time.monotonic()
    run_export(argv, settings.served_model_name)
    marker = {
        "key": key,
        "model_dir": settings.model_dir,
        "files": checked.digests,
        "tensor_parallel": tp,
        "model_file": checked.model_file.to_dict(),
        "export_seconds": round(time.monotonic() - start, 1),
    }
    _write(os.path.join(cache_dir, plan.MARKER_FILE), json.dumps(marker, indent=1))
    log(f"{settings.served_model_name}: exported in {marker['export_seconds']:.1f} s")


def run_export(argv, name: str):
    """Runs the exporting process `argv`, its output (a line per phase, MindSpore's warnings) printed line by line
    after "<name>: "; HfModelError with its "export failed: <why>" line when it fails."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    reason = ""
    try:
        for line in process.stdout:
            print(f"{name}: {line.rstrip()}", flush=True)
            if line.startswith(FAILED):
                reason = line[len(FAILED) :].strip()
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise HfModelError(
            f"exporting {name} failed: {reason or f'the exporting process exited with code {process.returncode}'}"
        )


def _write_model_file(model_file: ModelFile, cache_dir: str) -> str:
    """model.yaml of the cache directory: the network and block size of the graphs (the exporter reads it)."""
    path = os.path.join(cache_dir, plan.MODEL_CONFIG_FILE)
    _write(path, yaml.safe_dump(model_file.to_dict(), sort_keys=False))
    return path


def _generation_config(settings: HfModelSettings, checked: _Checked, cache_dir: str) -> str | None:
    """The model's generation_config.json; without one, a file of the cache holding config.json's eos ids."""
    path = os.path.join(settings.model_dir, GENERATION_CONFIG_FILE)
    if os.path.isfile(path):
        return path
    if not checked.eos_token_ids:
        return None
    path = os.path.join(cache_dir, GENERATION_CONFIG_FILE)
    _write(path, json.dumps({"eos_token_id": checked.eos_token_ids}) + "\n")
    return path


def _weights_bytes(model_dir: str) -> int:
    return sum(os.path.getsize(path) for path in glob.glob(os.path.join(model_dir, "*.safetensors")))


def preparing_jobs(models: Sequence[HfModelSettings], cores: int | None = None, available: int | None = None) -> int:
    """How many of `models` are prepared side by side: one per core, while the free memory holds three times
    the weights of that many of the largest (an export loads its weights, and its compiled graphs hold them)."""
    cores = cores or os.cpu_count() or 1
    available = psutil.virtual_memory().available if available is None else available
    largest = max((_weights_bytes(settings.model_dir) for settings in models), default=0)
    by_memory = available // (3 * largest) if largest else len(models)
    return max(1, min(len(models), cores, by_memory))


def prepare_all(
    models: Sequence[HfModelSettings], log: Callable[[str], None] = print, jobs: int | None = None
) -> list[PreparedModel]:
    """`prepare` of each of `models`, `jobs` at a time (default `preparing_jobs`): their exports run side by
    side, each printing its lines after its model's name. The first failing model's HfModelError is raised, its
    text after the model directory (models not begun are then not prepared; those under way finish, and their
    graphs stay in the cache)."""
    failed = threading.Event()

    def prepare_one(settings: HfModelSettings) -> PreparedModel | None:
        if failed.is_set():
            return None
        try:
            return prepare(settings, log)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(jobs or preparing_jobs(models), thread_name_prefix="prepare") as pool:
        futures = [pool.submit(prepare_one, settings) for settings in models]
        for settings, future in zip(models, futures):
            err = future.exception()
            if isinstance(err, HfModelError):
                raise HfModelError(f"{settings.model_dir}: {err}") from None
            if err is not None:
                raise err
    return [result for future in futures if (result := future.result()) is not None]  # none failed: all of them


def prepare(settings: HfModelSettings, log: Callable[[str], None] = print) -> PreparedModel:
    """Checks settings.model_dir, exports its graphs into the cache unless they are there, writes the LLM
    configuration and the servable; raises HfModelError with what is wrong."""
    checked = _check(settings, log)
    tp = settings.tensor_parallel
    key = plan.cache_key(checked.digests, checked.model_file, tp)
    cache_dir = os.path.join(settings.model_cache, plan.cache_dir_name(settings.served_model_name, key))
    try:
        os.makedirs(settings.model_cache, exist_ok=True)
    except OSError as err:
        raise HfModelError(
            f"cannot create the model cache {os.path.basename(settings.model_cache)}: "
            f"{err.strerror}; choose another (--model_cache)"
        ) from None
    with open(cache_dir + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another start exporting the same graphs: wait for it, then use them
        exported = not _complete(cache_dir, key, tp)
        if exported:
            _export(settings, checked, cache_dir, key, log)
        else:
            log(f"{settings.served_model_name}: using the graphs exported at {cache_dir}")
            _write_model_file(checked.model_file, cache_dir)
        tokenizer = os.path.join(settings.model_dir, TOKENIZER_FILE)
        data = plan.llm_config(
            settings,
            checked.model_file,
            checked.max_model_len,
            tokenizer,
            _generation_config(settings, checked, cache_dir),
        )
        config_file = os.path.join(cache_dir, plan.LLM_CONFIG_FILE)
        _write(config_file, plan.llm_config_header(settings) + yaml.safe_dump(data, sort_keys=False))
        servable = os.path.join(cache_dir, plan.SERVABLES_DIR, settings.served_model_name)
        os.makedirs(servable, exist_ok=True)
        _write(os.path.join(servable, "servable_config.py"), plan.servable_config_source(settings))
    try:
        load_serving_config(config_file)
    except ConfigError as err:
        raise HfModelError(f"the configuration written for it ({plan.LLM_CONFIG_FILE}) is not served: {err}") from None
    log(f"{settings.served_model_name}: LLM configuration {config_file}")
    return PreparedModel(
        settings.served_model_name, cache_dir, config_file, os.path.join(cache_dir, plan.SERVABLES_DIR), exported
    )
