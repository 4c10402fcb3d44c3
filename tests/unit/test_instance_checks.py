"""The master's and the worker's checks of a request's instances, and their exact texts."""

import numpy as np
import pytest

from mindspore_serving.common.instance_checks import check_instance, check_tensor
from mindspore_serving.proto import ms_service_pb2 as pb


def _tensor(dtype, dims, data=b"", bytes_val=()):
    tensor = pb.Tensor(dtype=dtype, data=data, bytes_val=list(bytes_val))
    tensor.shape.dims.extend(dims)
    return tensor


def test_check_tensor_texts():
    assert check_tensor(_tensor(pb.MS_FLOAT32, [2, 2], b"\x00" * 16)) is None
    assert (
        check_tensor(_tensor(pb.MS_FLOAT32, [2, 2], b"\x00" * 12)) == "Tensor check failed: input data size 12 invalid"
    )
    assert check_tensor(_tensor(pb.MS_FLOAT32, [2, -1], b"")) == "Tensor check failed: input  shape [2, -1] invalid"
    assert check_tensor(_tensor(pb.MS_FLOAT32, [0, 2], b"")) == "Tensor check failed: input  shape [0, 2] invalid"
    assert check_tensor(_tensor(pb.MS_FLOAT32, [2, 0], b"")) is None
    assert (
        check_tensor(_tensor(pb.MS_UNKNOWN, [2], b""))
        == "Tensor check failed: input data type proto::MS_UNKNOWN invalid"
    )
    assert check_tensor(_tensor(pb.MS_STRING, [1, 1], bytes_val=[b"a"])) == (
        "Instance tensor check failed: bytes or string type input  shape can only be (1,) or empty, "
        "but given shape is [1, 1]"
    )
    assert check_tensor(_tensor(pb.MS_BYTES, [], bytes_val=[b"a"])) is None
    assert check_tensor(_tensor(pb.MS_BYTES, [1], bytes_val=[b"a"])) is None
    assert (
        check_tensor(_tensor(pb.MS_BYTES, [2], bytes_val=[b"a", b"b"]))
        == "Instance tensor check failed: bytes or string type shape batch size can only be 1"
    )
    shm = _tensor(pb.MS_FLOAT32, [2])
    shm.shm_data.data_size = 4
    assert check_tensor(shm) == "Tensor check failed: input shared memory data size 4 not equal to expected size 8"


GOOD = _tensor(pb.MS_INT32, [1], data=np.array([1], np.int32).tobytes())


def _instance(**items):
    result = pb.Instance()
    for name, value in items.items():
        result.items[name].CopyFrom(value)
    return result


@pytest.mark.parametrize(
    "item, detail",
    [
        (_tensor(pb.MS_FLOAT32, [2], data=b"\0" * 7), "Tensor check failed: input data size 7 invalid"),
        (_tensor(pb.MS_FLOAT32, [-1, 2]), "Tensor check failed: input  shape [-1, 2] invalid"),
        (_tensor(pb.MS_FLOAT32, [0, 3]), "Tensor check failed: input  shape [0, 3] invalid"),
        (
            _tensor(pb.MS_STRING, [1, 1], bytes_val=[b"a"]),
            "Instance tensor check failed: bytes or string type input  shape can only be (1,) or empty, but given "
            "shape is "
            "[1, 1]",
        ),
        (
            _tensor(pb.MS_BYTES, [2], bytes_val=[b"a"]),
            "Instance tensor check failed: bytes or string type input  shape can only be (1,) or empty, but given "
            "shape is "
            "[2]",
        ),
    ],
)
def test_check_instance_with_tensor_checks(item, detail):
    reason = check_instance(_instance(x=GOOD, s=item).items, ["x", "s"], "add", "m", check_tensor)
    assert reason == f"Instances input s check failed, detail: {detail}"


def test_check_instance_missing_input_and_valid_instances():
    text = _tensor(pb.MS_STRING, [], bytes_val=[b"abc"])
    reasons = [
        check_instance(instance.items, ["x1", "x2"], "add", "m", check_tensor)
        for instance in [
            _instance(x1=GOOD, x2=text),
            _instance(x1=GOOD),
            _instance(x2=GOOD),
            _instance(x1=GOOD, x2=GOOD, extra=GOOD),
        ]
    ]
    assert reasons == [
        None,
        "Cannot find input x2 in instance input , servable add, method m",
        "Cannot find input x1 in instance input , servable add, method m",
        None,
    ]


def test_check_instance_of_decoded_values_only_looks_for_missing_inputs():
    assert check_instance({"x": np.ones(2), "s": "a"}, ["x", "s"], "n", "m") is None
    assert (
        check_instance({"x": np.ones(2)}, ["y"], "n", "m")
        == "Cannot find input y in instance input , servable n, method m"
    )
