"""The served tiny LLM: serving_server.py with config/llama_tiny.yaml (absolute paths, free ports, agents started by
the worker), its output and its workers' logs."""

import contextlib
import glob
import os

import psutil

MODEL = "llama_tiny"


class LlmServer:
    """serving_server.py with the tiny LLM on free ports (agents started by the worker); stop() kills the tree."""

    def __init__(self, workdir: str, engine_overrides: dict, agents_overrides: dict | None = None):
        """`engine_overrides` naming `speculative` serve config/llama_tiny_spec.yaml (its servable's export of the
        same step graphs as llama_tiny.yaml: proposals are verified in the step that computes them, no graphs of
        their own), else config/llama_tiny.yaml; the overrides replace the config's engine fields."""
        from llm_setup import SPEC_CONFIG, bundled_config, write_config, write_servable  # tests/llm_setup.py

        self.workdir = workdir
        data = bundled_config(SPEC_CONFIG) if "speculative" in engine_overrides else None
        self.config = write_config(workdir, start_port=0, agents=agents_overrides, data=data, **engine_overrides)
        self.servables = write_servable(workdir, self.config)
        self.proc = None
        self.rest = ""
        self.processes: list[psutil.Process] = []

    def start(self):
        from serving_process import start_server  # tests/serving_process.py

        self.proc, _, self.rest = start_server(
            self.workdir, servables=(MODEL,), extra_args=["--servable_directory", self.servables], env={"GLOG_v": "1"}
        )
        self.refresh()

    def refresh(self):
        if self.proc is None:
            return
        self.proc.remember_children()
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.proc.proc.pid)
            self.processes = [root] + root.children(recursive=True)

    def output(self) -> str:
        return self.proc.output() if self.proc is not None else ""

    def worker_logs(self) -> str:
        """The workers' own logs (serving_logs/ in the server's directory), where their engines report."""
        texts = []
        for path in sorted(glob.glob(os.path.join(self.workdir, "serving_logs", "*.log"))):
            with open(path, "rb") as stream:
                texts.append(stream.read().decode(errors="replace"))
        return "\n".join(texts)

    def stop(self):
        if self.proc is None:
            return
        self.proc.close(grace=8)  # SIGTERM, then SIGKILL of whatever of the tree is left
        self.proc = None
