"""The input shapes and dtypes recorded in a MindIR file (read with MindSpore's mind_ir protobuf), used by the
workers and the rank agents that load graphs."""

import numpy as np

from mindspore_serving import log

# mind_ir.proto TensorProto.DataType -> numpy
MINDIR_DTYPES = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
    17: np.float64,
}


def _model_bytes(path: str, dec_key: bytes | None, dec_mode: str) -> bytes | None:
    """The serialized ModelProto of `path`. A file exported with `enc_key` is not a protobuf: it is decrypted in
    memory with `dec_key` by MindSpore's own decryption (the one `mindspore.load` uses), never written anywhere."""
    if dec_key:
        try:
            from mindspore._c_expression import _decrypt, _is_cipher_file  # lazy, like the import below
        except ImportError as err:
            log.info(f"cannot decrypt '{path}' to read its inputs, this MindSpore has no _decrypt: {err}")
            return None
        if _is_cipher_file(path):
            return _decrypt(path, dec_key, len(dec_key), dec_mode) or None
    with open(path, "rb") as stream:
        return stream.read()


def read_mindir_input_infos(
    path: str, dec_key: bytes | None = None, dec_mode: str = "AES-GCM"
) -> list[tuple[tuple, np.dtype]] | None:
    """(shape, dtype) of each graph input; None when the file cannot be read or parsed.

    An encrypted file needs the `dec_key`/`dec_mode` it was exported with: read it after `mindspore.load` has
    accepted the key, which gives the reason when the key is wrong."""
    from mindspore.train import mind_ir_pb2  # lazy: MindSpore loads only in processes that run models

    model = mind_ir_pb2.ModelProto()
    try:
        content = _model_bytes(path, dec_key, dec_mode)
        if content is None:
            return None
        model.ParseFromString(content)
    except Exception as err:
        log.info(f"cannot read input information from '{path}': {err}")
        return None
    infos = []
    for graph_input in model.graph.input:
        tensor = graph_input.tensor[0]
        infos.append((tuple(int(d) for d in tensor.dims), np.dtype(MINDIR_DTYPES.get(tensor.data_type, np.float32))))
    return infos
