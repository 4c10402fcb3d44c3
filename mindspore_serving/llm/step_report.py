"""The engine's periodic statistics line: what its steps did since the last report, and running totals.

`StepReport` is fed every `StepStats` of the engine (from its loop thread) and renders one log line on demand:
steps and model steps, generated and prompt tokens, the mean decode batch (per model step, as the engine
benchmark counts it), preemptions, the queue and the KV cache. The totals at the end let a reader diff two
lines (a benchmark run, say) without the intervals lining up. Pure logic: the caller decides when to report
(`EngineLoop`: every `stats_interval` seconds while busy, and each time the engine goes idle).
"""
import time
from dataclasses import dataclass, fields
from typing import Callable, Optional

from mindspore_serving.llm.engine_core import StepStats


@dataclass
class StepCounters:
    steps: int = 0             # engine steps (one scheduling round each)
    model_steps: int = 0       # graph steps: a multi-step round counts its steps
    prompt_steps: int = 0      # steps that computed prompt tokens
    decode_steps: int = 0      # model steps with decode rows
    decode_rows: int = 0       # decode rows summed over those model steps
    generated: int = 0         # tokens sampled and kept
    prompt_tokens: int = 0
    preempted: int = 0
    busy_s: float = 0.0        # schedule + execute + update

    def add(self, stats: StepStats) -> None:
        steps = stats.num_model_steps
        self.steps += 1
        self.model_steps += steps
        self.prompt_steps += 1 if stats.num_prefill_seqs else 0
        if stats.num_decode_seqs:
            # a multi-step round: its rows' kept tokens over its steps (rows that stopped early count less)
            self.decode_steps += steps
            self.decode_rows += stats.num_new_tokens if steps > 1 else stats.num_decode_seqs
        self.generated += stats.num_new_tokens
        self.prompt_tokens += stats.num_prefill_tokens
        self.preempted += stats.num_preempted
        self.busy_s += stats.schedule_s + stats.execute_s + stats.update_s

    @property
    def mean_decode_batch(self) -> float:
        return self.decode_rows / self.decode_steps if self.decode_steps else 0.0


class StepReport:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.totals = StepCounters()
        self.window = StepCounters()
        self.window_started = 0.0  # when the window's first step began (idle time before it is not counted)
        self.last: Optional[StepStats] = None

    def add(self, stats: StepStats) -> None:
        if not self.window.steps:
            self.window_started = self._clock() - (stats.schedule_s + stats.execute_s + stats.update_s)
        self.totals.add(stats)
        self.window.add(stats)
        self.last = stats

    @property
    def pending(self) -> bool:
        """Steps ran since the last report."""
        return self.window.steps > 0

    def due(self, interval: float) -> bool:
        return self.pending and self._clock() - self.window_started >= interval

    def line(self) -> str:
        """The report of the steps since the last one (from the first of them to now) and the totals; starts a
        new window."""
        now = self._clock()
        w, elapsed = self.window, max(now - self.window_started, 1e-9)
        text = (f"engine: {w.steps} steps ({w.model_steps} model steps, {w.prompt_steps} with prompt tokens) in "
                f"{elapsed:.2f} s, busy {w.busy_s / elapsed:.0%}: {w.generated} tokens generated "
                f"({w.generated / elapsed:.1f}/s), {w.prompt_tokens} prompt tokens, mean decode batch "
                f"{w.mean_decode_batch:.2f}, {w.preempted} preempted")
        if self.last is not None:
            text += (f"; now {self.last.num_running} running, {self.last.num_waiting} waiting, KV cache "
                     f"{self.last.kv_usage:.1%} used")
        text += "; totals " + " ".join(f"{f.name}={_number(getattr(self.totals, f.name))}"
                                       for f in fields(StepCounters))
        self.window = StepCounters()
        return text


def _number(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
