"""A LLaMA-architecture decoder in MindSpore: RMSNorm, rotary embeddings on explicit positions, SwiGLU, GQA.

The computations take their weights as arguments: a flat tuple in `LlamaModel.weight_names()` order (the embedding,
each layer's `DecoderLayer.weight_names`, the final norm, the lm head when untied), which are also the parameter
and checkpoint names, and the names of the exported weights file.

`LlamaModel.forward_full(input_ids [B, T]) -> logits [B, T, vocab]` is causal attention without a cache: it trains
the model and is the reference the served graphs are checked against. The served graphs, which compute one engine
step over a paged KV cache, are `step_graphs.py`'s; they share this module's functions (`linear`, `rms_norm`,
`apply_rotary`) and weight layout, so both compute the same numbers.
"""

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer

from .config import LlamaConfig, check_tensor_parallel

NEG_INF = -1e9

# NOTE: module-level functions built on primitive instances, shared with step_graphs.py
_matmul_t = ops.MatMul(transpose_b=True)
_bmm = ops.BatchMatMul()
_bmm_t = ops.BatchMatMul(transpose_b=True)
_softmax = ops.Softmax(-1)
_split2 = ops.Split(-1, 2)
_mean = ops.ReduceMean(keep_dims=True)
_concat = ops.Concat(-1)
_transpose = ops.Transpose()
_gather = ops.Gather()

# A layer's weights, in the order of `DecoderLayer.weight_names` (its parameters' creation order): these, then the
# q/k/v biases with cfg.qkv_bias, then the q/k norms with cfg.qk_norm. The layer functions read `w[_Q_PROJ]` etc.
LAYER_WEIGHTS = ("input_norm", "q_proj", "kv_proj", "o_proj", "post_attn_norm", "gate_up_proj", "down_proj")
QKV_BIAS_WEIGHTS = ("q_bias", "kv_bias")
QK_NORM_WEIGHTS = ("q_norm", "k_norm")
_INPUT_NORM, _Q_PROJ, _KV_PROJ, _O_PROJ, _POST_ATTN_NORM, _GATE_UP_PROJ, _DOWN_PROJ = range(len(LAYER_WEIGHTS))
_Q_BIAS, _KV_BIAS = len(LAYER_WEIGHTS), len(LAYER_WEIGHTS) + 1


def _weight(std, shape):
    return Parameter(initializer(Normal(std), shape, ms.float32))


def _ones(dim):
    return Parameter(initializer("ones", (dim,), ms.float32))


def _zeros(dim):
    return Parameter(initializer("zeros", (dim,), ms.float32))


def linear(x, weight):
    """x [..., in] @ weight[out, in].T -> [..., out]."""
    shape = x.shape
    return _matmul_t(x.reshape(-1, shape[-1]), weight).reshape(shape[:-1] + (weight.shape[0],))


def rms_norm(x, weight, eps):
    return x * ops.rsqrt(_mean(x * x, -1) + eps) * weight


def rotary_cos_sin(positions, inv_freq):
    """positions int32 [B, L] -> cos, sin float32 [B, L, 1, head_dim // 2]."""
    freqs = ops.expand_dims(positions.astype(ms.float32), -1) * inv_freq
    return ops.expand_dims(ops.cos(freqs), 2), ops.expand_dims(ops.sin(freqs), 2)


def apply_rotary(x, cos, sin):
    """Rotate-half RoPE on x [B, L, heads, head_dim]: pairs are (i, i + head_dim/2)."""
    x1, x2 = _split2(x)
    return _concat((x1 * cos - x2 * sin, x2 * cos + x1 * sin))


def layer_weight_names(cfg: LlamaConfig) -> tuple:
    """A decoder layer's weights, in the order its functions take them (`DecoderLayer.weights`)."""
    return LAYER_WEIGHTS + (QKV_BIAS_WEIGHTS if cfg.qkv_bias else ()) + (QK_NORM_WEIGHTS if cfg.qk_norm else ())


def weight_names(cfg: LlamaConfig) -> list:
    """The model's weights in the order of its weights tuples (`LlamaModel.weights`, the exported graphs' weight
    inputs): the names of `LlamaModel.parameters_and_names` (in another order) and of the checkpoints."""
    names = ["embed_tokens"]
    for i in range(cfg.num_layers):
        names += [f"layers.{i}.{name}" for name in layer_weight_names(cfg)]
    return names + ["norm"] + ([] if cfg.tie_word_embeddings else ["lm_head"])


class DecoderLayer(nn.Cell):
    """Pre-norm attention (GQA, RoPE) and SwiGLU MLP blocks with residuals; weights are [out, in].

    With tensor parallelism (`tp` > 1, Megatron-style) the layer holds rank `tp_rank`'s shard: its num_heads / tp
    query heads and num_kv_heads / tp key/value heads (q/k/v column-parallel), its intermediate_size / tp MLP
    columns (gate/up column-parallel), and the matching input columns of o and down (row-parallel), whose partial
    products are summed over the ranks by an AllReduce. Norms are replicated.

    Optional parts, present only when the config asks for them (so the plain model's parameters never change):
    `q_bias` and `kv_bias` (rows: k, then v) with `cfg.qkv_bias`, sharded with their rows; `q_norm` and `k_norm`
    (RMSNorm weights [head_dim] over each head of q and k, before RoPE) with `cfg.qk_norm`, replicated.

    The methods take the layer's weights as `w`, a tuple in `weight_names` order (`weights()`: its Parameters;
    `parameters=False` builds the layer without any, for cells that take the weights as inputs).
    """

    def __init__(self, cfg: LlamaConfig, tp: int = 1, parameters: bool = True):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_heads // tp, cfg.num_kv_heads // tp
        self.head_dim = cfg.head_dim
        self.group = cfg.num_heads // cfg.num_kv_heads
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self.eps = cfg.rms_norm_eps
        self.qkv_bias, self.qk_norm = cfg.qkv_bias, cfg.qk_norm
        self.weight_names = layer_weight_names(cfg)
        self.q_norm_at = len(self.weight_names) - len(QK_NORM_WEIGHTS)  # with qk_norm: q_norm, k_norm
        self.tp = tp
        # NOTE: created only with tp > 1: an AllReduce needs mindspore.communication.init() (a cluster) first
        self.all_reduce = ops.AllReduce() if tp > 1 else None
        if parameters:
            self._create_parameters(cfg, tp)

    def _create_parameters(self, cfg: LlamaConfig, tp: int):
        std, out_std = cfg.initializer_range, cfg.initializer_range / math.sqrt(2 * cfg.num_layers)
        hidden, kv_size = cfg.hidden_size, self.num_kv_heads * cfg.head_dim
        intermediate = cfg.intermediate_size // tp
        self.input_norm = _ones(hidden)
        self.q_proj = _weight(std, (self.num_heads * cfg.head_dim, hidden))
        self.kv_proj = _weight(std, (2 * kv_size, hidden))  # rows: k, then v
        self.o_proj = _weight(out_std, (hidden, self.num_heads * cfg.head_dim))
        self.post_attn_norm = _ones(hidden)
        self.gate_up_proj = _weight(std, (2 * intermediate, hidden))  # rows: gate, then up
        self.down_proj = _weight(out_std, (hidden, intermediate))
        if self.qkv_bias:
            self.q_bias = _zeros(self.num_heads * cfg.head_dim)
            self.kv_bias = _zeros(2 * kv_size)  # k, then v
        if self.qk_norm:
            self.q_norm = _ones(cfg.head_dim)
            self.k_norm = _ones(cfg.head_dim)

    def weights(self):
        """The layer's Parameters in `weight_names` order."""
        w = (
            self.input_norm,
            self.q_proj,
            self.kv_proj,
            self.o_proj,
            self.post_attn_norm,
            self.gate_up_proj,
            self.down_proj,
        )
        if self.qkv_bias:
            w = w + (self.q_bias, self.kv_bias)
        if self.qk_norm:
            w = w + (self.q_norm, self.k_norm)
        return w

    def row_parallel(self, x, weight):
        """linear(x, weight) summed over the tensor-parallel ranks (each holds some input columns of weight)."""
        out = linear(x, weight)
        if self.tp > 1:
            out = self.all_reduce(out)
        return out

    def qkv(self, w, x, cos, sin):
        """x [..., hidden] -> q [..., H, D], k and v [..., KVH, D] (q and k rotated); cos, sin broadcast to
        [..., 1, D / 2]. Shared by `forward_full` ([B, L, hidden]) and the step graphs ([T, hidden])."""
        lead = x.shape[:-1]
        h = rms_norm(x, w[_INPUT_NORM], self.eps)
        q, kv = linear(h, w[_Q_PROJ]), linear(h, w[_KV_PROJ])
        if self.qkv_bias:
            q, kv = q + w[_Q_BIAS], kv + w[_KV_BIAS]
        k, v = _split2(kv)
        q = q.reshape(lead + (self.num_heads, self.head_dim))
        k = k.reshape(lead + (self.num_kv_heads, self.head_dim))
        v = v.reshape(lead + (self.num_kv_heads, self.head_dim))
        if self.qk_norm:
            q, k = rms_norm(q, w[self.q_norm_at], self.eps), rms_norm(k, w[self.q_norm_at + 1], self.eps)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def attend(self, q, k, v, mask_bias):
        """Attention of q [B, L, H, D] over k, v [B, S, KVH, D] -> [B, L, H * D].

        mask_bias [B, 1, G*L, S] is 0 or -1e9. Query head h reads kv head h // group: q is regrouped to
        [B, KVH, group * L, D] so that keys and values are never repeated.
        """
        b, seq = q.shape[0], q.shape[1]
        q = _transpose(q.reshape(b, seq, self.num_kv_heads, self.group, self.head_dim), (0, 2, 3, 1, 4))
        q = q.reshape(b, self.num_kv_heads, self.group * seq, self.head_dim)
        scores = _bmm_t(q, _transpose(k, (0, 2, 1, 3))) * self.scale  # [B, KVH, G*L, S]
        probs = _softmax(scores + mask_bias)
        out = _bmm(probs, _transpose(v, (0, 2, 1, 3)))  # [B, KVH, G*L, D]
        out = _transpose(out.reshape(b, self.num_kv_heads, self.group, seq, self.head_dim), (0, 3, 1, 2, 4))
        return out.reshape(b, seq, self.num_heads * self.head_dim)

    def residual_mlp(self, w, x, attn):
        """x + o_proj(attn), then the residual SwiGLU MLP; x [B, L, hidden], attn [B, L, H * D]."""
        x = x + self.row_parallel(attn, w[_O_PROJ])
        gate, up = _split2(linear(rms_norm(x, w[_POST_ATTN_NORM], self.eps), w[_GATE_UP_PROJ]))
        return x + self.row_parallel(ops.silu(gate) * up, w[_DOWN_PROJ])

    def attend_mlp(self, w, x, q, k, v, mask_bias):
        """Residual attention of q over k, v (see `attend`), then the residual MLP."""
        return self.residual_mlp(w, x, self.attend(q, k, v, mask_bias))

    def forward_full(self, w, x, cos, sin, mask_bias):
        q, k, v = self.qkv(w, x, cos, sin)
        return self.attend_mlp(w, x, q, k, v, mask_bias)


class LlamaModel(nn.Cell):
    """The decoder. `construct` is the paged step exported to MindIR; `forward_full` trains and checks it.

    `tp` > 1 builds one tensor-parallel rank's shard (see DecoderLayer; `shard_weights` cuts its weights from the
    whole model's): its KV caches hold num_kv_heads / tp heads. The embedding and the lm head are replicated, so every
    rank computes the whole logits.

    `forward_full`, `construct` and `construct_mixed` compute with the model's Parameters; `paged_step` and
    `mixed_step` are the same steps over a weights tuple given as an argument (see the module docstring).
    `parameters=False` builds the model without Parameters (nothing to initialise), for `PagedStep` and
    `MixedStep`, which take the weights as inputs.
    """

    def __init__(self, cfg: LlamaConfig, tp: int = 1, parameters: bool = True):
        super().__init__()
        check_tensor_parallel(cfg, tp)
        self.cfg = cfg
        self.tp = tp
        self.vocab_size = cfg.vocab_size
        self.num_layers = cfg.num_layers
        self.group = cfg.num_heads // cfg.num_kv_heads
        self.eps = cfg.rms_norm_eps
        self.layers = nn.CellList([DecoderLayer(cfg, tp, parameters) for _ in range(cfg.num_layers)])
        self.tied = cfg.tie_word_embeddings
        if parameters:
            self.embed_tokens = _weight(cfg.initializer_range, (cfg.vocab_size, cfg.hidden_size))
            self.norm = _ones(cfg.hidden_size)
        if parameters and not self.tied:
            self.lm_head = _weight(cfg.initializer_range, (cfg.vocab_size, cfg.hidden_size))
        self.inv_freq = Tensor(cfg.rope_inv_freq())
        # NOTE: constant tables sliced per use; ops.arange in PyNative mode trips a NumPy-1.x import warning
        self.position_table = Tensor(np.arange(cfg.max_seq_len, dtype=np.int32))
        self.one, self.zero = Tensor(1.0, ms.float32), Tensor(0.0, ms.float32)
        self.layer_width = len(self.layers[0].weight_names)  # weights per layer
        self.norm_at = 1 + self.num_layers * self.layer_width

    def weight_names(self):
        """The names of the weights tuple, in order (`weight_names(cfg)`)."""
        return weight_names(self.cfg)

    def weights(self):
        """The model's Parameters in `weight_names()` order."""
        w = (self.embed_tokens,)
        for layer in self.layers:
            w = w + layer.weights()
        w = w + (self.norm,)
        if not self.tied:
            w = w + (self.lm_head,)
        return w

    def layer_weights(self, weights, i):
        """Layer i's part of a weights tuple."""
        begin = 1 + i * self.layer_width
        return weights[begin : begin + self.layer_width]

    def mask_bias(self, visible):
        """visible bool [B, L, S] -> additive bias [B, 1, group * L, S] laid out as `attend_mlp` reads it."""
        bias = (1.0 - visible.astype(ms.float32)) * NEG_INF
        return ops.tile(ops.expand_dims(bias, 1), (1, 1, self.group, 1))

    def logits(self, weights, h):
        """h [N, hidden] -> final norm -> [N, vocab]."""
        h = rms_norm(h, weights[self.norm_at], self.eps)
        if self.tied:
            return _matmul_t(h, weights[0])
        return _matmul_t(h, weights[self.norm_at + 1])

    def forward_full(self, input_ids):
        """input_ids int32 [B, T] -> logits float32 [B, T, vocab], causal, positions 0..T-1."""
        b, t = input_ids.shape
        keys = self.position_table[:t]
        positions = ops.tile(ops.expand_dims(keys, 0), (b, 1))
        cos, sin = rotary_cos_sin(positions, self.inv_freq)
        visible = ops.expand_dims(keys, 0) <= ops.expand_dims(keys, 1)  # [T, T]
        mask_bias = self.mask_bias(ops.tile(ops.expand_dims(visible, 0), (b, 1, 1)))
        weights = self.weights()
        if self.training:
            # NOTE: on CPU the backward of a one-hot matmul is far cheaper than that of gather (a scatter-add)
            onehot = ops.one_hot(input_ids.reshape(-1), self.vocab_size, self.one, self.zero)
            x = ops.matmul(onehot, weights[0]).reshape(b, t, -1)
        else:
            x = _gather(weights[0], input_ids, 0)
        for i in range(self.num_layers):
            x = self.layers[i].forward_full(self.layer_weights(weights, i), x, cos, sin, mask_bias)
        return self.logits(weights, x.reshape(b * t, -1)).reshape(b, t, self.vocab_size)


def _rows(weight: np.ndarray, parts: int, rank: int) -> np.ndarray:
    """Rank `rank`'s block of `weight`'s rows cut in `parts` equal blocks."""
    size = weight.shape[0] // parts
    return weight[rank * size : (rank + 1) * size]


def shard_weights(cfg: LlamaConfig, weights: dict, tp: int, rank: int) -> dict:
    """The parameters (name -> array, names of `LlamaModel.parameters_and_names`) of tensor-parallel rank `rank`
    of `tp`, cut from the whole model's: q, k, v (and their biases), gate and up by output rows, o and down by input
    columns; norms (q_norm and k_norm included) are replicated."""
    check_tensor_parallel(cfg, tp)
    out = {}
    for name, value in weights.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("q_proj", "q_bias"):
            value = _rows(value, tp, rank)
        elif leaf in ("kv_proj", "kv_bias", "gate_up_proj"):  # two stacked matrices: shard each
            first, second = np.split(value, 2, axis=0)
            value = np.concatenate([_rows(first, tp, rank), _rows(second, tp, rank)], axis=0)
        elif leaf in ("o_proj", "down_proj"):
            value = _rows(value.T, tp, rank).T
        out[name] = np.ascontiguousarray(value)
    return out


def checkpoint_params(model: LlamaModel):
    """The model's parameters under names relative to the model (stable whatever cell wraps it)."""
    return [{"name": name, "data": p} for name, p in model.parameters_and_names()]


def save_weights(model: LlamaModel, path: str):
    ms.save_checkpoint(checkpoint_params(model), path)


def load_weights(model: LlamaModel, path: str):
    """Loads a checkpoint written by `save_weights`; every parameter must be present with its shape."""
    saved = ms.load_checkpoint(path)
    missing = []
    for name, p in model.parameters_and_names():
        if name not in saved:
            missing.append(name)
            continue
        value = saved[name]
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"{path}: parameter {name} has shape {tuple(value.shape)}, the config expects "
                f"{tuple(p.shape)}; export with the config the checkpoint was trained with"
            )
        p.set_data(Tensor(value.asnumpy()))
    if missing:
        raise ValueError(f"{path}: missing parameter(s) {missing[:5]}{'...' if len(missing) > 5 else ''}")


def build_model(cfg: LlamaConfig, seed: int = 0, checkpoint: str = None) -> LlamaModel:
    """A model with a seeded random init, or the weights of `checkpoint`."""
    ms.set_seed(seed)
    np.random.seed(seed)
    model = LlamaModel(cfg)
    if checkpoint:
        load_weights(model, checkpoint)
    return model
