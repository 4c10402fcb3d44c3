"""How many times something may be restarted within a window of time before it is given up."""

import time
from collections.abc import Callable


class RestartBudget:
    """`spend()` records a restart and says whether it is still within `max_restarts` per `window` seconds."""

    def __init__(self, max_restarts: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self.clock = clock
        self._times: list[float] = []

    def spend(self) -> bool:
        now = self.clock()
        self._times = [t for t in self._times if now - t < self.window] + [now]
        return len(self._times) <= self.max_restarts
