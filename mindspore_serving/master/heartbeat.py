"""Liveness of the registered workers: the master pings each one and gives up on a worker that stops answering.

A worker that dies is noticed by its process exit; one that hangs (stopped, deadlocked, swapped out) is not, and
its requests would wait for ever. Like MindSpore Serving, the master pings every worker every `interval`
seconds (WorkerService.Ping, answered by the worker's RPC threads beside any running request); after `misses`
pings in a row go unanswered within `interval`, the worker counts as not responding and `on_unresponsive(record,
reason)` is called once for it (the master then kills it: its requests fail, and it is restarted).
Each answer also says whether the worker can serve now (`PingReply.not_ready`, kept on its record for the
master's readiness): an LLM worker stays registered while its agents restart, but is not ready meanwhile.
"""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from mindspore_serving import log
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
from mindspore_serving.proto import internal_pb2

DEFAULT_INTERVAL = 1.0
DEFAULT_MISSES = 3


@dataclass
class HeartbeatSettings:
    interval: float = DEFAULT_INTERVAL  # seconds between pings, and how long a ping may take
    misses: int = DEFAULT_MISSES  # unanswered pings in a row after which a worker is not responding

    @property
    def budget(self) -> float:
        """The longest a hung worker goes unnoticed."""
        return self.interval * (self.misses + 1)


class WorkerHeartbeat:
    """Pings the registry's workers from the master's event loop (start() there, stop() to end)."""

    def __init__(
        self,
        registry: WorkerRegistry,
        settings: HeartbeatSettings,
        on_unresponsive: Callable[[WorkerRecord, str], None],
        on_change: Callable[[], None] = lambda: None,
    ):
        self.registry = registry
        self.settings = settings
        self.on_unresponsive = on_unresponsive
        self.on_change = on_change  # a worker's readiness changed (its not_ready, or given up as hung)
        self._missed: dict[tuple, int] = {}  # (key, pid) -> pings missed in a row
        self._task = None
        self._pings: set[asyncio.Task] = set()  # pings in flight (a task needs a reference until it is done)

    def start(self):
        self._task = asyncio.ensure_future(self._run())

    async def stop(self):
        for task in list(self._pings):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self):
        """Starts a ping of every worker each `interval` without waiting for the last ones (which time out after
        `interval`), so that a hung worker is given up after about (misses + 1) * interval."""
        while True:
            await asyncio.sleep(self.settings.interval)
            records = [r for r in self.registry.all() if r.stub is not None and r.lost_reason is None]
            for record in records:
                task = asyncio.ensure_future(self._ping(record))
                self._pings.add(task)
                task.add_done_callback(self._pings.discard)
            live = {(r.key, r.pid) for r in records}
            for key in [k for k in self._missed if k not in live]:
                del self._missed[key]

    async def _ping(self, record: WorkerRecord):
        key = (record.key, record.pid)
        try:
            reply = await record.stub.Ping(internal_pb2.Empty(), timeout=self.settings.interval)
            self._missed.pop(key, None)
            if record.not_ready != reply.not_ready:  # an LLM worker's agents restarting: alive, but not ready
                record.not_ready = reply.not_ready
                self.on_change()
            return
        except grpc.aio.AioRpcError as err:
            if err.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                return  # it answered, with an error: alive
        except grpc.aio.UsageError:  # its channel closed: it is being removed
            return
        missed = self._missed[key] = self._missed.get(key, 0) + 1
        if missed >= self.settings.misses and self.registry.get(record.key) is record and record.lost_reason is None:
            reason = (
                f"the worker of {record.servable_name} (pid {record.pid}) is not responding "
                f"({missed} heartbeats of {self.settings.interval:g} s missed)"
            )
            record.lost_reason = reason
            self.on_change()
            log.error(reason)
            self.on_unresponsive(record, reason)
