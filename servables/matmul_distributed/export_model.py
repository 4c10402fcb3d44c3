"""Export the `matmul_distributed` servable's rank graphs by running a 2-rank MindSpore cluster on the CPU.

y = x @ w with x float32 [4, 8] and w float32 [8, 8], row-parallel over 2 ranks (MindSpore Serving's
matmul_distributed example, on 2 ranks instead of 8 Ascend cards): rank r holds rows [4r, 4r+4) of w, multiplies
the matching columns of x and all-reduces the partial products, so every rank returns the full y.

* model/device{r}/matmul.mindir: rank r's graph, x [4, 8] -> y [4, 8] (ends in an AllReduce)
* model/pipeline/stage{s}.mindir: the same product as a 2-stage pipeline (no collectives):
  stage 0: x -> (x, x[:, :4] @ w[:4]); stage 1: (x, p) -> p + x[:, 4:] @ w[4:]
* model/weight.npy: w, for the clients' numpy reference

Run from anywhere: ``python servables/matmul_distributed/export_model.py`` (a scheduler and 2 rank processes).
"""

import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_DIR = os.path.join(HERE, "model")
RANKS = 2
ROWS, FEATURES = 4, 8
MODEL_FILES = (
    [f"device{r}/matmul.mindir" for r in range(RANKS)]
    + [f"pipeline/stage{s}.mindir" for s in range(RANKS)]
    + ["weight.npy"]
)
SEED = 20240602


def make_weight():
    return np.random.default_rng(SEED).standard_normal((FEATURES, FEATURES)).astype(np.float32)


def _rank_main():
    """One rank of the export cluster: exports its shard's graph and its pipeline stage, checks both."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from mindspore_serving.common.ms_cluster import join_cluster
    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    rank = join_cluster()
    weight = make_weight()
    half = FEATURES // RANKS
    cols = slice(rank * half, (rank + 1) * half)

    class RowParallelMatMul(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = ms.Parameter(Tensor(weight[cols]), name=f"w{rank}", requires_grad=False)
            self.all_reduce = ops.AllReduce()

        def construct(self, x):
            return self.all_reduce(ops.matmul(x[:, rank * half : (rank + 1) * half], self.weight))

    class FirstStage(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = ms.Parameter(Tensor(weight[:half]), name="w_stage0", requires_grad=False)

        def construct(self, x):
            return x, ops.matmul(x[:, :half], self.weight)

    class LastStage(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = ms.Parameter(Tensor(weight[half:]), name="w_stage1", requires_grad=False)

        def construct(self, x, partial):
            return partial + ops.matmul(x[:, half:], self.weight)

    x = np.arange(ROWS * FEATURES, dtype=np.float32).reshape(ROWS, FEATURES) / 10
    for sub, net, inputs in (
        (f"device{rank}/matmul", RowParallelMatMul(), [x]),
        (
            f"pipeline/stage{rank}",
            FirstStage() if rank == 0 else LastStage(),
            [x] if rank == 0 else [x, x[:, :half] @ weight[:half]],
        ),
    ):
        base = os.path.join(VERSION_DIR, sub)
        os.makedirs(os.path.dirname(base), exist_ok=True)
        ms.export(net, *[Tensor(v) for v in inputs], file_name=base, file_format="MINDIR")
        os.chmod(base + ".mindir", 0o644)  # MindSpore writes it read-only for the owner
        graph = nn.GraphCell(ms.load(base + ".mindir"))
        out = graph(*[Tensor(v) for v in inputs])
        out = out[-1] if isinstance(out, (tuple, list)) else out
        want = x @ weight if sub.startswith("device") or rank == 1 else x[:, :half] @ weight[:half]
        np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-5, atol=1e-5)
        print(f"rank {rank}: exported and checked {base}.mindir", flush=True)
    sys.stdout.flush()
    os._exit(0)  # MindSpore's exit handlers can block in a cluster rank


def main():
    """Runs the export cluster (a scheduler and RANKS rank processes of this script) and waits for it."""
    from mindspore_serving.common.ms_cluster import ClusterAddress, free_port, rank_env, start_scheduler

    os.makedirs(VERSION_DIR, exist_ok=True)
    np.save(os.path.join(VERSION_DIR, "weight.npy"), make_weight())
    cluster = ClusterAddress("127.0.0.1", free_port("127.0.0.1"), RANKS)
    procs = [start_scheduler(cluster, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    procs += [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--rank"], env=dict(rank_env(cluster, r), GLOG_v="3")
        )
        for r in range(RANKS)
    ]
    try:
        codes = [p.wait(timeout=300) for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise RuntimeError(f"exporting matmul_distributed failed: rank exit codes {codes}")
    return [os.path.join(VERSION_DIR, f) for f in MODEL_FILES]


if __name__ == "__main__":
    if "--rank" in sys.argv:
        _rank_main()
    else:
        main()
