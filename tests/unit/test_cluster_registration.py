"""RegistrationWatch and RankRegistrations: when a cluster rank counts as registered, stuck, or gone, and how its
starter restarts it (fake clock and connection samples; the real ones are psutil's)."""

import pytest
from serving_process import free_port

from mindspore_serving.common import cluster_registration as cr

PORT = free_port()  # the scheduler's port the messages name (nothing listens)


def test_a_connection_held_long_enough_means_registered():
    watch = cr.RegistrationWatch(started=0.0, timeout=10.0, held=1.5)
    assert watch.observe(1.0, [5001, 5002]) == cr.WAITING
    assert watch.observe(2.0, [5001, 5002]) == cr.WAITING
    assert watch.observe(2.5, [5001, 5002]) == cr.REGISTERED


def test_connections_replaced_at_every_try_never_count_and_time_out():
    watch = cr.RegistrationWatch(started=0.0, timeout=5.0, held=1.5)
    now, port = 0.0, 6000
    states = []
    while now < 7.0:  # a retrying client: a new connection every 0.6 s, gone before the next sample pair
        states.append(watch.observe(now, [port]))
        states.append(watch.observe(now + 0.4, []))
        now, port = now + 0.6, port + 1
    assert cr.REGISTERED not in states
    assert states[-1] == cr.STUCK


def test_not_stuck_while_a_connection_is_open_at_the_timeout():
    watch = cr.RegistrationWatch(started=0.0, timeout=5.0, held=1.5)
    assert watch.observe(4.9, [7000]) == cr.WAITING
    assert watch.observe(5.5, [7000]) == cr.WAITING  # it may be the one that registers
    assert watch.observe(6.5, [7000]) == cr.REGISTERED
    other = cr.RegistrationWatch(started=0.0, timeout=5.0, held=1.5)
    assert other.observe(5.2, [7001]) == cr.WAITING
    assert other.observe(5.6, []) == cr.STUCK


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def tracker(samples, timeout=10.0):
    clock = Clock()
    return cr.RankRegistrations(
        "127.0.0.1", PORT, timeout=timeout, clock=clock, sample=lambda pid, ips, port: samples.get(pid, [])
    ), clock


def test_a_stuck_rank_is_restarted_and_its_new_process_watched_afresh():
    samples = {}
    registrations, clock = tracker(samples)
    registrations.started(0, pid=100)
    registrations.started(1, pid=101)
    samples[101] = [5555]
    restarted = []

    def restart(rank):
        restarted.append(rank)
        return 200 + rank

    registrations.restart_stuck(restart)
    clock.now = 2.0
    registrations.restart_stuck(restart)  # rank 1 registered: no longer watched
    clock.now = 10.5
    registrations.restart_stuck(restart)
    assert restarted == [0]
    clock.now = 15.0
    registrations.restart_stuck(restart)  # the new process has its own 10 s
    assert restarted == [0]
    samples[200] = [6000]
    clock.now = 16.0
    registrations.restart_stuck(restart)
    clock.now = 18.0
    registrations.restart_stuck(restart)
    clock.now = 40.0
    registrations.restart_stuck(restart)
    assert restarted == [0]


def test_a_rank_stuck_after_every_restart_fails_the_start_with_the_reason():
    registrations, clock = tracker({}, timeout=5.0)
    registrations.started(0, pid=100)
    pids = iter(range(300, 400))
    with pytest.raises(RuntimeError) as err:
        for _ in range(cr.MAX_RESTARTS + 2):
            clock.now += 6.0
            registrations.restart_stuck(lambda rank: next(pids))
    assert f"cluster rank 0 did not register with the cluster scheduler at 127.0.0.1:{PORT} within 5 s" in str(
        err.value
    )
    assert f"started {cr.MAX_RESTARTS + 1} times" in str(err.value)
    assert cr.TIMEOUT_VAR in str(err.value)


def test_a_rank_whose_process_is_gone_is_left_to_its_starter():
    samples = {100: None}
    registrations, clock = tracker(samples, timeout=1.0)
    registrations.started(0, pid=100)
    clock.now = 5.0
    registrations.restart_stuck(lambda rank: pytest.fail("a gone process is not restarted here"))


def test_the_timeout_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv(cr.TIMEOUT_VAR, "12.5")
    assert cr.RankRegistrations("127.0.0.1", 1).timeout == 12.5
    monkeypatch.setenv(cr.TIMEOUT_VAR, "soon")
    with pytest.raises(ValueError, match=cr.TIMEOUT_VAR):
        cr.RankRegistrations("127.0.0.1", 1)


def test_connection_ports_reads_a_real_process():
    import os
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    try:
        port = server.getsockname()[1]
        assert cr.connection_ports(os.getpid(), {"127.0.0.1"}, port) == [client.getsockname()[1]]
        assert cr.connection_ports(os.getpid(), {"127.0.0.2"}, port) == []
    finally:
        client.close()
        server.close()


def test_the_distributed_starter_waits_on_the_ready_pipe_of_a_restarted_rank():
    import os

    from mindspore_serving.agent.distributed import startup
    from mindspore_serving.ipc import distributed as protocol

    group = startup.AgentGroupProcesses("127.0.0.1:1", "127.0.0.1")
    first, second = os.pipe(), os.pipe()
    ready_fds = [first[0], second[0]]
    replacement = os.pipe()
    calls = []

    def restart_stuck():
        calls.append(1)
        if len(calls) > 1:
            return []
        os.close(first[1])  # the stuck process is gone: its pipe ends without a ready line
        os.close(ready_fds[0])
        ready_fds[0] = replacement[0]
        os.write(replacement[1], protocol.READY_LINE)
        return [0]

    os.write(second[1], protocol.READY_LINE)
    try:
        startup._wait_ready(group, ready_fds, restart_stuck)
    finally:
        for fd in (second[0], second[1], replacement[0], replacement[1]):
            os.close(fd)
    assert len(calls) >= 1


class FakeProcess:
    def __init__(self, pid):
        self.pid = pid
        self.killed = False

    def poll(self):
        return -9 if self.killed else None

    def kill(self):
        self.killed = True

    def wait(self, timeout=None):
        return -9


def test_the_llm_starter_replaces_a_stuck_rank_and_reads_the_new_ones_pipe():
    import os

    from mindspore_serving.ipc import agent as protocol
    from mindspore_serving.worker.llm import agents

    stuck_read, stuck_write = os.pipe()
    processes = [FakeProcess(100)]
    pipes = {stuck_read: (0, protocol.StartupEventReader())}
    registrations, clock = tracker({}, timeout=0.0)
    registrations.started(0, 100)
    writers = [stuck_write]

    def spawn(rank):
        read_fd, write_fd = os.pipe()
        writers.append(write_fd)
        protocol.write_startup_event(write_fd, rank, ready_pid=200)
        pipes[read_fd] = (rank, protocol.StartupEventReader())
        return FakeProcess(200)

    try:
        agents._wait_ready(processes, [0], pipes, None, registrations, spawn)
    finally:
        for fd in writers + list(pipes):
            os.close(fd)
    assert processes[0].pid == 200 and not processes[0].killed
    assert len(pipes) == 1  # the stuck one's pipe was closed (its number may be the new one's)
