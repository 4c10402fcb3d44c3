"""The master's view of live workers: who serves which servable version and method, and how busy they are."""

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mindspore_serving.common import errors, metrics


@dataclass
class WorkerRecord:
    key: str
    pid: int
    address: str
    servable_name: str
    version_number: int
    batch_size: int
    methods: dict[str, Any]  # method name -> MethodSignature
    extensions: dict[str, str] = field(default_factory=dict)
    device_id: int = 0
    extra_index: int | None = None  # an extra worker's number (num_parallel_workers)
    owns_device: bool = True  # it runs its models itself: extra workers' model calls may go to it
    model_infos: Any = None  # its models' shapes (internal ModelInfo by key), when it owns them
    stub: Any = None
    channel: Any = None
    predict: Any = None  # its Predict socket (ipc/predict_socket.py), if it offers one
    outstanding: int = 0  # instances queued or sent and not yet answered
    served: int = 0  # request chunks answered since registration
    lost_reason: str | None = None  # why the master gave up on it (not responding), once it did
    not_ready: str = ""  # why it cannot serve now though alive (its last heartbeat's answer)
    registration: Any = field(default=None, repr=False)  # its RegisterRequest (front-end processes get a copy)
    queues: dict[str, Any] = field(default_factory=dict, repr=False)  # method -> the dispatcher's queue
    _input_names: dict[str, list[str]] = field(default_factory=dict, repr=False)

    @property
    def device_label(self) -> str:
        return metrics.device_label(self.device_id, self.extra_index)

    async def close_channels(self):
        """Closes the master's connections to this worker (on the master's loop)."""
        if self.predict is not None:
            self.predict.close()
        if self.channel is not None:
            await self.channel.close()

    def input_names(self, method_name: str) -> list[str]:
        """The input names of a method, read once from its signature."""
        names = self._input_names.get(method_name)
        if names is None:
            names = self._input_names[method_name] = list(self.methods[method_name].input_names)
        return names


def request_repr(servable_name: str, method_name: str, version_number: int) -> str:
    text = f"servable({servable_name}) method({method_name}) "
    if version_number > 0:
        text += f" version({version_number}) "
    return text


class WorkerRegistry:
    def __init__(self):
        self._lock = threading.Lock()
        self._workers: dict[str, WorkerRecord] = {}
        self._turn = itertools.count()
        # (servable, method, version) -> candidates; emptied whenever a worker comes or goes
        self._candidates: dict[tuple, list[WorkerRecord]] = {}
        # called with ("added", record) / ("removed", record) after every change (front-end processes follow them)
        self.listeners: list[Callable[[str, WorkerRecord], None]] = []
        # (servable name, version; 0: any) -> whether workers of it are planned though none is registered now
        # (dead, restarting): then a request is unavailable ("retry later"), not of an unknown servable
        self.expected: Callable[[str, int], bool] = lambda _name, _version: False

    def add(self, record: WorkerRecord) -> WorkerRecord | None:
        """Registers a worker; returns the record it replaces (same key), if any."""
        with self._lock:
            old = self._workers.get(record.key)
            self._workers[record.key] = record
            self._candidates = {}
        self._tell("added", record)
        return old

    def remove(self, key: str, pid: int | None = None) -> WorkerRecord | None:
        with self._lock:
            record = self._workers.get(key)
            if record is None or (pid is not None and record.pid != pid):
                return None
            self._candidates = {}
            record = self._workers.pop(key)
        self._tell("removed", record)
        return record

    def get(self, key: str) -> WorkerRecord | None:
        with self._lock:
            return self._workers.get(key)

    def all(self) -> list[WorkerRecord]:
        with self._lock:
            return list(self._workers.values())

    def clear(self) -> list[WorkerRecord]:
        with self._lock:
            records = list(self._workers.values())
            self._workers.clear()
            self._candidates = {}
        for record in records:
            self._tell("removed", record)
        return records

    def _tell(self, change: str, record: WorkerRecord):
        for listener in list(self.listeners):
            listener(change, record)

    def servable_versions(self, servable_name: str) -> list[int]:
        with self._lock:
            return sorted({w.version_number for w in self._workers.values() if w.servable_name == servable_name})

    def candidates(self, servable_name: str, method_name: str, version_number: int) -> list[WorkerRecord]:
        """Workers that can serve the request; version 0 means the newest running version.

        The list is shared between calls until a worker comes or goes: callers must not change it."""
        key = (servable_name, method_name, version_number)
        found = self._candidates.get(key)
        if found is not None:
            return found
        repr_ = request_repr(servable_name, method_name, version_number)
        with self._lock:
            cache = self._candidates
            same_name = [w for w in self._workers.values() if w.servable_name == servable_name]
            if version_number == 0 and same_name:
                newest = max(w.version_number for w in same_name)
                matching = [w for w in same_name if w.version_number == newest]
            else:
                matching = [w for w in same_name if w.version_number == version_number]
        if not matching:
            if self.expected(servable_name, version_number):
                raise errors.WorkerUnavailable(f"Request {repr_}, servable is not available")
            raise errors.UnknownServable(f"Request {repr_}, servable is not available")
        with_method = [w for w in matching if method_name in w.methods]
        if not with_method:
            raise errors.UnknownServable(f"Request {repr_}, method is not available")
        with self._lock:
            if cache is self._candidates:  # no worker came or went meanwhile
                cache[key] = with_method
        return with_method

    def model_owners(self, servable_name: str, version_number: int) -> list[WorkerRecord]:
        """The workers of a servable version that run its models themselves (where extra workers' calls go)."""
        with self._lock:
            return [
                w
                for w in self._workers.values()
                if w.owns_device and w.servable_name == servable_name and w.version_number == version_number
            ]

    def pick(self, candidates: list[WorkerRecord]) -> WorkerRecord:
        """The worker with the least outstanding work; ties rotate."""
        if len(candidates) == 1:
            return candidates[0]
        least = min(w.outstanding for w in candidates)
        tied = [w for w in candidates if w.outstanding == least]
        return tied[next(self._turn) % len(tied)]
