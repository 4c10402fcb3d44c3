"""A Hugging Face model directory -> the `LlamaModel` holding its weights (float32)."""

from mindspore import Tensor

from ..model import LlamaModel, shard_weights
from .config import read_hf_config
from .weights import load_hf_weights


def build_hf_model(model_dir: str, max_seq_len: int | None = None, tp: int = 1, rank: int = 0) -> LlamaModel:
    """The model of `model_dir` (config.json + *.safetensors), served up to `max_seq_len` tokens (default:
    max_position_embeddings); with `tp` > 1, tensor-parallel rank `rank`'s shard. Raises UnsupportedModelError
    (a ValueError) naming what is not implemented or what the checkpoint lacks."""
    cfg, _ = read_hf_config(model_dir, max_seq_len)
    weights = load_hf_weights(model_dir, cfg)
    if tp > 1:
        weights = shard_weights(cfg, weights, tp, rank)
    model = LlamaModel(cfg, tp)
    for name, param in model.parameters_and_names():
        param.set_data(Tensor(weights.pop(name)))
    model.set_train(False)
    return model
