"""Starts real serving processes for end-to-end tests: free ports, readiness by log line, whole-tree kill."""

import os
import signal
import socket
import subprocess
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVABLES = os.path.join(ROOT, "servables")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_tree(pid: int, sig=signal.SIGKILL):
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for proc in parent.children(recursive=True) + [parent]:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


class ServingProcess:
    """A Python script run in its own working directory, watched through its output file."""

    def __init__(self, args: list[str], cwd: str, env: dict | None = None, python: str | None = None):
        self.cwd = cwd
        self.output_path = os.path.join(cwd, "server_output.log")
        self._output = open(self.output_path, "wb")
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(
            [python or sys.executable] + args, cwd=cwd, stdout=self._output, stderr=subprocess.STDOUT, env=full_env
        )
        self.descendants: list[psutil.Process] = []

    def output(self) -> str:
        with open(self.output_path, "rb") as stream:
            return stream.read().decode(errors="replace")

    def wait_for(self, text: str, timeout: float = 180.0, count: int = 1) -> str:
        """Waits until `text` appears `count` times in the output; fails early if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.output()
            if out.count(text) >= count:
                self.remember_children()
                return out
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"process exited with {self.proc.returncode} before printing {text!r}:\n{out[-4000:]}"
                )
            time.sleep(0.05)  # ok-sleep: polling a log file with a deadline
        raise AssertionError(f"{text!r} not printed within {timeout} s:\n{self.output()[-4000:]}")

    def remember_children(self):
        try:
            self.descendants = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def close(self, grace: float = 0.0):
        """Stops the process and its tree: with `grace`, SIGTERM and up to that many seconds to exit cleanly;
        then SIGKILL of whatever is left, descendants seen before the SIGTERM included."""
        self.remember_children()
        if grace and self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(grace)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait(10)
        for child in self.descendants:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        self._output.close()


def wait_until(predicate, timeout, what):
    """Polls `predicate()` until it holds; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)  # ok-sleep: polling with a deadline
    raise AssertionError(f"{what} not reached within {timeout} s")


def wait_recovered(check, timeout: float) -> float:
    """Polls `check()` (exceptions count as not yet) until it is true; returns the seconds it took, or fails after
    `timeout` (a restarting service has no readiness signal the client sees)."""
    started = time.monotonic()
    while time.monotonic() < started + timeout:
        try:
            if check():
                return time.monotonic() - started
        except Exception:  # not back yet
            pass
        time.sleep(0.2)  # ok-sleep: polling a restarting service with a deadline
    raise AssertionError(f"the service did not recover within {timeout} s")


def assert_sigterm_stops_all(proc: "ServingProcess", children, timeout: float = 60.0):
    """SIGTERM to `proc`: it exits with code 0 and every process of `children` is gone (zombies aside)."""
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait_exit(timeout) == 0
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def start_server(tmp_path, servables=("add",), extra_args=(), env=None, rest=True):
    """serving_server.py on free ports; returns (process, grpc address, rest address)."""
    grpc_addr = f"127.0.0.1:{free_port()}"
    rest_addr = f"127.0.0.1:{free_port()}" if rest else ""
    args = [
        os.path.join(ROOT, "serving_server.py"),
        "--grpc",
        grpc_addr,
        "--rest",
        rest_addr,
        "--servables",
        ",".join(servables),
        *extra_args,
    ]
    proc = ServingProcess(args, str(tmp_path), env)
    try:
        proc.wait_for("RESTful server start success" if rest else "gRPC server start success")
    except BaseException:
        proc.close()
        raise
    return proc, grpc_addr, rest_addr
