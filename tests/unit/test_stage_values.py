"""Values passed between stages: what a Python stage may return, and the per-instance model input checks."""

import numpy as np
import pytest

from mindspore_serving.worker.model_backend import TensorInfo, kmsi_name
from mindspore_serving.worker.stage_values import (
    check_model_inputs,
    normalize_outputs,
    shape_to_model,
    to_model_input,
    to_stage_value,
)

F32_2X2 = TensorInfo((2, 2), np.dtype(np.float32))


class FakeMsTensor:
    """Anything with `.asnumpy()`, like a mindspore.Tensor."""

    def __init__(self, array):
        self.array = array

    def asnumpy(self):
        return self.array


# ---------------------------------------------------------------- to_stage_value


@pytest.mark.parametrize(
    "value, dtype", [(True, np.bool_), (False, np.bool_), (7, np.int64), (-3, np.int64), (2.5, np.float64)]
)
def test_python_scalars_become_0d_arrays(value, dtype):
    result = to_stage_value(value)
    assert isinstance(result, np.ndarray)
    assert result.shape == ()
    assert result.dtype == dtype
    assert result.item() == value


@pytest.mark.parametrize("value", [np.float32(1.5), np.int8(-2), np.uint16(9), np.bool_(True), np.float16(0.5)])
def test_numpy_scalars_keep_their_dtype(value):
    result = to_stage_value(value)
    assert isinstance(result, np.ndarray)
    assert result.shape == ()
    assert result.dtype == value.dtype
    assert result.item() == value.item()


def test_contiguous_arrays_pass_without_copy():
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert to_stage_value(array) is array  # in-place edits stay visible to later stages


def test_non_contiguous_arrays_are_made_contiguous():
    array = np.arange(6, dtype=np.float32).reshape(2, 3).T
    result = to_stage_value(array)
    assert result.flags["C_CONTIGUOUS"]
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, [[0, 3], [1, 4], [2, 5]])


def test_str_and_bytes_pass_unchanged():
    assert to_stage_value("text") == "text"
    assert isinstance(to_stage_value("text"), str)
    assert to_stage_value(b"\x00\x01") == b"\x00\x01"
    assert isinstance(to_stage_value(b"\x00\x01"), bytes)


def test_asnumpy_objects_are_unwrapped():
    result = to_stage_value(FakeMsTensor(np.arange(4, dtype=np.float16).reshape(2, 2)[:, ::-1]))
    assert result.dtype == np.float16
    assert result.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(result, [[1, 0], [3, 2]])


@pytest.mark.parametrize(
    "value, name",
    [([1, 2], "list"), (None, "NoneType"), ({"a": 1}, "dict"), (bytearray(b"a"), "bytearray"), ((1,), "tuple")],
)
def test_unsupported_values_raise_type_error(value, name):
    with pytest.raises(TypeError) as info:
        to_stage_value(value)
    assert str(info.value) == (
        f"output type {name} is not supported, expect numpy array, numpy scalar, bool, int, "
        f"float, str, bytes or mindspore Tensor"
    )


# ---------------------------------------------------------------- normalize_outputs


def test_single_output_accepts_a_value_or_a_one_tuple():
    (value,) = normalize_outputs(np.ones(3, np.float32), 1)
    np.testing.assert_array_equal(value, np.ones(3))
    (value,) = normalize_outputs((5,), 1)
    assert value.dtype == np.int64 and value.item() == 5
    assert normalize_outputs("label", 1) == ("label",)


def test_single_output_rejects_a_tuple_of_two():
    with pytest.raises(TypeError, match="output type tuple is not supported"):
        normalize_outputs((1, 2), 1)


def test_several_outputs_from_tuple_or_list():
    result = normalize_outputs([1, "a", b"b", 2.0], 4)
    assert isinstance(result, tuple) and len(result) == 4
    assert result[0].dtype == np.int64
    assert result[1:3] == ("a", b"b")
    assert result[3].dtype == np.float64


def test_output_count_mismatch_texts():
    with pytest.raises(RuntimeError) as info:
        normalize_outputs(np.zeros(2), 2)
    assert str(info.value) == "the number of outputs is 1, not equal to outputs_count 2"
    with pytest.raises(RuntimeError) as info:
        normalize_outputs((1, 2, 3), 2)
    assert str(info.value) == "the number of outputs is 3, not equal to outputs_count 2"
    with pytest.raises(RuntimeError) as info:
        normalize_outputs([1], 3)
    assert str(info.value) == "the number of outputs is 1, not equal to outputs_count 3"


def test_one_bad_item_fails_normalization():
    with pytest.raises(TypeError, match="output type NoneType is not supported"):
        normalize_outputs((1, None), 2)


# ---------------------------------------------------------------- model inputs


def test_bytes_feed_models_as_uint8_arrays():
    value = to_model_input(b"\x01\x02\x03")
    assert value.dtype == np.uint8 and value.shape == (3,)
    np.testing.assert_array_equal(value, [1, 2, 3])
    array = np.ones(2)
    assert to_model_input(array) is array
    assert to_model_input("s") == "s"


def test_matching_inputs_pass():
    assert check_model_inputs([np.zeros((2, 2), np.float32), np.ones((2, 2), np.float32)], [F32_2X2, F32_2X2]) is None


def test_only_the_byte_size_is_compared_not_the_shape():
    assert check_model_inputs([np.zeros(4, np.float32)], [F32_2X2]) is None
    assert check_model_inputs([np.zeros((4, 1), np.float32)], [F32_2X2]) is None


def test_size_mismatch_text():
    assert (
        check_model_inputs([np.zeros((2, 2), np.float32), np.zeros((3, 2), np.float32)], [F32_2X2, F32_2X2])
        == "Given model input 1 size 24 not match the size 16 defined in model"
    )


def test_dtype_mismatch_text_with_kmsi_names():
    assert (
        check_model_inputs([np.zeros((2, 2), np.int32)], [F32_2X2])
        == "Given model input 0 data type kMSI_Int32 not match the data type kMSI_Float32 defined in model"
    )
    info = TensorInfo((4,), np.dtype(np.int16))
    assert (
        check_model_inputs([np.zeros(4, np.float16)], [info])
        == "Given model input 0 data type kMSI_Float16 not match the data type kMSI_Int16 defined in model"
    )


def test_size_is_checked_before_dtype():
    # int64 [2, 2] is 32 bytes: the size text wins over the dtype text
    assert (
        check_model_inputs([np.zeros((2, 2), np.int64)], [F32_2X2])
        == "Given model input 0 size 32 not match the size 16 defined in model"
    )


def test_str_and_bytes_values_report_their_type():
    assert (
        check_model_inputs(["abc"], [F32_2X2])
        == "Given model input 0 data type kMSI_String not match the data type kMSI_Float32 defined in model"
    )
    assert (
        check_model_inputs([np.zeros((2, 2), np.float32), b"abc"], [F32_2X2, F32_2X2])
        == "Given model input 1 data type kMSI_Bytes not match the data type kMSI_Float32 defined in model"
    )


def test_inputs_count_mismatch_text():
    assert (
        check_model_inputs([np.zeros((2, 2), np.float32)], [F32_2X2, F32_2X2])
        == "The inputs count 1 is not equal to the inputs count 2 of the model"
    )
    assert check_model_inputs([], [F32_2X2]) == "The inputs count 0 is not equal to the inputs count 1 of the model"


def test_dynamic_dims_skip_the_size_check_but_not_the_dtype_check():
    dynamic = TensorInfo((-1, 3), np.dtype(np.float32))
    assert not dynamic.is_static
    assert dynamic.nbytes == -1
    assert check_model_inputs([np.zeros((5, 3), np.float32)], [dynamic]) is None
    assert (
        check_model_inputs([np.zeros((5, 3), np.int32)], [dynamic])
        == "Given model input 0 data type kMSI_Int32 not match the data type kMSI_Float32 defined in model"
    )


def test_first_failing_input_is_reported():
    infos = [F32_2X2, TensorInfo((3,), np.dtype(np.int32)), F32_2X2]
    values = [np.zeros((2, 2), np.float32), np.zeros(3, np.int64), "x"]
    assert check_model_inputs(values, infos) == "Given model input 1 size 24 not match the size 12 defined in model"


@pytest.mark.parametrize(
    "dtype, name",
    [
        (np.bool_, "kMSI_Bool"),
        (np.int8, "kMSI_Int8"),
        (np.uint8, "kMSI_Uint8"),
        (np.int16, "kMSI_Int16"),
        (np.uint16, "kMSI_Uint16"),
        (np.int32, "kMSI_Int32"),
        (np.uint32, "kMSI_Uint32"),
        (np.int64, "kMSI_Int64"),
        (np.uint64, "kMSI_Uint64"),
        (np.float16, "kMSI_Float16"),
        (np.float32, "kMSI_Float32"),
        (np.float64, "kMSI_Float64"),
    ],
)
def test_kmsi_names(dtype, name):
    assert kmsi_name(np.dtype(dtype)) == name
    assert kmsi_name(dtype) == name


def test_kmsi_names_of_str_and_bytes():
    assert kmsi_name("a") == "kMSI_String"
    assert kmsi_name(b"a") == "kMSI_Bytes"


def test_tensor_info_nbytes():
    assert F32_2X2.nbytes == 16
    assert TensorInfo((), np.dtype(np.float64)).nbytes == 8
    assert TensorInfo((0, 5), np.dtype(np.int32)).nbytes == 0


# ---------------------------------------------------------------- shape_to_model


def test_shape_to_model_reshapes_to_the_model_shape():
    flat = np.arange(4, dtype=np.float32)
    (shaped,) = shape_to_model([flat], [F32_2X2])
    assert shaped.shape == (2, 2)
    np.testing.assert_array_equal(shaped, [[0, 1], [2, 3]])


def test_shape_to_model_keeps_dynamic_inputs_and_returns_a_tuple():
    dynamic = TensorInfo((-1,), np.dtype(np.int32))
    value = np.arange(5, dtype=np.int32).reshape(5, 1)
    result = shape_to_model([np.zeros((4, 1), np.float32), value], [F32_2X2, dynamic])
    assert isinstance(result, tuple)
    assert result[0].shape == (2, 2)
    assert result[1] is value


def test_a_0_d_array_stays_0_d_and_others_become_contiguous():
    """np.ascontiguousarray would make a 0-d array 1-d: a scalar a stage returns stays a scalar (REST `7`, not
    `[7]`), as in MindSpore Serving."""
    assert to_stage_value(np.array(7, np.int32)).shape == ()
    transposed = np.arange(6, dtype=np.float32).reshape(2, 3).T
    made = to_stage_value(transposed)
    assert made.flags.c_contiguous and made.shape == (3, 2) and np.array_equal(made, transposed)
