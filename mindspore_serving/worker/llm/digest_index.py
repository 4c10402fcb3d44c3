"""The digest index: the sha256 of a model directory's files, kept in the model cache so that a restart does not read
every weights file again (hashing a 1-2 GB checkpoint costs seconds on every start).

    found = file_digests({"model.safetensors": "/models/qwen/model.safetensors"}, "model_cache/digests.json", hash_file)
    found.digests       # {"model.safetensors": "<sha256>"}, what hash_file would have returned
    found.summary(...)  # the line a start logs: how many digests were reused, how many computed

An entry is keyed by the file's real path (symbolic links resolved, as a Hugging Face cache's snapshots are) and
holds the size, mtime_ns, ctime_ns and inode the file had when it was hashed; a file whose stat differs in any of
them is hashed again. Writing a file changes its mtime and ctime, replacing it (a new download renamed over it) its
inode; a ctime cannot be set back, so a tool that restores the mtime after writing (cp -p, rsync -t, tar) is not
trusted either. A file changed less than RACY_NS before it was hashed is not recorded: a second change within the
same timestamp tick would leave its stat as recorded (git's "racily clean" entries); it is hashed again next time.

The index is a cache, never an authority: a missing, unreadable or corrupt one (or one of another VERSION) is read as
empty and rewritten, a read-only model cache leaves it unwritten (each start hashes, as it did without an index). It
is rewritten only when a file was hashed, atomically (a temporary file renamed over it) under a lock file, merging
what concurrent starts wrote meanwhile; entries of files that no longer exist are dropped then.

The mapping's logic is pure (signature, lookup, record, parse, render, merge); load, save and file_digests do the I/O.
"""

import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

INDEX_FILE = "digests.json"
"""The index's name in the model cache (beside the `<name>-<key>` export directories)."""
VERSION = 1
RACY_NS = 2_000_000_000
"""A file changed this recently (ns) before it was hashed is not recorded (FAT's timestamps are 2 s apart)."""
FIELDS = ("size", "mtime_ns", "ctime_ns", "ino")
_SHA256 = re.compile(r"[0-9a-f]{64}")

Index = dict[str, dict[str, int | str]]
"""Real path -> {size, mtime_ns, ctime_ns, ino: ints, sha256: hex}."""


# the mapping (pure)


def signature(st: os.stat_result) -> dict[str, int]:
    """What of a file's stat an entry holds: a file whose signature changed is hashed again."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def lookup(index: Mapping[str, Mapping], path: str, sig: Mapping[str, int]) -> str | None:
    """The recorded sha256 of `path` when its entry has this signature, else None."""
    entry = index.get(path)
    if entry is None or any(entry.get(field) != sig[field] for field in FIELDS):
        return None
    return str(entry["sha256"])


def record(index: Index, path: str, sig: Mapping[str, int], sha256: str, hashed_ns: int, racy_ns: int | None = None):
    """Records `path`'s digest, computed from time `hashed_ns` on (ns since the epoch); a file changed within racy_ns
    (default RACY_NS) before it is forgotten instead. True when recorded."""
    window = RACY_NS if racy_ns is None else racy_ns
    if max(sig["mtime_ns"], sig["ctime_ns"]) + window >= hashed_ns:
        index.pop(path, None)
        return False
    index[path] = {**{field: sig[field] for field in FIELDS}, "sha256": sha256}
    return True


def _valid(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and all(type(entry.get(field)) is int for field in FIELDS)
        and isinstance(entry.get("sha256"), str)
        and _SHA256.fullmatch(entry["sha256"]) is not None
    )


def parse(text: str) -> Index:
    """The index a file holds; empty when it is not one (corrupt, truncated, another version); bad entries dropped."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("files"), dict):
        return {}
    return {path: entry for path, entry in data["files"].items() if _valid(entry)}


def render(index: Mapping[str, Mapping]) -> str:
    return json.dumps({"version": VERSION, "files": dict(sorted(index.items()))}, indent=1) + "\n"


def merge(current: Mapping[str, Mapping], changes: Mapping[str, Mapping | None]) -> Index:
    """`current` (the index as written meanwhile) with this start's changes: an entry set, or dropped for None."""
    merged: Index = {path: dict(entry) for path, entry in current.items()}
    for path, entry in changes.items():
        if entry is None:
            merged.pop(path, None)
        else:
            merged[path] = dict(entry)
    return merged


# the files


def load(index_file: str) -> Index:
    try:
        with open(index_file, encoding="utf-8") as stream:
            return parse(stream.read())
    except (OSError, UnicodeDecodeError):  # missing, a directory, unreadable, not text
        return {}


def save(index_file: str, changes: Mapping[str, Mapping | None]) -> str | None:
    """Merges `changes` into the index file (created with its directory when missing); None, or why it could not
    be written (a read-only model cache: the start goes on without it)."""
    directory = os.path.dirname(index_file) or "."
    temporary = f"{index_file}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(directory, exist_ok=True)
        with open(index_file + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent starts merge in turn rather than drop each other's entries
            merged = merge(load(index_file), changes)
            merged = {path: entry for path, entry in merged.items() if path in changes or os.path.exists(path)}
            try:
                with open(temporary, "w", encoding="utf-8") as stream:
                    stream.write(render(merged))
                os.replace(temporary, index_file)
            except OSError:
                if os.path.lexists(temporary):
                    os.unlink(temporary)
                raise
    except OSError as err:
        return err.strerror or str(err)
    return None


@dataclass(frozen=True)
class Digests:
    digests: dict[str, str]
    """Name -> sha256, as given."""
    reused: int
    """Digests read from the index."""
    hashed_bytes: int
    seconds: float
    """Spent hashing."""
    unrecorded: int
    """Files hashed but changed too recently to be recorded."""
    unsaved: str | None
    """Why the index could not be written (None: written, or nothing to write)."""

    def summary(self, index_file: str) -> str:
        total, hashed = len(self.digests), len(self.digests) - self.reused
        if not hashed:
            return f"file digests reused for all {total} files from the digest index {index_file}"
        mib = self.hashed_bytes / (1 << 20)
        line = f"file digests computed for {hashed} of {total} files ({mib:.1f} MiB in {self.seconds:.1f}s)"
        line += f", {self.reused} reused" if self.reused else ""
        if self.unsaved:
            return line + f"; the digest index {index_file} cannot be written ({self.unsaved})"
        if self.unrecorded:
            return line + f"; {self.unrecorded} changed too recently to be recorded in the digest index {index_file}"
        return line + f"; recorded in the digest index {index_file}"


def file_digests(files: Mapping[str, str], index_file: str, hash_file: Callable[[str], str]) -> Digests:
    """The sha256 of each file (name -> path), read from the index when recorded for its current stat, else
    computed by hash_file (and recorded)."""
    index = load(index_file)
    digests: dict[str, str] = {}
    changes: dict[str, dict | None] = {}
    reused = hashed_bytes = unrecorded = 0
    seconds = 0.0
    for name, path in files.items():
        real = os.path.realpath(path)
        sig = signature(os.stat(real))
        found = lookup(index, real, sig)
        if found is not None:
            digests[name] = found
            reused += 1
            continue
        indexed = real in index
        started, clock = time.time_ns(), time.perf_counter()
        digests[name] = hash_file(path)
        seconds += time.perf_counter() - clock
        hashed_bytes += sig["size"]
        # a file written while it was read has a digest of neither content: not recorded
        if signature(os.stat(real)) == sig and record(index, real, sig, digests[name], started):
            changes[real] = index[real]
        else:
            unrecorded += 1
            if indexed:  # its entry is stale
                changes[real] = None
    unsaved = save(index_file, changes) if changes else None
    return Digests(digests, reused, hashed_bytes, seconds, unrecorded, unsaved)
