"""A version counter that any thread bumps when something changed, and that asyncio tasks of any loop await.

The master bumps its readiness signal where the readiness can change (its phase, a worker registered or removed,
a worker process started, dead, restarting or forgotten, a heartbeat's verdict); the health Watch streams and the
front-end processes' readiness updates wait on it instead of reading the readiness on a timer.
"""

import asyncio
import threading


class ChangeSignal:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    @property
    def version(self) -> int:
        return self._version

    def notify(self) -> None:
        """Something changed (any thread): wakes every waiter."""
        with self._lock:
            self._version += 1
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

    async def wait(self, seen: int, timeout: float) -> int:
        """Returns the version once it differs from `seen`, or after `timeout` seconds at the latest."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._version != seen:
                return self._version
            self._waiters.append((loop, future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))
        return self._version


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
