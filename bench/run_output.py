"""What a benchmark run prints and writes: timestamped progress lines, and the JSON report with the machine's load
and the run's wall time at its end."""

import json
import os
import time


def log(text: str):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def write_report(report: dict, started: float, path: str, indent: int):
    """Closes the report's "meta" (load average at the end, wall seconds since `started`) and writes it to `path`."""
    report["meta"]["loadavg_end"] = os.getloadavg()
    report["meta"]["wall_s"] = round(time.time() - started, 1)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as stream:
        json.dump(report, stream, indent=indent)


def note_other_load(others, what: str = ""):
    """Warns when other processes took a fair share of the cores during the measurements (`others`: cores each)."""
    if others and sum(others) / len(others) > 0.3:
        log(
            f"note: other processes used {sum(others) / len(others):.2f} of {os.cpu_count()} cores on average during "
            f"the measurements{what}: absolute numbers are depressed, compare rows of one run"
        )
