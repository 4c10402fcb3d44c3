"""The engine's statistics line: windows, multi-step rounds, totals, and the loop that logs it."""

import logging
import re

from mindspore_serving import log
from mindspore_serving.llm import LLMEngine, SchedulerConfig
from mindspore_serving.llm.engine_core import StepStats
from mindspore_serving.llm.engine_loop import EngineLoop
from mindspore_serving.llm.step_report import StepReport
from mindspore_serving.llm.testing import FakeModelRunner


def stats(
    decode=0, prefill=0, prefill_tokens=0, new=0, model_steps=1, seconds=0.01, running=3, waiting=1, **speculative
):
    return StepStats(
        step_id=0,
        num_seqs=decode + prefill,
        num_prefill_seqs=prefill,
        num_decode_seqs=decode,
        num_prefill_tokens=prefill_tokens,
        num_decode_tokens=decode * model_steps,
        num_batched_tokens=prefill_tokens + decode,
        token_budget_usage=0.5,
        num_preempted=0,
        num_new_tokens=new,
        num_finished=0,
        num_running=running,
        num_waiting=waiting,
        kv_usage=0.25,
        num_free_blocks=10,
        schedule_s=0.0,
        execute_s=seconds,
        update_s=0.0,
        num_model_steps=model_steps,
        **speculative,
    )


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def totals(line):
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line.split("totals ", 1)[1])}


def test_window_counts_from_its_first_step_and_decode_batch_is_per_model_step():
    clock = Clock()
    report = StepReport(clock)
    assert not report.pending and not report.due(1.0)
    clock.now = 500.0  # idle time before the first step is not part of the window
    report.add(stats(prefill=2, prefill_tokens=40, new=2, seconds=0.5))  # prompts only: no decode batch
    clock.now = 501.0
    report.add(stats(decode=4, prefill=1, prefill_tokens=10, new=5))  # a mixed step: 4 decode rows
    report.add(stats(decode=8, new=30, model_steps=4))  # a round of 4: 30 tokens kept
    assert report.pending and report.due(1.5) and not report.due(2.0)
    line = report.line()
    assert "3 steps (6 model steps, 2 with prompt tokens) in 1.50 s" in line
    assert "37 tokens generated (24.7/s), 50 prompt tokens" in line
    assert "mean decode batch 6.80" in line  # (4 + 30) rows over 1 + 4 decode model steps
    assert "now 3 running, 1 waiting, KV cache 25.0% used" in line
    assert totals(line) == {
        "steps": 3,
        "model_steps": 6,
        "prompt_steps": 2,
        "decode_steps": 5,
        "decode_rows": 34,
        "generated": 37,
        "prompt_tokens": 50,
        "preempted": 0,
        "busy_s": 0.52,
    }
    assert not report.pending
    report.add(stats(decode=2, new=2))
    later = report.line()
    assert "1 steps (1 model steps" in later and "mean decode batch 2.00" in later
    assert totals(later)["steps"] == 4 and totals(later)["decode_rows"] == 36


def test_engine_loop_logs_a_line_when_it_goes_idle(caplog):
    runner = FakeModelRunner(num_blocks=64, block_size=4, max_seq_len=64, vocab_size=97)
    config = SchedulerConfig.for_runner(runner, max_num_seqs=4, max_num_batched_tokens=64)
    loop = EngineLoop(LLMEngine(runner, scheduler_config=config), stats_interval=60.0)
    log.get_level()  # the logger is set up at its first use: before caplog changes its level
    logger = logging.getLogger("mindspore_serving")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="mindspore_serving"):
            streams = [
                loop.submit([1, 2, 3], {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True}) for _ in range(3)
            ]
            for stream in streams:
                stream.result()
            loop.close()
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine: ")]
    assert lines, "no statistics line when the engine went idle"
    assert sum(totals(line)["generated"] for line in lines[-1:]) == 15
    assert "now 0 running, 0 waiting" in lines[-1]


def test_speculative_decoding_shows_its_acceptance_once_it_has_run():
    report = StepReport(clock=lambda: 10.0)
    report.add(stats(num_drafts=2, num_draft_tokens=8, num_accepted_tokens=6, accepted_per_position=(2, 2, 1, 1)))
    report.add(stats(num_drafts=1, num_draft_tokens=4, num_accepted_tokens=1, accepted_per_position=(1,)))
    assert report.totals.accepted_per_position == [3, 2, 1, 1]
    line = report.line()
    assert "3 drafts, 7 of 12 proposed tokens accepted (58.3%), mean accepted length 3.33" in line
    assert totals(line)["accepted_tokens"] == 7
