"""`--model_control poll`: the servable directory is watched, and what it holds is what is served.

    VersionPolicy   which version folders of a servable are served: `latest:N` (default `latest:1`), `all`,
                    `specific:1,3`
    scan            the servable directory now: per servable its version folders and a signature of each
                    (servable_config.py's and the folder's files' mtimes and sizes)
    plan_changes    what to load and unload to go from what is served to what the policy selects; pure
    RepositoryPoller  scans every `interval` seconds and applies the changes (loads first, then unloads: a new
                    version serves before the old one drains)

A version whose load failed is not retried until its signature changes (a copy that was still being written
fails once, and loads when complete).
"""

import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from mindspore_serving import log

SERVABLE_CONFIG_FILE = "servable_config.py"
DEFAULT_POLL_INTERVAL = 0.5


@dataclass(frozen=True)
class VersionPolicy:
    """Which of a servable's version folders are served (Triton's version_policy)."""

    kind: str = "latest"  # "latest", "all" or "specific"
    count: int = 1  # latest: how many of the newest
    versions: tuple[int, ...] = ()  # specific: which

    @staticmethod
    def parse(text: str) -> "VersionPolicy":
        """`latest:N`, `latest` (N = 1), `all` or `specific:V[,V...]`; raises ValueError naming the forms."""
        kind, _, argument = text.strip().partition(":")
        kind, argument = kind.strip().lower(), argument.strip()
        try:
            if kind == "all" and not argument:
                return VersionPolicy("all", 0)
            if kind == "latest":
                count = int(argument) if argument else 1
                if count >= 1:
                    return VersionPolicy("latest", count)
            if kind == "specific":
                versions = tuple(sorted({int(v) for v in argument.split(",")}))
                if versions and versions[0] >= 1:
                    return VersionPolicy("specific", 0, versions)
        except ValueError:
            pass
        raise ValueError(
            f"invalid version policy {text!r}: expected 'latest:N' (N >= 1), 'all' or "
            f"'specific:V1,V2,...' (versions >= 1)"
        )

    def select(self, available: Iterable[int]) -> set[int]:
        available = sorted(set(available))
        if self.kind == "all":
            return set(available)
        if self.kind == "specific":
            return set(available) & set(self.versions)
        return set(available[-self.count :])


def parse_policies(text: str) -> tuple[VersionPolicy, dict[str, VersionPolicy]]:
    """`--version_policy`: a default policy and per-servable ones, `;`-separated: `latest:2;add=specific:1,2`."""
    default, per_servable = VersionPolicy(), {}
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        name, sep, policy = item.partition("=")
        if sep:
            per_servable[name.strip()] = VersionPolicy.parse(policy)
        else:
            default = VersionPolicy.parse(item)
    return default, per_servable


@dataclass(frozen=True)
class ServableSnapshot:
    config_signature: tuple  # servable_config.py's (mtime, size)
    versions: dict[int, tuple] = field(default_factory=dict)  # version -> signature of its folder's files


def _signature(path: str) -> tuple:
    try:
        stat = os.stat(path)
    except OSError:
        return ()
    return (stat.st_mtime_ns, stat.st_size)


def _folder_signature(path: str) -> tuple:
    entries = []
    for root, _dirs, files in os.walk(path):
        for name in sorted(files):
            entries.append((os.path.relpath(os.path.join(root, name), path),) + _signature(os.path.join(root, name)))
    return tuple(sorted(entries))


def scan(directory: str, names: Sequence[str] | None = None) -> dict[str, ServableSnapshot]:
    """The servables of `directory` (those with a servable_config.py; only `names` when given)."""
    found = {}
    try:
        candidates = sorted(os.listdir(directory)) if names is None else list(names)
    except OSError:
        return found
    for name in candidates:
        path = os.path.join(directory, name)
        config = os.path.join(path, SERVABLE_CONFIG_FILE)
        if not os.path.isfile(config):
            continue
        versions = {}
        for entry in os.listdir(path):
            if re.fullmatch(r"[0-9]+", entry) and int(entry) > 0 and os.path.isdir(os.path.join(path, entry)):
                versions[int(entry)] = _folder_signature(os.path.join(path, entry))
        found[name] = ServableSnapshot(_signature(config), versions)
    return found


@dataclass(frozen=True)
class Change:
    action: str  # "load" (also a reload of a served version) or "unload"
    servable: str
    version: int


def plan_changes(
    snapshot: dict[str, ServableSnapshot],
    served: dict[tuple[str, int], tuple],
    policy_of: Callable[[str], VersionPolicy],
) -> list[Change]:
    """Loads (new versions, and served ones whose files or servable_config.py changed), then unloads (versions
    the policy no longer selects, or whose folder or servable is gone). `served` maps (servable, version) to
    the signature it was loaded with: (config signature, folder signature)."""
    loads, unloads = [], []
    for name in sorted(snapshot):
        servable = snapshot[name]
        for version in sorted(policy_of(name).select(servable.versions)):
            signature = (servable.config_signature, servable.versions[version])
            if served.get((name, version)) != signature:
                loads.append(Change("load", name, version))
    for name, version in sorted(served):
        servable = snapshot.get(name)
        if servable is None or version not in policy_of(name).select(servable.versions):
            unloads.append(Change("unload", name, version))
    return loads + unloads


class RepositoryPoller:
    """A thread that keeps what is served equal to what the servable directory holds, by the policies."""

    def __init__(
        self,
        directory: str,
        names: Sequence[str] | None,
        policy_of: Callable[[str], VersionPolicy],
        load: Callable[[str, int], None],
        unload: Callable[[str, int], None],
        interval: float = DEFAULT_POLL_INTERVAL,
    ):
        self.directory, self.names, self.policy_of = directory, names, policy_of
        self.load, self.unload, self.interval = load, unload, interval
        self.served: dict[tuple[str, int], tuple] = {}
        self._failed: dict[tuple[str, int], tuple] = {}  # signature of a load that failed: not retried as is
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self):
        """One scan, and the loads and unloads it calls for (a load that failed as is before is skipped)."""
        snapshot = scan(self.directory, self.names)
        for change in plan_changes(snapshot, self.served, self.policy_of):
            if change.action == "load" and self._failed.get((change.servable, change.version)) == _signature_of(
                snapshot, change
            ):
                continue
            key = (change.servable, change.version)
            if change.action == "load":
                signature = _signature_of(snapshot, change)
                if self._apply(change, self.load):
                    self._failed.pop(key, None)
                    self.served[key] = signature
                else:
                    self._failed[key] = signature
            else:
                self._apply(change, self.unload)
                self.served.pop(key, None)

    @staticmethod
    def _apply(change, action) -> bool:
        """Runs `action(servable, version)` for `change`, logging it; False when it failed (logged with why)."""
        what = f"servable {change.servable} version {change.version}"
        verb = "loading" if change.action == "load" else "unloading"
        log.info(f"model control: {verb} {what}")
        try:
            action(change.servable, change.version)
        except Exception as err:  # pylint: disable=broad-except
            log.error(f"model control: {verb} {what} failed: {err}")
            return False
        return True

    def start(self):
        self._thread = threading.Thread(target=self._run, name="serving-model-control", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                self.poll_once()
            except Exception as err:  # pylint: disable=broad-except
                log.error(f"model control: polling {self.directory} failed: {err}")

    def stop(self):
        self._stop.set()


def _signature_of(snapshot: dict[str, ServableSnapshot], change: Change) -> tuple:
    servable = snapshot[change.servable]
    return (servable.config_signature, servable.versions.get(change.version, ()))
