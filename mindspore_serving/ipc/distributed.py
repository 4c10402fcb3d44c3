"""The distributed worker <-> rank agents boundary (distributed.proto), for `server.distributed`.

The worker serves `DistributedWorker` on the user's distributed_address (TCP: agents may run on other hosts);
`startup_agents` reads the config there, and each rank agent registers its address and tensor infos. The worker
then calls `RankAgent.Predict` on every rank of a stage; each call has RANK_PREDICT_TIMEOUT.
"""
from typing import List, Sequence, Tuple

import numpy as np

from mindspore_serving.common import tensor_codec
from mindspore_serving.proto import distributed_pb2 as dpb

DISTRIBUTED_PROTOCOL_VERSION = 1
RANK_PREDICT_TIMEOUT = 10.0   # seconds the worker waits for one rank's result (as MindSpore Serving)
MAX_MSG_BYTES = 512 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MSG_BYTES),
                   ("grpc.max_receive_message_length", MAX_MSG_BYTES)]

READY_LINE = b"ready\n"       # a rank agent writes it on its start-up pipe once it has registered
FAILED_PREFIX = b"failed: "   # ... or this, followed by the reason and a newline


def tensor_infos_to_proto(infos: Sequence[Tuple[tuple, np.dtype]]) -> List[dpb.TensorInfo]:
    return [dpb.TensorInfo(shape=list(shape), dtype=tensor_codec.dtype_to_proto(dtype)) for shape, dtype in infos]


def tensor_infos_from_proto(infos) -> List[Tuple[tuple, np.dtype]]:
    return [(tuple(info.shape), tensor_codec.proto_to_dtype(info.dtype)) for info in infos]


def arrays_to_tensors(arrays: Sequence[np.ndarray], repeated_field):
    for array in arrays:
        tensor_codec.value_to_tensor(np.ascontiguousarray(array), repeated_field.add())


def tensors_to_arrays(tensors) -> List[np.ndarray]:
    return [tensor_codec.tensor_to_value(tensor) for tensor in tensors]
