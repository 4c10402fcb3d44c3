"""The input shapes and dtypes recorded in a MindIR file (read with MindSpore's mind_ir protobuf), used by the
workers and the rank agents that load graphs."""
from typing import List, Optional, Tuple

import numpy as np

from mindspore_serving import log

# mind_ir.proto TensorProto.DataType -> numpy
MINDIR_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
                 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64, 17: np.float64}


def read_mindir_input_infos(path: str) -> Optional[List[Tuple[tuple, np.dtype]]]:
    """(shape, dtype) of each graph input; None when the file cannot be parsed (e.g. encrypted)."""
    from mindspore.train import mind_ir_pb2  # lazy: MindSpore loads only in processes that run models
    model = mind_ir_pb2.ModelProto()
    try:
        with open(path, "rb") as stream:
            model.ParseFromString(stream.read())
    except Exception as err:
        log.info(f"cannot read input information from '{path}': {err}")
        return None
    infos = []
    for graph_input in model.graph.input:
        tensor = graph_input.tensor[0]
        infos.append((tuple(int(d) for d in tensor.dims), np.dtype(MINDIR_DTYPES.get(tensor.data_type, np.float32))))
    return infos
