"""Watches the cluster ranks a process started until each registered with the scheduler, and names those stuck.

MindSpore's rank client gives each new connection to the scheduler about 30 ms to be seen connected by its event
loop. When the loop is late it closes the socket and tries again every 0.5 s, and a client that failed like this can
go on failing for as long as it may try ("Failed to connect to the meta server node url"), 30 minutes by default.
`init()` holds the GIL and cannot be interrupted, so the rank cannot notice this itself; its starter can. A rank that
registered keeps its connections to the scheduler for its whole life, while one that retries replaces them at every
try; so a connection that lived HELD_S seconds shows a rank registered, and none within REGISTER_TIMEOUT of its start
shows it is stuck. The scheduler never saw a stuck rank, so its starter stops it and starts it again.
"""

import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mindspore_serving import log
from mindspore_serving.common.env_durations import duration_seconds

if TYPE_CHECKING:  # only the annotation needs it
    from mindspore_serving.common.ms_cluster import ClusterAddress

TIMEOUT_VAR = "MS_SERVING_CLUSTER_REGISTER_TIMEOUT"  # seconds from a rank's start
DEFAULT_TIMEOUT_S = 30.0
MAX_RESTARTS = 3
HELD_S = 1.5  # a retrying client replaces its connections every ~0.6 s

WAITING, REGISTERED, STUCK = "waiting", "registered", "stuck"


class RegistrationWatch:
    """Decides from samples of one rank's connections to the scheduler (their local ports) whether it registered:
    pure, the caller gives the times."""

    def __init__(self, started: float, timeout: float, held: float = HELD_S) -> None:
        self.started = started
        self.timeout = timeout
        self.held = held
        self._first_seen: dict[int, float] = {}

    def observe(self, now: float, local_ports: Iterable[int]) -> str:
        self._first_seen = {port: self._first_seen.get(port, now) for port in set(local_ports)}
        if any(now - seen >= self.held for seen in self._first_seen.values()):
            return REGISTERED
        if now - self.started >= self.timeout and not self._first_seen:  # not while a connection may be the one
            return STUCK
        return WAITING


def register_timeout() -> float:
    return duration_seconds(TIMEOUT_VAR, DEFAULT_TIMEOUT_S, "seconds")


def scheduler_ips(host: str) -> set:
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return {host}


def connection_ports(pid: int, ips: set, port: int) -> list[int] | None:
    """Local ports of process `pid`'s established TCP connections to ips:port; None once the process is gone."""
    import psutil  # lazy: only starters of cluster ranks read connections

    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return []
    return [
        c.laddr.port
        for c in connections
        if c.raddr and c.raddr.port == port and c.raddr.ip in ips and c.status == psutil.CONN_ESTABLISHED
    ]


@dataclass
class RankRegistrations:
    """The ranks a starter started into the cluster at host:port, watched until each registered. `stuck()` names
    those that did not within the timeout; `restart_stuck` has the starter restart them, at most MAX_RESTARTS times."""

    host: str
    port: int
    timeout: float = field(default_factory=register_timeout)
    clock: Callable[[], float] = time.monotonic
    sample: Callable[[int, set, int], list[int] | None] = connection_ports
    _ips: set = field(default_factory=set, init=False)
    _watches: dict[int, tuple] = field(default_factory=dict, init=False)  # rank -> (pid, RegistrationWatch)
    _restarts: dict[int, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._ips = scheduler_ips(self.host)

    def started(self, rank: int, pid: int) -> None:
        self._watches[rank] = (pid, RegistrationWatch(self.clock(), self.timeout))

    def stuck(self) -> list[int]:
        """Ranks whose process did not register within the timeout. Ranks seen registered are no longer watched,
        nor those whose process is gone (their starter sees it exit)."""
        stuck = []
        for rank, (pid, watch) in list(self._watches.items()):
            ports = self.sample(pid, self._ips, self.port)
            state = None if ports is None else watch.observe(self.clock(), ports)
            if state in (None, REGISTERED):
                del self._watches[rank]
            elif state == STUCK:
                stuck.append(rank)
        return stuck

    def restart_stuck(self, restart: Callable[[int], int]) -> list[int]:
        """Calls `restart(rank)`, which stops the rank's process and starts a new one and returns its pid, for each
        stuck rank, and returns those ranks; raises RuntimeError for a rank stuck after MAX_RESTARTS restarts."""
        stuck = self.stuck()
        for rank in stuck:
            reason = (
                f"cluster rank {rank} did not register with the cluster scheduler at {self.host}:{self.port} "
                f"within {self.timeout:g} s of its start ({TIMEOUT_VAR}): MindSpore's client keeps failing to "
                "connect"
            )
            restarts = self._restarts.get(rank, 0)
            if restarts >= MAX_RESTARTS:
                raise RuntimeError(f"{reason}; it was started {restarts + 1} times")
            log.warning(f"{reason}; starting it again")
            self._restarts[rank] = restarts + 1
            self.started(rank, restart(rank))
        return stuck


def watching(address: "ClusterAddress | None") -> RankRegistrations | None:
    """A RankRegistrations for the cluster at `address` (a ClusterAddress), None without a cluster."""
    return None if address is None else RankRegistrations(address.host, address.port)
