"""The engine's periodic statistics line: what its steps did since the last report, and running totals.

`StepReport` is fed every `StepStats` of the engine (from its loop thread) and renders one log line on demand: steps
and model steps, generated and prompt tokens, the mean decode batch (per model step, as the engine benchmark counts
it), preemptions, speculative decoding's acceptance (when it ran), the queue and the KV cache. The totals at the end
let a reader diff two lines (a benchmark run, say) without the intervals lining up. Pure logic: the caller decides
when to report (`EngineLoop`: every `stats_interval` seconds while busy, and each time the engine goes idle).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from mindspore_serving.llm.engine_core import StepStats
from mindspore_serving.llm.step_executor import add_per_position


@dataclass
class StepCounters:
    steps: int = 0  # engine steps (one scheduling round each)
    model_steps: int = 0  # graph steps: a multi-step round counts its steps
    prompt_steps: int = 0  # steps that computed prompt tokens
    decode_steps: int = 0  # model steps with decode rows
    decode_rows: int = 0  # decode rows summed over those model steps
    generated: int = 0  # tokens sampled and kept
    prompt_tokens: int = 0
    preempted: int = 0
    busy_s: float = 0.0  # schedule + execute + update
    drafts: int = 0  # speculative decoding: rows that verified proposed tokens
    draft_tokens: int = 0  # tokens proposed to them
    accepted_tokens: int = 0  # of which the model kept
    accepted_per_position: list[int] = field(default_factory=list)
    """[j]: drafts whose token j was kept."""

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
        if stats.num_drafts:
            self.drafts += stats.num_drafts
            self.draft_tokens += stats.num_draft_tokens
            self.accepted_tokens += stats.num_accepted_tokens
            add_per_position(self.accepted_per_position, stats.accepted_per_position)

    def absorb(self, other: "StepCounters") -> None:
        """Adds another's counts to these (the totals of an engine loop that was replaced)."""
        for f in fields(self):
            if f.name == "accepted_per_position":
                add_per_position(self.accepted_per_position, other.accepted_per_position)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def acceptance_rate(self) -> float:
        """Proposed tokens the model kept, of those proposed (speculative decoding)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verifying row produced per step: its accepted proposals and its own token (vLLM's mean
        acceptance length)."""
        return 1 + self.accepted_tokens / self.drafts if self.drafts else 0.0

    @property
    def mean_decode_batch(self) -> float:
        return self.decode_rows / self.decode_steps if self.decode_steps else 0.0


class StepReport:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.totals = StepCounters()
        self.window = StepCounters()
        self.window_started = 0.0  # when the window's first step began (idle time before it is not counted)
        self.last: StepStats | None = None

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
        text = (
            f"engine: {w.steps} steps ({w.model_steps} model steps, {w.prompt_steps} with prompt tokens) in "
            f"{elapsed:.2f} s, busy {w.busy_s / elapsed:.0%}: {w.generated} tokens generated "
            f"({w.generated / elapsed:.1f}/s), {w.prompt_tokens} prompt tokens, mean decode batch "
            f"{w.mean_decode_batch:.2f}, {w.preempted} preempted"
        )
        if w.drafts:
            text += (
                f"; speculative decoding: {w.drafts} drafts, {w.accepted_tokens} of {w.draft_tokens} proposed "
                f"tokens accepted ({w.acceptance_rate:.1%}), mean accepted length {w.mean_accepted_length:.2f}"
            )
        if self.last is not None:
            text += (
                f"; now {self.last.num_running} running, {self.last.num_waiting} waiting, KV cache "
                f"{self.last.kv_usage:.1%} used"
            )
        # speculative decoding's counts once it has run
        shown = [
            f.name
            for f in fields(StepCounters)
            if f.name != "accepted_per_position" and (self.totals.drafts or f.name not in _SPECULATIVE)
        ]
        text += "; totals " + " ".join(f"{name}={_number(getattr(self.totals, name))}" for name in shown)
        self.window = StepCounters()
        return text


_SPECULATIVE = ("drafts", "draft_tokens", "accepted_tokens")


def _number(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
