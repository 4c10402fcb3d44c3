"""The digest index of the model cache (worker/llm/digest_index.py): a restart reads the digests of unchanged files
from it instead of hashing them again, a changed file is hashed again, and a missing, corrupt or unwritable index
only costs the hashing. The key computed is the one of hashing every file. Real files in tmp_path."""

import hashlib
import json
import os
import shutil
import threading

import pytest

from mindspore_serving.spec import hf_serving as plan
from mindspore_serving.spec.hf_serving import HfModelSettings
from mindspore_serving.worker.llm import digest_index, hf_model
from mindspore_serving.worker.llm.digest_index import INDEX_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QWEN2 = os.path.join(ROOT, "tests", "fixtures", "hf", "qwen2")
OLD = 1_600_000_000_000_000_000  # an mtime (ns) long past
SIG = {"size": 3, "mtime_ns": OLD, "ctime_ns": OLD, "ino": 7}
SHA = "ab" * 32


@pytest.fixture
def settled(monkeypatch):
    """Files written by the test count as settled (not changed too recently to be recorded): their ctime is now."""
    monkeypatch.setattr(digest_index, "RACY_NS", 0)


@pytest.fixture
def hashed(monkeypatch):
    """The paths hf_model hashes, in order."""
    calls = []
    real = hf_model.file_digest

    def counting(path):
        calls.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(hf_model, "file_digest", counting)
    return calls


@pytest.fixture
def model(tmp_path):
    return shutil.copytree(QWEN2, str(tmp_path / "qwen2"))


def _sha256(path):
    with open(path, "rb") as stream:
        return hashlib.sha256(stream.read()).hexdigest()


def _check(model, cache, lines=None):
    log = (lambda line: None) if lines is None else lines.append
    return hf_model._check(HfModelSettings.create(model, model_cache=str(cache)), log)


# the mapping


def test_an_entry_is_found_for_the_stat_it_was_recorded_with_only():
    index = {}
    assert digest_index.record(index, "/m/w", SIG, SHA, hashed_ns=OLD + 10**10)
    assert digest_index.lookup(index, "/m/w", SIG) == SHA
    assert digest_index.lookup(index, "/m/other", SIG) is None
    for field in digest_index.FIELDS:
        assert digest_index.lookup(index, "/m/w", {**SIG, field: SIG[field] + 1}) is None


def test_a_file_changed_just_before_it_was_hashed_is_not_recorded():
    index = {"/m/w": {**SIG, "sha256": SHA}}
    recent = {**SIG, "ctime_ns": OLD + 10**9}  # changed 1 s before: a second change might keep this stat
    assert not digest_index.record(index, "/m/w", recent, SHA, hashed_ns=OLD + 2 * 10**9)
    assert index == {}  # and the stale entry is forgotten
    assert digest_index.record(index, "/m/w", recent, SHA, hashed_ns=OLD + 4 * 10**9)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{not json",
        '{"version": 1, "files": {"/m/w": {"size"',  # truncated
        "[1, 2]",
        json.dumps({"version": 99, "files": {"/m/w": {**SIG, "sha256": SHA}}}),
        json.dumps({"version": 1, "files": []}),
    ],
)
def test_what_is_not_an_index_reads_as_empty(text):
    assert digest_index.parse(text) == {}


def test_bad_entries_are_dropped_and_an_index_reads_back_as_rendered():
    good = {"/m/w": {**SIG, "sha256": SHA}}
    bad = {
        "/m/a": {**SIG, "sha256": "xyz"},
        "/m/b": {**SIG, "size": "3", "sha256": SHA},
        "/m/c": {**SIG, "ino": True, "sha256": SHA},
        "/m/d": {"sha256": SHA},
        "/m/e": None,
    }
    assert digest_index.parse(digest_index.render({**good, **bad})) == good
    assert digest_index.merge({**good, "/m/x": good["/m/w"]}, {"/m/x": None, "/m/y": good["/m/w"]}) == {
        "/m/w": good["/m/w"],
        "/m/y": good["/m/w"],
    }


# the files, through hf_model


def test_a_restart_reads_the_digests_and_computes_the_same_key(model, tmp_path, settled, hashed):
    cache = tmp_path / "cache"
    names = ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"]
    lines = []
    first = _check(model, cache, lines)
    assert hashed == names and len(lines) == 1
    assert lines[0].startswith("qwen2: file digests computed for 4 of 4 files (0.4 MiB in ")
    assert lines[0].endswith(f"s); recorded in the digest index {cache / INDEX_FILE}")
    plain = {name: _sha256(os.path.join(model, name)) for name in names}
    assert first.digests == plain

    hashed.clear()
    lines.clear()
    again = _check(model, cache, lines)
    assert hashed == [] and again.digests == plain
    assert lines == [f"qwen2: file digests reused for all 4 files from the digest index {cache / INDEX_FILE}"]
    assert plan.cache_key(again.digests, again.model_file, 1) == plan.cache_key(plain, first.model_file, 1)
    index = json.loads((cache / INDEX_FILE).read_text(encoding="utf-8"))
    assert index["files"][os.path.realpath(os.path.join(model, "config.json"))]["sha256"] == plain["config.json"]


def test_a_changed_file_is_hashed_again(model, tmp_path, settled, hashed):
    cache = tmp_path / "cache"
    weights = os.path.join(model, "model.safetensors")
    before = _check(model, cache).digests
    with open(weights, "r+b") as stream:  # one byte of a weight: the same size
        stream.seek(-1, os.SEEK_END)
        last = stream.read(1)
        stream.seek(-1, os.SEEK_END)
        stream.write(bytes([last[0] ^ 1]))
    os.utime(weights, ns=(OLD, OLD))
    hashed.clear()
    lines = []
    after = _check(model, cache, lines).digests
    assert hashed == ["model.safetensors"] and lines[0].startswith("qwen2: file digests computed for 1 of 4 files (")
    assert lines[0].endswith(f"s), 3 reused; recorded in the digest index {cache / INDEX_FILE}")
    assert after["model.safetensors"] == _sha256(weights) != before["model.safetensors"]
    assert {n: d for n, d in after.items() if n != "model.safetensors"} == {
        n: d for n, d in before.items() if n != "model.safetensors"
    }
    hashed.clear()
    assert _check(model, cache).digests == after and hashed == []  # the new digest is recorded


def test_a_file_replaced_by_another_is_hashed_again(model, tmp_path, settled, hashed):
    cache = tmp_path / "cache"
    config = os.path.join(model, "config.json")
    _check(model, cache)
    stat = os.stat(config)
    replacement = config + ".new"  # a new download renamed over it, its size and mtime those of the old one
    with open(config, "rb") as old, open(replacement, "wb") as new:
        new.write(old.read().replace(b"  ", b"\t "))
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replacement, config)
    hashed.clear()
    assert _check(model, cache).digests["config.json"] == _sha256(config) and hashed == ["config.json"]


def test_a_corrupt_index_is_ignored_and_rewritten(model, tmp_path, settled, hashed):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / INDEX_FILE).write_text('{"version": 1, "files": {', encoding="utf-8")
    digests = _check(model, cache).digests
    assert len(hashed) == 4
    rewritten = digest_index.parse((cache / INDEX_FILE).read_text(encoding="utf-8"))
    assert sorted(entry["sha256"] for entry in rewritten.values()) == sorted(digests.values())
    hashed.clear()
    assert _check(model, cache).digests == digests and hashed == []


def test_an_index_that_cannot_be_written_costs_the_hashing_only(model, tmp_path, settled, hashed):
    cache = tmp_path / "cache"
    (cache / INDEX_FILE).mkdir(parents=True)  # neither read nor replaced, as in a read-only cache
    lines = []
    digests = _check(model, cache, lines).digests
    assert len(hashed) == 4 and lines[0].endswith(
        f"; the digest index {cache / INDEX_FILE} cannot be written (Is a directory)"
    )
    assert not [name for name in os.listdir(cache) if name.endswith(".tmp")]
    hashed.clear()
    assert _check(model, cache).digests == digests and len(hashed) == 4


def test_files_written_just_now_are_hashed_at_every_start(model, tmp_path, hashed):
    cache = tmp_path / "cache"  # RACY_NS as served: the copied files' ctime is within it
    lines = []
    digests = _check(model, cache, lines).digests
    assert len(hashed) == 4 and lines[0].endswith(
        f"; 4 changed too recently to be recorded in the digest index {cache / INDEX_FILE}"
    )
    hashed.clear()
    assert _check(model, cache).digests == digests and len(hashed) == 4


def test_concurrent_starts_keep_each_others_entries_and_entries_of_removed_files_go(tmp_path, settled):
    cache = str(tmp_path / "cache")
    index_file = os.path.join(cache, INDEX_FILE)
    files = {}
    for i in range(8):
        files[f"w{i}"] = str(tmp_path / f"w{i}")
        with open(files[f"w{i}"], "wb") as stream:
            stream.write(bytes([i]) * 1000)
    both = threading.Barrier(2, timeout=30)

    def start(names):
        both.wait()
        digest_index.file_digests({n: files[n] for n in names}, index_file, hf_model.file_digest)

    threads = [threading.Thread(target=start, args=(names,)) for names in (["w0", "w1", "w2", "w3"], ["w4", "w5"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    index = digest_index.load(index_file)
    assert sorted(index) == sorted(os.path.realpath(files[f"w{i}"]) for i in range(6))

    os.remove(files["w0"])
    digest_index.file_digests({"w6": files["w6"]}, index_file, hf_model.file_digest)
    assert os.path.realpath(files["w0"]) not in digest_index.load(index_file)
    assert len(digest_index.load(index_file)) == 6
