"""Bytes of the Step messages the LLM worker sends its agents, with block tables sent whole every step against
sent once and then only the blocks appended (ipc/agent.py StepEncoder), on the serving benchmark's workload.

    python bench/agent_step_bytes.py [--requests 96] [--config config/llama_tiny.yaml]

The bundled config's engine schedules the requests (all arriving at once, as a saturating run) over a fake model
of the served graphs' geometry: the scheduling, and so the messages, are those of the served engine; no graph
runs. Prints a table and writes bench/results/agent_step_bytes.json.
"""

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_engine import run_engine, workload
from run_output import log, write_report

from mindspore_serving.ipc.agent import StepEncoder
from mindspore_serving.llm.testing import FakeModelRunner
from mindspore_serving.spec.llm_config import load_serving_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class MeasuredRunner(FakeModelRunner):
    """Encodes every step it is given both ways, as an AgentRunner would send it."""

    def __init__(self, **geometry):
        super().__init__(**geometry)
        self.encoder = StepEncoder()
        self.sizes = []  # (rows, whole bytes, diff bytes, block-table bytes sent whole, sent as diffs)
        self._step_id = 0
        self._in_round = False

    def _measure(self, seqs, greedy_steps: int):
        self._step_id += 1
        whole = StepEncoder().encode(
            self._step_id, [dataclasses.replace(s, seq_id=-1) for s in seqs], greedy_steps, self._step_id - 1
        )
        diff = self.encoder.encode(self._step_id, seqs, greedy_steps, self._step_id - 1)
        self.sizes.append(
            (len(seqs), whole.ByteSize(), diff.ByteSize(), len(whole.block_tables), len(diff.block_tables))
        )

    def run(self, seqs):
        if not self._in_round:  # the steps of a round travel as the round's one message
            self._measure(seqs, 0)
        return super().run(seqs)

    def run_greedy(self, seqs, num_steps: int):
        self._measure(seqs, num_steps)
        self._in_round = True
        try:
            return super().run_greedy(seqs, num_steps)
        finally:
            self._in_round = False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(ROOT, "config", "llama_tiny.yaml"))
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "agent_step_bytes.json"))
    args = parser.parse_args()
    started = time.time()
    config = load_serving_config(args.config)
    model = config.model_file().model
    runner = MeasuredRunner(
        num_blocks=config.engine.num_blocks,
        block_size=config.engine.block_size,
        max_seq_len=model.max_seq_len,
        vocab_size=model.vocab_size,
    )
    requests = workload(args.requests, model.vocab_size, config.engine.max_model_len)
    log(
        f"{args.requests} requests through the engine ({config.engine.batching}, "
        f"{config.engine.num_scheduler_steps} steps per round) on a fake model"
    )
    run = run_engine(runner, config.engine, requests)
    sizes = np.array(runner.sizes, dtype=np.float64)
    rows = [("all messages", sizes), ("16-row messages", sizes[sizes[:, 0] == sizes[:, 0].max()])]
    report = {
        "meta": {
            "config": args.config,
            "requests": args.requests,
            "messages": len(sizes),
            "engine_steps": run["steps"],
        },
        "results": [],
    }
    print("\n| messages | count | mean rows | whole tables B | diffs B | ratio | table ids sent whole | as diffs |")
    print("|---|---|---|---|---|---|---|---|")
    for name, part in rows:
        mean = part.mean(axis=0)
        result = {
            "messages": name,
            "count": len(part),
            "mean_rows": mean[0],
            "whole_bytes": mean[1],
            "diff_bytes": mean[2],
            "ratio": mean[2] / mean[1],
            "whole_table_ids": mean[3],
            "diff_table_ids": mean[4],
        }
        report["results"].append(result)
        print(
            f"| {name} | {len(part)} | {mean[0]:.1f} | {mean[1]:.0f} | {mean[2]:.0f} | {mean[2] / mean[1]:.2f} | "
            f"{mean[3]:.1f} | {mean[4]:.1f} |"
        )
    write_report(report, started, args.out, 1)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
