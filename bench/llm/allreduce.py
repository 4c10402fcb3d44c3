"""Cost of one AllReduce of [batch, hidden] float32 between the ranks of a MindSpore cluster on this machine.

`measure(...)` starts a cluster scheduler and one process per rank (this file with --rank), each bound to the cores
its tensor-parallel agent binds to. Each rank exports two tiny Cells per batch to MindIR and runs them loaded
(nn.GraphCell, GRAPH_MODE), as the agents run their graphs: `y * 0.5` followed by ops.AllReduce, and `y * 0.5`
alone; once, and `chain` times in one graph (a step of the tiny LLaMA calls its layer graph once per layer, 4
times, and each call runs 2 AllReduces: after the o projection and after the MLP's down projection). It
times `calls` calls of each, alternating, over `rounds` rounds; the AllReduces' own cost is the difference (the
graph launch and the copy back are in both). Both ranks run the same calls in the same order, so every collective
finds its peer already waiting or about to arrive: this is the communication cost with the ranks in lockstep, not
what a rank waits for a slower peer inside a real step.

    python bench/llm/allreduce.py [--batches 1 8 16] [--calls 200] [--rounds 5]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCH)
RESULT_PREFIX = "ALLREDUCE_RESULT "


def rank_main(args) -> int:
    import numpy as np

    sys.path.insert(0, ROOT)
    from mindspore_serving.common.cpu_affinity import bind_process

    bind_process(json.loads(args.cpus))  # before MindSpore starts its threads, as the agents
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from mindspore_serving.common.ms_cluster import join_cluster

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    rank = join_cluster()

    class Scaled(nn.Cell):
        """`count` times: y = y * 0.5, then (reduce) AllReduce(y); the ranks' equal inputs keep their scale."""

        def __init__(self, reduce: bool, count: int):
            super().__init__()
            self.reduce, self.count = reduce, count
            self.all_reduce = ops.AllReduce()

        def construct(self, x):
            y = x
            for _ in range(self.count):
                y = y * 0.5
                if self.reduce:
                    y = self.all_reduce(y)
            return y

    directory = tempfile.mkdtemp(prefix=f"allreduce_rank{rank}_")
    graphs = {}
    counts = (1, args.chain)
    for batch in args.batches:
        x = Tensor(np.full((batch, args.hidden), 1.0, np.float32))
        for count in counts:
            for reduce in (True, False):
                path = os.path.join(directory, f"b{batch}_x{count}_{'reduce' if reduce else 'plain'}")
                ms.export(Scaled(reduce, count), x, file_name=path, file_format="MINDIR")
                graphs[(batch, count, reduce)] = (nn.GraphCell(ms.load(path + ".mindir")), x)
    # correctness: each AllReduce sums `ranks` equal halves
    ok = all(
        np.allclose(graph(x).asnumpy(), (0.5 * args.ranks) ** count)
        for (_, count, reduce), (graph, x) in graphs.items()
        if reduce
    )

    def timed(graph, x, calls):
        started = time.perf_counter()
        for _ in range(calls):
            graph(x).asnumpy()
        return (time.perf_counter() - started) / calls * 1000

    result = {"rank": rank, "correct": bool(ok), "batches": {}}
    for batch in args.batches:
        rounds = {}
        for count in counts:
            for reduce in (True, False):
                timed(*graphs[(batch, count, reduce)], 20)  # warm
                rounds[f"x{count}_{'allreduce' if reduce else 'plain'}_graph_ms"] = []
        for _ in range(args.rounds):
            for count in counts:
                for reduce in (True, False):
                    rounds[f"x{count}_{'allreduce' if reduce else 'plain'}_graph_ms"].append(
                        timed(*graphs[(batch, count, reduce)], args.calls)
                    )
        result["batches"][str(batch)] = rounds
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    shutil.rmtree(directory, ignore_errors=True)
    return 0


def measure(
    cpus_per_rank,
    batches=(1, 8, 16),
    hidden: int = 128,
    calls: int = 200,
    rounds: int = 5,
    chain: int = 2,
    timeout: float = 300.0,
    host: str = "127.0.0.1",
):
    """Per batch, for graphs of 1 and of `chain` AllReduces: the median over rounds and ranks (and min, max) of ms
    per call of the AllReduce graph, of the plain graph and of their difference (the AllReduces' own cost); plus each
    rank's raw rounds."""
    sys.path.insert(0, ROOT)
    from mindspore_serving.common import ms_cluster

    ranks = len(cpus_per_rank)
    address = ms_cluster.ClusterAddress(host, ms_cluster.free_port(host), ranks)
    scheduler = ms_cluster.start_scheduler(address, stdout=subprocess.DEVNULL)
    procs, logs = [], []
    try:
        for rank in range(ranks):
            env = ms_cluster.rank_env(address, rank)
            env["GLOG_v"] = "3"
            logs.append(tempfile.TemporaryFile(mode="w+"))
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--rank",
                        f"--ranks={ranks}",
                        f"--hidden={hidden}",
                        f"--calls={calls}",
                        f"--rounds={rounds}",
                        f"--chain={chain}",
                        f"--cpus={json.dumps(cpus_per_rank[rank])}",
                        "--batches",
                        *map(str, batches),
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=logs[-1],
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
            )
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.wait()
    try:
        return _summary(procs, outputs, logs, batches, hidden, calls, rounds, chain, cpus_per_rank)
    finally:
        for log in logs:
            log.close()


def _summary(procs, outputs, logs, batches, hidden, calls, rounds, chain, cpus_per_rank):
    import numpy as np

    per_rank = []
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
        if p.returncode != 0 or not lines:
            logs[rank].seek(0)
            tail = logs[rank].read()[-2000:]
            raise RuntimeError(f"AllReduce rank {rank} exited with code {p.returncode} without a result:\n{tail}")
        per_rank.append(json.loads(lines[-1][len(RESULT_PREFIX) :]))
    summary = {
        "hidden": hidden,
        "calls_per_round": calls,
        "rounds": rounds,
        "chain": chain,
        "cpus_per_rank": cpus_per_rank,
        "correct": all(r["correct"] for r in per_rank),
        "per_rank": per_rank,
        "batches": {},
    }
    for batch in batches:
        rows = [r["batches"][str(batch)] for r in per_rank]
        out = {"bytes": batch * hidden * 4}
        for count in (1, chain):
            reduce = np.array([row[f"x{count}_allreduce_graph_ms"] for row in rows])  # [ranks, rounds]
            plain = np.array([row[f"x{count}_plain_graph_ms"] for row in rows])
            net = reduce - plain
            out[f"x{count}"] = {
                "allreduce_graph_ms": float(np.median(reduce)),
                "plain_graph_ms": float(np.median(plain)),
                "allreduce_ms": float(np.median(net)),
                "allreduce_ms_min": float(net.min()),
                "allreduce_ms_max": float(net.max()),
            }
        summary["batches"][batch] = out
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--cpus", default="null", help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--chain", type=int, default=2, help="AllReduces in the second graph (a layer graph of the LLaMA has 2)"
    )
    args = parser.parse_args()
    if args.rank:
        return rank_main(args)
    cpus = sorted(os.sched_getaffinity(0))
    result = measure(
        [[cpus[r % len(cpus)]] for r in range(args.ranks)],
        args.batches,
        args.hidden,
        args.calls,
        args.rounds,
        args.chain,
    )
    print(f"{'batch':>6} {'AllReduces':>10} {'allreduce graph ms':>19} {'plain graph ms':>15} {'AllReduces ms':>14}")
    for batch, row in result["batches"].items():
        for count in (1, args.chain):
            r = row[f"x{count}"]
            print(
                f"{batch:>6} {count:>10} {r['allreduce_graph_ms']:>19.3f} {r['plain_graph_ms']:>15.3f} "
                f"{r['allreduce_ms']:>14.3f}"
            )
    print("correct" if result["correct"] else "WRONG")
    return 0


if __name__ == "__main__":
    sys.exit(main())
