"""Runs every scenario of tests/compat/scenarios.py against MindSpore Serving 2.0.2 and against ours, and reports
where a user could tell them apart.

    .venv/bin/python tests/compat/compare.py [--only TEXT] [--ours-only] [--keep DIR] [--json PATH]

MindSpore Serving 2.0.2 runs from the build of bench/peers/orig_ms_setup.py (its Python 3.9 venv, MindSpore Lite
2.0.0 as the CPU backend, tensor_add.mindir exported by MindSpore 2.0); when that build is absent the comparison
is skipped (exit 0) unless --ours-only asks for our observations alone. Both run the same scripts
(target_server.py, target_client.py) with their own interpreter and package.

Each scenario is `same`, `known` (listed in KNOWN with the reason; docs/serving.md, "Differences from MindSpore
Serving", says why to users) or `DIFFERS`; the run prints a table and the differing observations, writes every
observation to --json (default bench/results/compat.json), and exits 1 when a scenario differs without a reason.
"""

import argparse
import importlib.util
import json
import os
import sys

from harness import ROOT, Target, run_target

sys.path.insert(0, os.path.join(ROOT, "tests"))  # tests/certificates.py
from scenarios import GROUPS

ORIG_SETUP = os.path.join(ROOT, "bench", "peers", "orig_ms_setup.py")

# scenario -> why ours differs on purpose (each is in docs/serving.md, "Differences from MindSpore Serving")
_DEVICE_PROBE = (
    "this build of MindSpore Serving has MindSpore Lite only: its device-sharing check imports MindSpore in a child "
    "and fails; with MindSpore installed it lets servables share a CPU or GPU device, as ours does"
)
_CONSTANT_RETURN = (
    "refused with MindSpore Serving's own text for a returned value that is no placeholder; for a single one it "
    "fails in Python first ('int' object is not iterable)"
)
KNOWN: dict[str, str] = {
    "rest: status line": "the reason phrase is HTTP's 'OK'; MindSpore Serving writes 'Client' (clients ignore it)",
    "rest: body not JSON": "after 'Illegal JSON format.' each parser says what it found in its own words",
    "grpc: no instances": "answered with INVALID_INPUTS; MindSpore Serving's master never answers it",
    "faults: requests while a killed worker restarts": "an unavailable servable is HTTP 503 + Retry-After",
    "faults: a worker killed before its first request, a request 3 s later": (
        "a dead worker is restarted even if it never answered a request (MindSpore Serving then stops the server)"
    ),
    "start-up: a method returning a constant": _CONSTANT_RETURN,
    "logs: a method returning a constant: error lines": _CONSTANT_RETURN,
    "start-up: two versions of one servable on one device": _DEVICE_PROBE,
    "logs: two versions of one servable on one device: error lines": _DEVICE_PROBE,
    "start-up: two servables on one device": _DEVICE_PROBE,
    "logs: two servables on one device: error lines": _DEVICE_PROBE,
}


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def targets() -> tuple[Target, Target | None]:
    """Ours, and MindSpore Serving 2.0.2 when its build is complete."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GLOG_v", "PYTHONSAFEPATH")}
    ours = Target(
        "ours",
        os.path.join(ROOT, ".venv", "bin", "python"),
        {**env, "PYTHONPATH": ROOT},
        {"tensor_add.mindir": os.path.join(ROOT, "servables", "add", "1", "tensor_add.mindir")},
        {"enable_lite": True},
    )
    setup = _load("orig_ms_setup", ORIG_SETUP)
    if not setup.complete():
        return ours, None
    lite = setup.LITE_LIB
    original = Target(
        "original",
        setup.PYTHON,
        {**env, "LD_LIBRARY_PATH": ":".join(p for p in (lite, env.get("LD_LIBRARY_PATH")) if p)},
        {"tensor_add.mindir": os.path.join(setup.SERVABLES, "add", "1", "tensor_add.mindir")},
        {"enable_lite": True},
    )
    return ours, original


def compare(ours: dict, original: dict) -> list[tuple[str, str]]:
    """(scenario, verdict) of every scenario."""
    verdicts = []
    for name in ours:
        if ours[name] == original.get(name):
            verdicts.append((name, "same"))
        elif name in KNOWN:
            verdicts.append((name, "known"))
        else:
            verdicts.append((name, "DIFFERS"))
    return verdicts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run only the groups or scenarios whose name holds this text")
    parser.add_argument("--ours-only", action="store_true", help="observe ours alone (no comparison)")
    parser.add_argument("--keep", default=None, help="keep every server's run directory under this folder")
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "compat.json"))
    args = parser.parse_args(argv)
    groups = [g for g in GROUPS if args.only in g.name or any(args.only in s.name for s in g.scenarios)]
    ours, original = targets()
    if original is None and not args.ours_only:
        print("MindSpore Serving 2.0.2 is not built (python bench/peers/orig_ms_setup.py builds it): skipped")
        return 0
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    seen = {"ours": run_target(groups, ours, args.keep)}
    if not args.ours_only:
        seen["original"] = run_target(groups, original, args.keep)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    if args.ours_only:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(seen, stream, indent=1, sort_keys=True)
        print(json.dumps(seen["ours"], indent=1))
        return 0
    verdicts = compare(seen["ours"], seen["original"])
    differing = [name for name, verdict in verdicts if verdict == "DIFFERS"]
    for name in differing:
        print(
            f"--- {name}\n  original: {json.dumps(seen['original'].get(name))[:1500]}\n"
            f"  ours:     {json.dumps(seen['ours'][name])[:1500]}"
        )
    width = max(len(name) for name, _ in verdicts)
    print(f"\n{'scenario':{width}}  verdict")
    for name, verdict in verdicts:
        print(f"{name:{width}}  {verdict}{'  (' + KNOWN[name] + ')' if verdict == 'known' else ''}")
    counts = {v: sum(1 for _, verdict in verdicts if verdict == v) for v in ("same", "known", "DIFFERS")}
    print(
        f"\n{len(verdicts)} scenarios: {counts['same']} same, {counts['known']} known differences, "
        f"{counts['DIFFERS']} unexplained"
    )
    with open(args.json, "w", encoding="utf-8") as stream:
        json.dump({"verdicts": dict(verdicts), "known": KNOWN, **seen}, stream, indent=1, sort_keys=True)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
