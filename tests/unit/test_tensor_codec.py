"""Instances <-> ms_service.proto and the reply's error_msg rules."""

import numpy as np
import pytest

from mindspore_serving.common import errors
from mindspore_serving.common import tensor_codec as tc
from mindspore_serving.common.instance_checks import check_tensor
from mindspore_serving.proto import ms_service_pb2 as pb

NUMERIC = [
    (np.bool_, pb.MS_BOOL, "kMSI_Bool"),
    (np.int8, pb.MS_INT8, "kMSI_Int8"),
    (np.uint8, pb.MS_UINT8, "kMSI_Uint8"),
    (np.int16, pb.MS_INT16, "kMSI_Int16"),
    (np.uint16, pb.MS_UINT16, "kMSI_Uint16"),
    (np.int32, pb.MS_INT32, "kMSI_Int32"),
    (np.uint32, pb.MS_UINT32, "kMSI_Uint32"),
    (np.int64, pb.MS_INT64, "kMSI_Int64"),
    (np.uint64, pb.MS_UINT64, "kMSI_Uint64"),
    (np.float16, pb.MS_FLOAT16, "kMSI_Float16"),
    (np.float32, pb.MS_FLOAT32, "kMSI_Float32"),
    (np.float64, pb.MS_FLOAT64, "kMSI_Float64"),
]


def test_proto_enum_values_are_the_reference_ones():
    assert [
        pb.DataType.Value(n)
        for n in (
            "MS_UNKNOWN",
            "MS_BOOL",
            "MS_INT8",
            "MS_UINT8",
            "MS_INT16",
            "MS_UINT16",
            "MS_INT32",
            "MS_UINT32",
            "MS_INT64",
            "MS_UINT64",
            "MS_FLOAT16",
            "MS_FLOAT32",
            "MS_FLOAT64",
            "MS_STRING",
            "MS_BYTES",
        )
    ] == list(range(15))


def test_proto_field_numbers_are_the_reference_ones():
    def numbers(message):
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(pb.PredictRequest) == {"servable_spec": 1, "instances": 2}
    assert numbers(pb.PredictReply) == {"servable_spec": 1, "instances": 3, "error_msg": 4}
    assert numbers(pb.ServableSpec) == {"name": 1, "method_name": 2, "version_number": 3}
    assert numbers(pb.Instance) == {"items": 1, "output_buffers": 2}
    assert numbers(pb.Tensor) == {"shape": 1, "dtype": 2, "data": 3, "bytes_val": 4, "shm_data": 5}
    assert numbers(pb.TensorShape) == {"dims": 1}
    assert numbers(pb.ShmTensorData) == {"memory_key": 1, "bytes_size": 2, "data_offset": 3, "data_size": 4}
    assert numbers(pb.ErrorMsg) == {"error_code": 1, "error_msg": 2}
    assert numbers(pb.TensorInfo) == {"shape": 1, "dtype": 2, "size": 3, "is_no_batch_dim": 4}
    for message in (pb.PingRequest, pb.PingReply, pb.PongRequest, pb.PongReply):
        assert numbers(message) == {"address": 1}
    assert pb.DESCRIPTOR.package == "mindspore.serving.proto"
    service = pb.DESCRIPTOR.services_by_name["MSService"]
    assert service.methods_by_name["Predict"].input_type.name == "PredictRequest"
    assert service.methods_by_name["PredictStream"].server_streaming


@pytest.mark.parametrize("dtype,code,name", NUMERIC)
def test_dtype_maps(dtype, code, name):
    assert tc.dtype_to_proto(dtype) == code
    assert tc.proto_to_dtype(code) == np.dtype(dtype)


def test_unknown_dtypes():
    with pytest.raises(TypeError, match="Unknown data type <U3"):
        tc.dtype_to_proto(np.array(["abc"]).dtype)
    with pytest.raises(ValueError):
        tc.proto_to_dtype(pb.MS_STRING)


@pytest.mark.parametrize("dtype,code,_", NUMERIC)
@pytest.mark.parametrize("shape", [(), (1,), (2, 3), (0,), (2, 0), (3, 1, 2)])
def test_numeric_round_trip(dtype, code, _, shape):
    value = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    tensor = tc.value_to_tensor(value)
    assert tensor.dtype == code
    assert list(tensor.shape.dims) == list(shape)
    assert tensor.data == value.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    assert check_tensor(tensor) is None
    back = tc.tensor_to_value(tensor)
    assert back.dtype == np.dtype(dtype) and back.shape == shape
    np.testing.assert_array_equal(back, value)
    back[...] = 0  # copies are writable
    view = tc.tensor_to_value(tensor, copy=False)
    assert not view.flags.writeable


def test_non_contiguous_and_big_endian_arrays_go_as_little_endian_c_order():
    value = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    tensor = tc.value_to_tensor(value)
    assert tensor.data == np.ascontiguousarray(value).tobytes()
    big = np.arange(3, dtype=">f4")
    tensor = tc.value_to_tensor(big)
    assert tensor.dtype == pb.MS_FLOAT32 and tensor.data == big.astype("<f4").tobytes()
    np.testing.assert_array_equal(tc.tensor_to_value(tensor), big)


def test_scalars_and_python_numbers():
    assert tc.tensor_to_value(tc.value_to_tensor(np.float32(1.5))).shape == ()
    assert tc.tensor_to_value(tc.value_to_tensor(True)).dtype == np.bool_
    assert tc.tensor_to_value(tc.value_to_tensor(3)).dtype == np.int64
    assert tc.tensor_to_value(tc.value_to_tensor(3.0)).dtype == np.float64
    with pytest.raises(TypeError, match="Not support value type"):
        tc.value_to_tensor([1, 2])
    with pytest.raises(TypeError, match="Unknown data type <U2"):
        tc.value_to_tensor(np.array(["ab"]))


def test_str_and_bytes():
    tensor = tc.value_to_tensor("héllo")
    assert (
        tensor.dtype == pb.MS_STRING and list(tensor.shape.dims) == [] and list(tensor.bytes_val) == ["héllo".encode()]
    )
    assert tc.tensor_to_value(tensor) == "héllo"
    tensor = tc.value_to_tensor("x", string_dims=(1,))
    assert list(tensor.shape.dims) == [1]
    assert tc.tensor_to_value(tensor) == "x"
    tensor = tc.value_to_tensor(b"\x00\xff")
    assert tensor.dtype == pb.MS_BYTES and tc.tensor_to_value(tensor) == b"\x00\xff"
    assert isinstance(tc.tensor_to_value(tensor), bytes)
    assert tc.tensor_to_value(tc.value_to_tensor("")) == ""
    # invalid UTF-8 survives a round trip
    raw = pb.Tensor(dtype=pb.MS_STRING, bytes_val=[b"\xff\xfe"])
    assert tc.value_to_tensor(tc.tensor_to_value(raw)).bytes_val[0] == b"\xff\xfe"
    # several elements come back as a list
    assert tc.tensor_to_value(pb.Tensor(dtype=pb.MS_BYTES, bytes_val=[b"a", b"b"])) == [b"a", b"b"]


def test_shaped_str_keeps_its_dims():
    value = tc.ShapedStr("abc", [1, 1])
    assert value == "abc" and isinstance(value, str)
    assert list(tc.value_to_tensor(value).shape.dims) == [1, 1]
    assert list(tc.value_to_tensor(tc.ShapedBytes(b"a", [1, 1])).shape.dims) == [1, 1]


def test_tensor_to_value_rejects_bad_sizes():
    tensor = pb.Tensor(dtype=pb.MS_FLOAT32, data=b"\x00" * 7)
    tensor.shape.dims.extend([2])
    with pytest.raises(ValueError, match="input data size 7 invalid"):
        tc.tensor_to_value(tensor)


def test_instances_round_trip():
    instances = [{"x": np.ones((2, 2), np.float32), "s": "abc", "b": b"\x01"}, {"x": np.zeros((0,), np.int8)}]
    request = pb.PredictRequest()
    tc.instances_to_proto(instances, request.instances)
    request = pb.PredictRequest.FromString(request.SerializeToString())
    back = tc.proto_to_instances(request.instances)
    assert back[0]["s"] == "abc" and back[0]["b"] == b"\x01"
    np.testing.assert_array_equal(back[0]["x"], instances[0]["x"])
    assert back[1]["x"].shape == (0,) and back[1]["x"].dtype == np.int8


# ------------------------------------------------------------------------------------------------ errors


def test_error_hierarchy():
    assert (
        errors.OK,
        errors.FAILED,
        errors.INVALID_INPUTS,
        errors.SYSTEM_ERROR,
        errors.WORKER_UNAVAILABLE,
        errors.SERVABLE_UNAVAILABLE,
    ) == (0, 1, 2, 3, 4, 5)
    for cls, code in (
        (errors.Failed, 1),
        (errors.InvalidInputs, 2),
        (errors.SystemError_, 3),
        (errors.WorkerUnavailable, 4),
        (errors.ServableUnavailable, 5),
    ):
        err = cls("text")
        assert isinstance(err, errors.ServingError) and err.code == code and err.message == "text"
        assert str(err) == "text"
        assert type(errors.make_error(code, "t")) is cls
    assert errors.as_serving_error(ValueError("boom")).code == errors.FAILED
    assert errors.as_serving_error((2, "bad")).code == errors.INVALID_INPUTS
    assert errors.ServingError(7, "x").code == 7


# ------------------------------------------------------------------------------------------------ replies


def test_reply_to_results_rejects_inconsistent_counts():
    reply = pb.PredictReply()
    reply.instances.add()
    reply.instances.add()
    reply.instances.add()
    reply.error_msg.add()
    reply.error_msg.add()
    with pytest.raises(RuntimeError, match="error msg result size 2 not be 0, 1 or length of instances 3"):
        tc.reply_to_results(reply)
