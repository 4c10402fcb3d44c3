"""The three dynamic-shape graphs that compute one engine step of a LLaMA-architecture decoder.

A step computes a flattened batch of T tokens: first the Bd *decode rows* (one token each: tokens 0 .. Bd-1), then
the Bp *chunk rows* (a prompt, a prompt chunk, or a row verifying proposed tokens), their tokens packed one row
after the other. Every dimension (T, Bd, Bp, the longest chunk Lp, the context widths Cd and Cp, the number of
cache slots) is dynamic: one export serves every step shape. The runner (agent/graph_runner.py) calls

1. `StepPrepare` once: the embeddings x [T, hidden], the rotary cos/sin [T, 1, head_dim / 2] and the attention
   biases of both groups (0 where a key is visible, -1e9 elsewhere);
2. a `LayerStep` once per decoder layer, with that layer's caches and weights: x -> x. There are three, exported
   from one cell: `layer` computes both groups, `layer_decode` a step of decode rows only and `layer_chunk` one of
   chunk rows only, so that a step of one kind carries no padding row of the other (a decode step of one row is a
   matrix-vector product: at two rows oneDNN's MatMul took twice as long) and runs half the attention ops;
3. `StepHead` once: the logits [N, vocab] of the N tokens the step asks for (each row's last token; every token
   of a scored or verifying row).

One graph per layer call rather than one graph for the whole step: with the 24 layers of the 0.5B shape in one
dynamic-shape graph, a 512-token step grew the process by 3 GB (its intermediates held until the graph returned,
~6 MB per token), and the first call of each new shape took seconds; called layer by layer, a step's working memory
is one layer's, which the memory pool reuses for the next layer (`tests/unit/test_ms_dynamic_memory.py` pins this):
the same step grew it by 0.2 GB. The graphs compile in seconds, and a call costs ~0.3 ms of framework time.

The KV cache of a layer is two tensors (key, value) of [num_slots, kv_heads, head_dim], num_slots = num_blocks *
block_size: the slot of position p of a row is block_table[p // block_size] * block_size + p % block_size. A
layer writes its new keys and values with `ScatterUpdate` on the cache input, which is in place and touches only
the written slots (`ScatterNdUpdate` on a 4-D cache copies the whole cache on every call: its cost grew with the
cache, 110 ms a step for 1.2 GB). Attention reads a row's context through its *context slots*: the slot of every
position 0 .. C-1 (C: the group's context width, padded by the runner; padding slots point at the scratch slot 0
and are masked).

Inputs (int32 unless said; `LayerStep` and `StepHead` take the weights named by `layer_weight_names` /
`head_weight_names` after the listed inputs)::

    StepPrepare:  input_ids [T], positions [T], decode_slots [Bd, Cd], chunk_index [Bp, Lp], chunk_slots [Bp, Cp],
                  embed_tokens [vocab, hidden]
                  -> x [T, hidden], cos [T, 1, D/2], sin [T, 1, D/2], decode_bias [Bd, 1, 1, Cd],
                     chunk_bias [Bp, 1, 1, Lp, Cp]
    LayerStep:    x, cos, sin, decode_bias, chunk_bias, slot_mapping [T], decode_slots, chunk_index,
                  chunk_scatter [T - Bd], chunk_slots, key_cache, value_cache, <layer weights> -> x
    StepHead:     x, logits_index [N], norm [hidden], lm_head [vocab, hidden] -> logits float32 [N, vocab]

`chunk_index[r, j]` is the index in T of chunk row r's j-th token (padding: any token, its output is dropped);
`chunk_scatter[i]` is where the i-th chunk token (token Bd + i) sits in the [Bp * Lp] rows of the chunk attention.
"""

from collections.abc import Mapping

import mindspore as ms
from mindspore import nn, ops

from .config import LlamaConfig
from .model import (
    NEG_INF,
    DecoderLayer,
    layer_weight_names,
    rms_norm,
)

_bmm = ops.BatchMatMul()
_bmm_t = ops.BatchMatMul(transpose_b=True)
_softmax = ops.Softmax(-1)
_split2 = ops.Split(-1, 2)
_transpose = ops.Transpose()
_gather = ops.Gather()
_concat0 = ops.Concat(0)
_scatter = ops.ScatterUpdate()
_matmul_t = ops.MatMul(transpose_b=True)


PREPARE_INPUTS = ("input_ids", "positions", "decode_slots", "chunk_index", "chunk_slots")
LAYER_INPUTS = (
    "x",
    "cos",
    "sin",
    "decode_bias",
    "chunk_bias",
    "slot_mapping",
    "decode_slots",
    "chunk_index",
    "chunk_scatter",
    "chunk_slots",
    "key_cache",
    "value_cache",
)
HEAD_INPUTS = ("x", "logits_index")


def head_weight_names(cfg: LlamaConfig) -> tuple[str, ...]:
    """The weights `StepHead` takes: the final norm and the lm head (the embedding when tied)."""
    return ("norm", "embed_tokens" if cfg.tie_word_embeddings else "lm_head")


class StepPrepare(nn.Cell):
    """Embeddings, rotary tables and attention biases of a step (see the module docstring)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.inv_freq = ms.Tensor(cfg.rope_inv_freq())
        # NOTE: a constant table sliced to the context width: ops.arange of a dynamic length does not export
        self.key_positions = ms.Tensor(list(range(cfg.max_seq_len)), ms.int32)

    def construct(self, input_ids, positions, decode_slots, chunk_index, chunk_slots, embed_tokens):
        x = _gather(embed_tokens, input_ids, 0)
        freqs = ops.expand_dims(positions.astype(ms.float32), -1) * self.inv_freq
        cos, sin = ops.expand_dims(ops.cos(freqs), 1), ops.expand_dims(ops.sin(freqs), 1)
        bd = decode_slots.shape[0]
        decode_keys = self.key_positions[: decode_slots.shape[1]].reshape(1, -1)
        decode_visible = decode_keys <= positions[:bd].reshape(-1, 1)  # [Bd, Cd]
        decode_bias = ((1.0 - decode_visible.astype(ms.float32)) * NEG_INF).reshape(bd, 1, 1, -1)
        bp, lp = chunk_index.shape[0], chunk_index.shape[1]
        chunk_positions = _gather(positions, chunk_index.reshape(-1), 0).reshape(bp, lp, 1)
        chunk_keys = self.key_positions[: chunk_slots.shape[1]].reshape(1, 1, -1)
        chunk_visible = chunk_keys <= chunk_positions  # [Bp, Lp, Cp]
        chunk_bias = ((1.0 - chunk_visible.astype(ms.float32)) * NEG_INF).reshape(bp, 1, 1, lp, -1)
        return x, cos, sin, decode_bias, chunk_bias


class LayerStep(DecoderLayer):
    """One decoder layer over a step's tokens (see the module docstring): pre-norm attention (GQA, RoPE) whose new
    keys and values go into the layer's caches first, then the SwiGLU MLP, each with its residual. `groups`: the
    attention groups it computes, "decode", "chunk" or "both" (one graph each; the inputs of a group it does not
    compute are not read).

    It is model.py's `DecoderLayer` without parameters (the weights are inputs), sharing its projections and its
    tensor parallelism: with `tp` > 1 the layer is one rank's shard (`shard_weights`), the o and down projections'
    partial sums all-reduced over the ranks."""

    def __init__(self, cfg: LlamaConfig, tp: int = 1, groups: str = "both"):
        super().__init__(cfg, tp, parameters=False)
        self.groups = groups

    def attend_rows(self, q, keys, values, bias, rows, length):
        """q [rows * length, heads, D] over keys, values [rows, C, kv_heads, D] with bias [rows, 1, 1, length, C]
        (a decode group: length 1, bias [rows, 1, 1, C] broadcasts alike) -> [rows * length, heads * D]."""
        kvh, g, d = self.num_kv_heads, self.group, self.head_dim
        q = _transpose(q.reshape(rows, length, kvh, g, d), (0, 2, 3, 1, 4)).reshape(rows, kvh, g * length, d)
        scores = _bmm_t(q, _transpose(keys, (0, 2, 1, 3))) * self.scale  # [rows, kvh, g * length, C]
        scores = scores.reshape(rows, kvh, g, length, -1) + bias.reshape(rows, 1, 1, length, -1)
        probs = _softmax(scores).reshape(rows, kvh, g * length, -1)
        out = _bmm(probs, _transpose(values, (0, 2, 1, 3)))  # [rows, kvh, g * length, D]
        out = _transpose(out.reshape(rows, kvh, g, length, d), (0, 3, 1, 2, 4))
        return out.reshape(rows * length, self.num_heads * d)

    def construct(
        self,
        x,
        cos,
        sin,
        decode_bias,
        chunk_bias,
        slot_mapping,
        decode_slots,
        chunk_index,
        chunk_scatter,
        chunk_slots,
        key_cache,
        value_cache,
        *w,
    ):
        t, bd = x.shape[0], decode_slots.shape[0]
        bp, lp = chunk_index.shape[0], chunk_index.shape[1]
        q, k, v = self.qkv(w, x, cos, sin)
        # NOTE: in place on the cache inputs; depend orders the reads below after the writes
        key_cache = ops.depend(key_cache, _scatter(key_cache, slot_mapping, k))
        value_cache = ops.depend(value_cache, _scatter(value_cache, slot_mapping, v))
        if self.groups == "decode":
            attn = self.attend_rows(
                q, _gather(key_cache, decode_slots, 0), _gather(value_cache, decode_slots, 0), decode_bias, t, 1
            )
        else:
            out_chunk = self.attend_rows(
                _gather(q, chunk_index.reshape(-1), 0),
                _gather(key_cache, chunk_slots, 0),
                _gather(value_cache, chunk_slots, 0),
                chunk_bias,
                bp,
                lp,
            )
            attn = _gather(out_chunk, chunk_scatter, 0)
            if self.groups == "both":
                out_decode = self.attend_rows(
                    q[:bd],
                    _gather(key_cache, decode_slots, 0),
                    _gather(value_cache, decode_slots, 0),
                    decode_bias,
                    bd,
                    1,
                )
                attn = _concat0((out_decode, attn))
        return self.residual_mlp(w, x, attn)


class StepHead(nn.Cell):
    """The final norm and the lm head over the tokens a step asks logits for."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.eps = cfg.rms_norm_eps

    def construct(self, x, logits_index, norm, lm_head):
        return _matmul_t(rms_norm(_gather(x, logits_index, 0), norm, self.eps), lm_head)


LAYER_GRAPHS = {"layer": "both", "layer_decode": "decode", "layer_chunk": "chunk"}
"""The layer graphs and the attention groups each computes."""
GRAPHS = ("prepare", *LAYER_GRAPHS, "head")
"""The graphs of an export; each is `<name>.mindir`. A step calls prepare, one of the layer graphs per layer, and
head."""


def graph_cells(cfg: LlamaConfig, tp: int = 1) -> dict[str, nn.Cell]:
    """The cells exported as `GRAPHS` (the layers one rank's shard when `tp` > 1)."""
    cells: dict[str, nn.Cell] = {"prepare": StepPrepare(cfg)}
    cells.update({name: LayerStep(cfg, tp, groups) for name, groups in LAYER_GRAPHS.items()})
    cells["head"] = StepHead(cfg)
    return cells


def graph_weight_names(cfg: LlamaConfig) -> dict[str, tuple[str, ...]]:
    """The weights each graph takes after its inputs: names of `model.weight_names`, a layer graph's relative to
    `layers.<i>.` (the runner passes layer i's)."""
    names = {"prepare": ("embed_tokens",), "head": head_weight_names(cfg)}
    names.update({name: layer_weight_names(cfg) for name in LAYER_GRAPHS})
    return names


def graph_weights_of(cfg: LlamaConfig, by_name: Mapping[str, object]) -> dict[str, object]:
    """What `graph_input_specs` takes from something of every weight by its full name (a weight, a shape): layer 0's
    under their names relative to `layers.0.` (every layer's are alike), the others under their own."""
    names = graph_weight_names(cfg)
    out = {name: by_name[f"layers.0.{name}"] for name in names["layer"]}
    out.update({name: by_name[name] for name in names["prepare"] + names["head"]})
    return out


def graph_input_specs(cfg: LlamaConfig, tp: int, weights: Mapping[str, ms.Tensor]) -> dict[str, list]:
    """Each graph's inputs as shape-only Tensors, dynamic where a step's shape varies, then its weights: what the
    graphs are exported with, and what the runner gives `GraphCell.set_inputs` (without it, a loaded graph compiles
    again, with memory of its own, for every new shape). `weights`: a Tensor of every weight of `graph_weight_names`
    (a layer's under its relative name), the weight itself or a placeholder of its shape (`weight_placeholders`).
    NOTE: a shape-only Tensor of a static shape allocates its memory (a 0.5B model's placeholders took 1 GB), so the
    runner passes its own weights."""
    hidden, kv_heads = cfg.hidden_size, cfg.num_kv_heads // tp
    head_dim = int(cfg.head_dim or hidden // cfg.num_heads)

    def ints(*shape):
        return ms.Tensor(shape=list(shape), dtype=ms.int32)

    def floats(*shape):
        return ms.Tensor(shape=list(shape), dtype=ms.float32)

    graph_weights = {name: [weights[w] for w in names] for name, names in graph_weight_names(cfg).items()}
    n = None
    layer = [
        floats(n, hidden),
        floats(n, 1, head_dim // 2),
        floats(n, 1, head_dim // 2),
        floats(n, 1, 1, n),
        floats(n, 1, 1, n, n),
        ints(n),
        ints(n, n),
        ints(n, n),
        ints(n),
        ints(n, n),
        floats(n, kv_heads, head_dim),
        floats(n, kv_heads, head_dim),
    ] + graph_weights["layer"]
    specs = {"prepare": [ints(n), ints(n), ints(n, n), ints(n, n), ints(n, n)] + graph_weights["prepare"]}
    specs.update({name: layer for name in LAYER_GRAPHS})
    specs["head"] = [floats(n, hidden), ints(n)] + graph_weights["head"]
    return specs


def weight_placeholders(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, ms.Tensor]:
    """Shape-only float32 Tensors of these shapes (`graph_input_specs`' weights when no weights are loaded)."""
    return {name: ms.Tensor(shape=list(shape), dtype=ms.float32) for name, shape in shapes.items()}
