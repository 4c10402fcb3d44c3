"""py-spy for the benchmarks: where its binary is, and summaries of a `py-spy record -f raw` file (collapsed
stacks): where the samples go.

    python bench/pyspy_summary.py master.txt [--top 25] [--focus SUBSTRING ...]

Prints the share of samples per thread (when recorded with --threads), the functions with the most samples
at the top of the stack (self) and anywhere in the stack (inclusive, counted once per sample), and for each
--focus substring the share of samples whose stack contains it.
"""

import argparse
import collections
import os
import re
import shutil
import sys

_FRAME = re.compile(r"^(.*?) \((.*?)(?::\d+)?\)$")


def py_spy() -> str:
    """The py-spy binary on PATH or beside this Python's executable (the virtual environment); "" when missing."""
    found = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    return found if os.path.exists(found) else ""


def load(path: str):
    stacks = []
    with open(path) as stream:
        for line in stream:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            try:
                stacks.append((stack.split(";"), int(count)))
            except ValueError:
                continue
    return stacks


def function_name(frame: str) -> str:
    """'name (file.py:12)' -> 'name (file.py)': merge lines of one function."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    name, where = match.groups()
    return f"{name} ({where})"


def summarise(stacks, top: int, focus):
    total = sum(count for _, count in stacks) or 1
    threads = collections.Counter()
    selfs = collections.Counter()
    inclusive = collections.Counter()
    for frames, count in stacks:
        if frames and frames[0].startswith("thread ("):
            threads[frames[0]] += count
            frames = frames[1:]
        names = [function_name(f) for f in frames]
        if names:
            selfs[names[-1]] += count
        for name in set(names):
            inclusive[name] += count
    out = [f"samples: {total}"]
    if threads:
        out.append("threads:")
        out += [f"  {count / total:6.1%}  {name}" for name, count in threads.most_common(top)]
    out.append("self (top of stack):")
    out += [f"  {count / total:6.1%}  {name}" for name, count in selfs.most_common(top)]
    out.append("inclusive:")
    out += [f"  {count / total:6.1%}  {name}" for name, count in inclusive.most_common(top)]
    for text in focus:
        count = sum(c for frames, c in stacks if any(text in f for f in frames))
        out.append(f"focus {text!r}: {count / total:.1%}")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--focus", nargs="*", default=[])
    args = parser.parse_args(argv)
    print(summarise(load(args.path), args.top, args.focus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
