"""GraphRunner: the engine's ModelRunner (llm/model_io.py) over the step graphs of an export directory.

The graphs are those written by `mindspore_serving.models.llama.export` (manifest format 3; see
models/llama/step_graphs.py for their inputs): `prepare`, a layer graph called once per decoder layer (`layer`, or
`layer_decode` / `layer_chunk` for a call of one kind of row) and `head`, every step shape dynamic. This runner

* loads each graph once (`mindspore.load` + `nn.GraphCell`, with `set_inputs` declaring the dynamic dimensions, so a
  graph compiles once, not once per shape);
* loads the weights once (agent/graph_weights.py) and passes each graph its own: the embedding to `prepare`, layer
  i's weights to the i-th `layer` call, the final norm and lm head to `head`;
* owns the KV cache: per layer a key and a value Tensor of [num_blocks * block_size, kv_heads, head_dim], allocated
  once and written in place by the layer graph (slot = block * block_size + offset);
* runs any step (`run`): decode rows, prompts, prompt chunks, rows verifying proposed tokens and rows that want
  every position's logits (prompt logprobs), in one graph call per `max_num_tokens` tokens (step_inputs.py plans
  the calls and lays their inputs out);
* warms the graphs up at load time with steps that only touch the scratch block 0, so that no request pays for the
  graphs' compilation.

Block 0 is the scratch block: padding writes there, and the engine's block manager never hands it out.
"""

import json
import os

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from mindspore_serving.agent.graph_weights import load_graph_weights
from mindspore_serving.agent.step_inputs import EVERY_LOGITS, CallInputs, call_inputs, plan_calls
from mindspore_serving.llm.model_io import (
    SCRATCH_BLOCK,
    MultiStepRunner,
    PromptScorer,
    SeqStep,
    StepLogits,
    run_greedy_steps,
)
from mindspore_serving.models.llama.config import LlamaConfig
from mindspore_serving.models.llama.manifest import MANIFEST, MANIFEST_VERSION
from mindspore_serving.models.llama.step_graphs import GRAPHS, graph_input_specs, graph_weight_names, graph_weights_of

LAYER_OF_KIND = {"both": "layer", "decode": "layer_decode", "chunk": "layer_chunk"}
"""The layer graph of a call of each kind (step_inputs.CallInputs.kind)."""
DEFAULT_MAX_NUM_TOKENS = 2048
"""Most tokens in one graph call; a larger step is computed in several calls."""


class GraphRunner(MultiStepRunner, PromptScorer):
    """ModelRunner over the step graphs of an export directory (see the module docstring).

    Args:
        manifest_dir: folder with manifest.json, the weights file and the graphs of `models.llama.export`.
        num_blocks: KV-cache blocks to allocate, block 0 being the scratch block (so >= 2).
        block_size: optional check against the exported block size (it cannot be changed here).
        warmup: run the graphs once at load time (compiles them), so the first real step is fast.
        tensor_parallel: (size, rank) this process runs as; checked against the export's. A rank of a
            tensor-parallel export must run in a cluster of that size (its layer graph all-reduces), and every rank
            must make the same graph calls in the same order: the calls depend only on the steps, which every rank
            gets.
        max_num_tokens: most tokens computed in one graph call (its working memory grows with them).
    """

    def __init__(
        self,
        manifest_dir: str,
        num_blocks: int,
        block_size: int | None = None,
        warmup: bool = True,
        tensor_parallel: tuple[int, int] | None = None,
        max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
    ):
        manifest = read_step_manifest(manifest_dir)
        path = os.path.join(manifest_dir, MANIFEST)
        self.manifest = manifest
        exported = manifest.get("tensor_parallel", {"size": 1, "rank": 0})
        self.tensor_parallel = (int(exported["size"]), int(exported["rank"]))
        if tensor_parallel is not None and tuple(tensor_parallel) != self.tensor_parallel:
            raise ValueError(
                f"{path}: the graphs are rank {self.tensor_parallel[1]} of a {self.tensor_parallel[0]}-way "
                f"tensor-parallel export, this process runs rank {tensor_parallel[1]} of "
                f"{tensor_parallel[0]}; list the rank directories in order in model.graphs and set "
                f"model.tensor_parallel to the export's"
            )
        self.block_size = int(manifest["block_size"])
        if block_size is not None and block_size != self.block_size:
            raise ValueError(
                f"block_size={block_size} differs from the exported block_size={self.block_size}; "
                "it is fixed at export: re-export or use the exported value"
            )
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks} must be >= 2 (block 0 is the scratch block)")
        if max_num_tokens < 1:
            raise ValueError(f"max_num_tokens={max_num_tokens} must be >= 1")
        self.num_blocks = num_blocks
        self.max_num_tokens = max_num_tokens
        self.max_seq_len = int(manifest["max_seq_len"])
        self.vocab_size = int(manifest["vocab_size"])
        self.spec_tokens = self.max_seq_len - 1  # any number of proposed tokens is verified in one call
        cache = manifest["cache"]
        self.cache_shape = (num_blocks * self.block_size, int(cache["num_kv_heads"]), int(cache["head_dim"]))
        self.num_layers = int(cache["num_layers"])
        cfg = LlamaConfig.from_dict(manifest["model"])
        weights = load_graph_weights(manifest_dir, manifest)
        names = graph_weight_names(cfg)
        self.prepare_weights = [weights[name] for name in names["prepare"]]
        self.layer_weights = [
            [weights[f"layers.{i}.{name}"] for name in names["layer"]] for i in range(self.num_layers)
        ]
        self.head_weights = [weights[name] for name in names["head"]]
        self.weight_bytes = sum(int(w.nbytes) for w in weights.values())
        specs = graph_input_specs(cfg, self.tensor_parallel[0], graph_weights_of(cfg, weights))
        self.graphs: dict[str, nn.GraphCell] = {}
        for name in GRAPHS:
            graph = nn.GraphCell(ms.load(os.path.join(manifest_dir, manifest["graphs"][name]["file"])))
            graph.set_inputs(*specs[name])
            self.graphs[name] = graph
        self.kv_caches: list[Tensor] = []
        self.reset_kv_caches()
        self.calls = 0  # graph calls so far (a step may take several: max_num_tokens); tests and metrics
        self.mixed_calls = 0  # of which computed one-token rows beside multi-token ones (decodes beside prompts)
        if warmup:
            self.warm_up()

    # --- the ModelRunner protocol -------------------------------------------------------------------------

    def score_refusal(self) -> str | None:
        return None

    def run(self, seqs: list[SeqStep]):
        """Logits [len(seqs), vocab_size] (float32) of the last token of each sequence; a StepLogits when a
        sequence asks for all its logits."""
        for i, seq in enumerate(seqs):
            self._check(i, seq)
        out = np.empty((len(seqs), self.vocab_size), np.float32)
        if not seqs:
            return out
        every = {
            i: np.empty((seq.query_len, self.vocab_size), np.float32) for i, seq in enumerate(seqs) if seq.all_logits
        }
        for pieces in plan_calls(seqs, self.max_num_tokens):
            inputs = call_inputs(pieces, self.block_size)
            logits = self.call(inputs)
            for piece, first in inputs.outputs:
                n = len(piece.tokens)
                if piece.logits == EVERY_LOGITS:
                    every[piece.row][piece.offset : piece.offset + n] = logits[first : first + n]
                    if piece.offset + n == seqs[piece.row].query_len:
                        out[piece.row] = logits[first + n - 1]
                else:
                    out[piece.row] = logits[first]
        return StepLogits(out, every) if every else out

    def run_greedy(self, seqs: list[SeqStep], num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Multi-step greedy decoding (model_io.run_greedy_steps): each step's argmax fed into the next."""
        if any(seq.all_logits for seq in seqs):
            raise ValueError("a greedy round cannot return every token's logits (SeqStep.all_logits)")
        if num_steps < 1:
            raise ValueError(f"a greedy round of {num_steps} steps: it needs at least one")
        for i, seq in enumerate(seqs):  # the last step writes position context_len + num_steps - 2
            self._check(i, SeqStep([0] * (seq.query_len + num_steps - 1), seq.start_pos, seq.block_table))
        return run_greedy_steps(self, seqs, num_steps)

    def call(self, inputs: CallInputs) -> np.ndarray:
        """One step of the graphs: the logits [len(inputs.logits_index), vocab]."""
        ids, positions, slots, decode_slots, chunk_index, chunk_scatter, chunk_slots, logits_index = (
            Tensor(a)
            for a in (
                inputs.input_ids,
                inputs.positions,
                inputs.slot_mapping,
                inputs.decode_slots,
                inputs.chunk_index,
                inputs.chunk_scatter,
                inputs.chunk_slots,
                inputs.logits_index,
            )
        )
        x, cos, sin, decode_bias, chunk_bias = self.graphs["prepare"](
            ids, positions, decode_slots, chunk_index, chunk_slots, *self.prepare_weights
        )
        layer = self.graphs[LAYER_OF_KIND[inputs.kind]]
        for i in range(self.num_layers):
            x = layer(
                x,
                cos,
                sin,
                decode_bias,
                chunk_bias,
                slots,
                decode_slots,
                chunk_index,
                chunk_scatter,
                chunk_slots,
                self.kv_caches[2 * i],
                self.kv_caches[2 * i + 1],
                *self.layer_weights[i],
            )
        self.calls += 1
        self.mixed_calls += inputs.mixed
        return self.graphs["head"](x, logits_index, *self.head_weights).asnumpy()

    def warm_up(self) -> None:
        """Runs a decode step, a prompt and both together, touching only the scratch block: compiles the graphs
        and sizes their first kernels before the runner reports ready."""
        scratch = [SCRATCH_BLOCK]
        length = min(self.block_size, self.max_seq_len)
        for seqs in (
            [SeqStep([0], 0, scratch)],
            [SeqStep([0] * length, 0, scratch)],
            [SeqStep([0], 0, scratch), SeqStep([0] * length, 0, scratch)],
        ):
            self.run(seqs)
        self.calls = self.mixed_calls = 0

    @property
    def kv_cache_bytes(self) -> int:
        return sum(int(c.nbytes) for c in self.kv_caches)

    def reset_kv_caches(self):
        """Fresh zeroed caches: key_cache_i, value_cache_i for each layer i."""
        self.kv_caches = [Tensor(np.zeros(self.cache_shape, np.float32)) for _ in range(2 * self.num_layers)]

    # --- internals ---------------------------------------------------------------------------------------

    def _check(self, i: int, seq: SeqStep):
        if seq.query_len < 1:
            raise ValueError(f"seqs[{i}] has no tokens to compute")
        if seq.start_pos < 0 or seq.context_len > self.max_seq_len:
            raise ValueError(
                f"seqs[{i}] spans positions [{seq.start_pos}, {seq.context_len}), beyond the graphs' "
                f"max_seq_len={self.max_seq_len}"
            )
        needed = -(-seq.context_len // self.block_size)
        if len(seq.block_table) < needed:
            raise ValueError(
                f"seqs[{i}] has {len(seq.block_table)} blocks; it needs {needed} (context "
                f"{seq.context_len}, block_size {self.block_size})"
            )
        if max(seq.block_table[:needed], default=0) >= self.num_blocks or min(seq.block_table[:needed]) < 0:
            raise ValueError(f"seqs[{i}] names a block outside the cache's {self.num_blocks} blocks")


def read_step_manifest(manifest_dir: str) -> dict:
    """The manifest of an export of the step graphs; FileNotFoundError without one, ValueError for another
    format (an older export: export the model again)."""
    path = os.path.join(manifest_dir, MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} not found: export the model first "
            "(python -m mindspore_serving.models.llama.export --config ... --out DIR)"
        )
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    version = manifest.get("format_version")
    if version != MANIFEST_VERSION:
        raise ValueError(
            f"{path}: manifest format_version {version!r} is not supported (this version serves format "
            f"{MANIFEST_VERSION}: the dynamic-shape step graphs); export the model again"
        )
    return manifest
