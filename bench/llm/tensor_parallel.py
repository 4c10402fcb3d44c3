"""Tensor parallelism of the tiny LLaMA on this machine (bench/llm_engine.py --tensor_parallel N).

Decode step time through agents for TP=1 and TP=N, measured the same way: each group started with startup_agents
(the config's agents.cpu_affinity), driven by an AgentRunner from this process (unbound, as the worker), 64-token
prompts prefilled first, then `steps` decode steps back to back from position 64 (the context grows as it would),
per batch. The in-process GraphRunner of TP=1 (bound like the rank-0 agent) runs the same steps for reference: the
difference is what the worker-agent round trip costs. Rounds alternate between the three so that the machine's
drift hits each alike; median, min and max over rounds are reported.

Then the AllReduce share of a TP=N step (an estimate from a microbenchmark, bench/llm/allreduce.py: a step calls
the layer graph once per decoder layer, and each call all-reduces twice), the KV-cache bytes per rank from each
rank's manifest at the served num_blocks, and the resident memory of each agent process.
"""

import json
import os
import time

import numpy as np
import psutil

from llm import allreduce  # bench/llm/allreduce.py
from mindspore_serving.common.cpu_affinity import bind_threads
from mindspore_serving.common.ms_cluster import free_port
from mindspore_serving.llm.model_io import SeqStep
from mindspore_serving.spec.llm_config import load_serving_config

ALLREDUCES_PER_LAYER = 2  # in each call of the layer graph: after the o projection and after the MLP's down one
BATCHES = (1, 8, 16)


def prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, vocab, length)] for _ in range(count)]


class Setup:
    """One way of running the steps: `runner` (GraphRunner or AgentRunner), with this process bound to `cpus`
    while it runs (None: unbound, as the worker is)."""

    def __init__(self, name: str, runner, cpus, tables: list[list[int]], context: int, group=None):
        self.name, self.runner, self.cpus, self.tables, self.context, self.group = (
            name,
            runner,
            cpus,
            tables,
            context,
            group,
        )

    def prefill(self, tokens: list[list[int]]):
        for seq_id, (prompt, table) in enumerate(zip(tokens, self.tables)):
            self.runner.run([SeqStep(prompt, 0, table, seq_id)])

    def decode(self, batch: int, steps: int, warm: int = 2) -> float:
        """ms per decode step of `batch` rows, from position `context` on."""

        def step(k):
            self.runner.run([SeqStep([3 + (i + k) % 1000], self.context + k, self.tables[i], i) for i in range(batch)])

        for k in range(warm):
            step(k)
        started = time.perf_counter()
        for k in range(steps):
            step(k)
        return (time.perf_counter() - started) / steps * 1000


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def kv_cache_bytes(graphs_dir: str, num_blocks: int) -> dict[str, int]:
    with open(os.path.join(graphs_dir, "manifest.json"), encoding="utf-8") as stream:
        manifest = json.load(stream)
    cache = manifest["cache"]
    assert cache["dtype"] == "float32", cache
    per_layer = num_blocks * manifest["block_size"] * cache["num_kv_heads"] * cache["head_dim"] * 4 * 2
    return {
        "num_blocks": num_blocks,
        "block_size": manifest["block_size"],
        "num_kv_heads": cache["num_kv_heads"],
        "head_dim": cache["head_dim"],
        "num_layers": cache["num_layers"],
        "bytes": per_layer * cache["num_layers"],
    }


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": float(np.median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
        "rounds": [float(v) for v in values],
    }


def start_group(config, name: str):
    """startup_agents on free ports (a fixed agents.start_port may be taken on a shared machine) and an
    AgentRunner on them."""
    from mindspore_serving.worker.llm.agents import startup_agents

    host = config.agents.host
    addresses = [f"{host}:{free_port(host)}" for _ in range(config.agents.num_ranks)]
    started = time.perf_counter()
    group = startup_agents(config, addresses=addresses)
    print(f"{name}: {len(group.processes)} agent(s) ready in {time.perf_counter() - started:.1f} s", flush=True)
    return group


def run(tp1_path: str, tp_path: str, rounds: int, steps: int, context: int, allreduce_calls: int) -> dict:
    from mindspore_serving.agent.graph_runner import GraphRunner
    from mindspore_serving.common.ms_device import select_device
    from mindspore_serving.worker.llm.agent_client import AgentRunner

    tp1, tpn = load_serving_config(tp1_path), load_serving_config(tp_path)
    n = tpn.model.tensor_parallel
    if tp1.model.tensor_parallel != 1 or n < 2:
        raise SystemExit(f"{tp1_path} must have one rank and {tp_path} several (it has {n})")
    num_blocks = tp1.engine.num_blocks
    if tpn.engine.num_blocks != num_blocks:
        raise SystemExit(f"the configs serve different num_blocks ({num_blocks} and {tpn.engine.num_blocks})")
    batches = [b for b in BATCHES if b <= tp1.engine.max_num_seqs]
    block_size = tp1.model_file().export.block_size
    blocks_per_seq = -(-(context + steps + 2) // block_size)  # the prompt, then `steps` + 2 warm decode steps
    all_cores = sorted(os.sched_getaffinity(0))
    inproc_cpus = tp1.agents.cpus_of(0, "CPU")
    results = {
        "configs": {"tp1": tp1_path, f"tp{n}": tp_path},
        "tensor_parallel": n,
        "batches": batches,
        "context_tokens": context,
        "steps_per_round": steps,
        "rounds": rounds,
        "cores": all_cores,
        "inproc_cpu_affinity": inproc_cpus,
        # the cores each agent binds itself to (agents.cpu_affinity), as they are started from this process
        "agent_cpu_affinity": {
            "agents tp1": [tp1.agents.cpus_of(0, "CPU")],
            f"agents tp{n}": [tpn.agents.cpus_of(r, "CPU") for r in range(n)],
        },
    }

    setups, groups, runners = [], [], []
    try:
        # the agents first, with this process unbound: an agent's `auto` cores are a share of the cores it inherits
        for name, config in (("agents tp1", tp1), (f"agents tp{n}", tpn)):
            group = start_group(config, name)
            groups.append(group)
            runner = AgentRunner(group.addresses)
            runners.append(runner)
            tables = [list(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq)) for i in range(max(batches))]
            assert tables[-1][-1] < runner.num_blocks
            setups.append(Setup(name, runner, None, tables, context, group))
        select_device("CPU")
        # as the agent: at most max_num_batched_tokens tokens per graph call
        graph_runner = GraphRunner(
            tp1.model.graphs[0], num_blocks=num_blocks, max_num_tokens=tp1.engine.max_num_batched_tokens
        )
        setups.insert(0, Setup("in-process tp1", graph_runner, inproc_cpus, setups[0].tables, context))
        tokens = prompts(max(batches), context, setups[1].runner.vocab_size)
        for setup in setups:
            setup.prefill(tokens)
        # the same logits every way: a check that the setups run the same model on the same cache
        check = [SeqStep([tokens[i][-1]], context, setups[0].tables[i], i) for i in range(2)]
        logits = [setup.runner.run(check) for setup in setups]
        results["max_abs_logit_diff_vs_in_process"] = {
            s.name: float(np.abs(logit - logits[0]).max()) for s, logit in zip(setups[1:], logits[1:])
        }

        times = {s.name: {b: [] for b in batches} for s in setups}
        for r in range(rounds):
            for setup in setups:
                bind_threads(setup.cpus if setup.cpus is not None else all_cores)
                for batch in batches:
                    times[setup.name][batch].append(setup.decode(batch, steps))
            bind_threads(all_cores)
            print(
                f"round {r + 1}/{rounds}: "
                + "; ".join(
                    f"{name} " + " ".join(f"b{b} {v[b][-1]:.1f}" for b in batches) for name, v in times.items()
                ),
                flush=True,
            )
        results["decode_step_ms"] = {name: {b: summary(v) for b, v in per.items()} for name, per in times.items()}

        memory = {}
        for setup in setups[1:]:
            group = setup.group
            memory[setup.name] = {
                "agent_rss_mib": [rss_mib(p.pid) for p in group.processes],
                "scheduler_rss_mib": rss_mib(group.scheduler.pid) if group.scheduler else None,
            }
        results["memory"] = memory
    finally:
        for runner in runners:
            runner.close()
        for group in groups:
            group.stop()
        bind_threads(all_cores)

    results["kv_cache"] = {
        "tp1": [kv_cache_bytes(tp1.model.graphs[0], num_blocks)],
        f"tp{n}": [kv_cache_bytes(g, num_blocks) for g in tpn.model.graphs],
    }

    # AllReduce: after the agents are gone, on the cores the TP=N agents are bound to
    cpus = [tpn.agents.cpus_of(rank, "CPU") or all_cores for rank in range(n)]
    hidden = _hidden(tpn.model.graphs[0])
    layers = results["kv_cache"][f"tp{n}"][0]["num_layers"]
    per_step = ALLREDUCES_PER_LAYER * layers
    # graphs of ALLREDUCES_PER_LAYER AllReduces: the layer graph's, called `layers` times a step
    ar = allreduce.measure(cpus, batches, hidden, calls=allreduce_calls, rounds=5, chain=ALLREDUCES_PER_LAYER)
    tp_name = f"agents tp{n}"
    ar["allreduces_per_step"] = per_step
    ar["allreduces_per_graph"] = ALLREDUCES_PER_LAYER
    ar["graphs_per_step"] = layers
    for batch in batches:
        row = ar["batches"][batch]
        step_ms = results["decode_step_ms"][tp_name][batch]["median"]
        row["tp_step_ms"] = step_ms
        # one AllReduce per graph, times the step's count: also pays per AllReduce what a graph with a collective
        # costs to launch once, where the step launches one per layer (an upper bound)
        row["single_times_count_ms"] = row["x1"]["allreduce_ms"] * per_step
        row["single_times_count_share"] = row["single_times_count_ms"] / step_ms
        # a graph of the layer's AllReduces, times the layers: as the step runs them (the estimate)
        row["per_step_ms"] = row[f"x{ALLREDUCES_PER_LAYER}"]["allreduce_ms"] * layers
        row["share_of_tp_step"] = row["per_step_ms"] / step_ms
    results["allreduce"] = ar
    return results


def _hidden(graphs_dir: str) -> int:
    with open(os.path.join(graphs_dir, "manifest.json"), encoding="utf-8") as stream:
        return int(json.load(stream)["model"]["hidden_size"])


def report(results: dict):
    n = results["tensor_parallel"]
    batches = results["batches"]
    names = list(results["decode_step_ms"])
    print(
        f"\nDecode step ms ({results['context_tokens']}-token context, {results['steps_per_round']} steps x "
        f"{results['rounds']} rounds; median [min-max])"
    )
    print(f"{'batch':>6} " + " ".join(f"{name:>24}" for name in names) + f" {'tp' + str(n) + ' / tp1':>10}")
    for b in batches:
        cells = []
        for name in names:
            s = results["decode_step_ms"][name][b]
            cells.append(f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]")
        ratio = (
            results["decode_step_ms"][f"agents tp{n}"][b]["median"]
            / results["decode_step_ms"]["agents tp1"][b]["median"]
        )
        print(f"{b:>6} " + " ".join(f"{c:>24}" for c in cells) + f" {ratio:>10.2f}")
    cores = "; ".join(f"{k}: {v}" for k, v in results["agent_cpu_affinity"].items())
    print(f"agent cores: {cores}; in-process tp1: {results['inproc_cpu_affinity']}")
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in results["max_abs_logit_diff_vs_in_process"].items())
    print(f"max |logits - in-process tp1|: {diffs}")

    ar = results["allreduce"]
    k, g, layers = ar["allreduces_per_step"], ar["allreduces_per_graph"], ar["graphs_per_step"]
    print(
        f"\nAllReduce of [batch, {ar['hidden']}] float32 between {n} ranks: a microbenchmark estimate of what the "
        f"{k} AllReduces of a step cost ({layers} layer-graph calls of {g})"
    )
    print(
        f"{'batch':>6} {'1 per graph ms':>15} {'x' + str(k):>6} {'share':>6} {str(g) + ' in one graph ms':>18} "
        f"{'[min-max]':>12} {'x' + str(layers):>6} {'tp step ms':>10} {'share':>6}"
    )
    for b in batches:
        row = ar["batches"][b]
        chain = row[f"x{g}"]
        print(
            f"{b:>6} {row['x1']['allreduce_ms']:>15.3f} {row['single_times_count_ms']:>6.2f} "
            f"{row['single_times_count_share']:>6.0%} {chain['allreduce_ms']:>18.3f} "
            f"{chain['allreduce_ms_min']:>5.2f}-{chain['allreduce_ms_max']:<6.2f} {row['per_step_ms']:>6.2f} "
            f"{row['tp_step_ms']:>10.2f} {row['share_of_tp_step']:>6.0%}"
        )
    print(
        "AllReduce ms: a graph with the AllReduces minus the same graph without them, ranks in lockstep (a rank's "
        f"wait for a slower peer inside a real step is not in it); x{layers}: a graph of {g}, once per layer, as a "
        f"step runs them (the estimate); one per graph x{k} also pays the launch of a graph with a collective {k} "
        "times: an upper bound"
    )
    if not ar["correct"]:
        print("WARNING: an AllReduce graph returned a wrong sum")

    print("\nMemory per rank")
    print(f"{'setup':>10} {'rank':>5} {'KV cache MiB':>13} {'agent RSS MiB':>14}")
    for key, name in (("tp1", "agents tp1"), (f"tp{n}", f"agents tp{n}")):
        for rank, (kv, rss) in enumerate(zip(results["kv_cache"][key], results["memory"][name]["agent_rss_mib"])):
            print(f"{key:>10} {rank:>5} {kv['bytes'] / 2**20:>13.1f} {rss:>14.0f}")
    sched = results["memory"][f"agents tp{n}"]["scheduler_rss_mib"]
    if sched is not None:
        print(f"cluster scheduler of tp{n}: {sched:.0f} MiB RSS")
