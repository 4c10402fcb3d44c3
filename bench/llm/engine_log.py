"""What the server's logs say about its engine: the master's INFO line per request (the engine's own TTFT, ITL and
e2e) and the running totals of the workers' engine statistics lines (engine.stats_interval)."""

import re

_ENGINE_LINE = re.compile(
    r"LLM request (\w+) \(openai.*?completion_tokens=(\d+).*?"
    r"\(engine: ttft=([\d.]+)ms itl=([\d.-]+)(?:ms)? e2e=([\d.]+)ms\)"
)
_TOTALS_LINE = re.compile(r"engine: .*?; totals (.*)$", re.M)


def engine_timings(server_output: str) -> dict[str, tuple[float, float, float]]:
    """request id -> (engine TTFT, engine ITL, engine e2e) in seconds, from the master's INFO lines."""
    found = {}
    for match in _ENGINE_LINE.finditer(server_output):
        itl = match.group(4)
        found[match.group(1)] = (
            float(match.group(3)) / 1000,
            float(itl) / 1000 if itl != "-" else float("nan"),
            float(match.group(5)) / 1000,
        )
    return found


def engine_totals(server_output: str) -> list[dict[str, float]]:
    """The running totals of every engine statistics line (engine.stats_interval) in the server's output."""
    return [
        {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", m.group(1))}
        for m in _TOTALS_LINE.finditer(server_output)
    ]


def engine_steps(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict | None:
    """What the engine's steps did during a run: the difference of the last totals after it and before it, with
    the mean decode batch per model step (the engine's own occupancy, as llm_engine.run_engine counts it)."""
    if len(after) <= len(before):
        return None
    start = before[-1] if before else {k: 0.0 for k in after[-1]}
    diff = {k: round(v - start.get(k, 0.0), 3) for k, v in after[-1].items()}
    diff["mean_decode_batch"] = (
        round(diff["decode_rows"] / diff["decode_steps"], 3) if diff.get("decode_steps") else 0.0
    )
    return diff
