"""KServe v2 <-> MindSpore Serving instances (frontends/kserve_codec.py): names, checks, encodings."""

import json
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from mindspore_serving.common import errors
from mindspore_serving.frontends import kserve_codec as codec
from mindspore_serving.proto import grpc_predict_v2_pb2 as v2
from mindspore_serving.proto import internal_pb2
from mindspore_serving.proto import ms_service_pb2 as ms


def signature(name, inputs, outputs, batched=False):
    """inputs/outputs: [(name, dtype code or None, shape)]."""

    def tensors(items):
        return [
            internal_pb2.TensorSignature(name=n, dtype=d, shape=s, known=True)
            if d is not None
            else internal_pb2.TensorSignature(name=n)
            for n, d, s in items
        ]

    return internal_pb2.MethodSignature(
        name=name,
        input_names=[i[0] for i in inputs],
        output_names=[o[0] for o in outputs],
        inputs=tensors(inputs),
        outputs=tensors(outputs),
        batched=batched,
    )


ADD = signature(
    "add_common", [("x1", ms.MS_FLOAT32, [2, 2]), ("x2", ms.MS_FLOAT32, [2, 2])], [("y", ms.MS_FLOAT32, [2, 2])]
)
LENET = signature("classify", [("image", None, [])], [("label", None, [])], batched=True)
ROWS = signature("rows", [("x", ms.MS_INT32, [3])], [("y", ms.MS_INT32, [3])], batched=True)


def worker(servable, version, *signatures):
    return SimpleNamespace(servable_name=servable, version_number=version, methods={s.name: s for s in signatures})


def test_names_are_the_servable_alone_when_it_has_one_method():
    models = codec.catalog(
        [worker("add", 1, ADD, signature("add_cast", [], [])), worker("lenet", 1, LENET), worker("lenet", 2, LENET)]
    )
    assert sorted(models) == ["add.add_cast", "add.add_common", "lenet"]
    assert models["lenet"].versions == [1, 2] and models["lenet"].version == "2"
    model, number = codec.resolve([worker("lenet", 1, LENET)], "lenet.classify", "1")
    assert (model.name, model.method, number) == ("lenet", "classify", 1)


def test_unknown_model_or_version_is_not_found():
    with pytest.raises(errors.ServableUnavailable, match="'nope' is not served"):
        codec.resolve([worker("lenet", 1, LENET)], "nope")
    with pytest.raises(errors.ServableUnavailable, match="version 3"):
        codec.resolve([worker("lenet", 1, LENET)], "lenet", "3")
    with pytest.raises(errors.InvalidInputs, match="version 'x'"):
        codec.resolve([worker("lenet", 1, LENET)], "lenet", "x")


def test_metadata_prefixes_batched_shapes_and_reports_python_stage_tensors_as_bytes():
    model = codec.V2Model("rows", "rows", "rows", [1], ROWS)
    meta = codec.model_metadata(model)
    assert meta["inputs"] == [{"name": "x", "datatype": "INT32", "shape": [-1, 3]}]
    lenet = codec.model_metadata(codec.V2Model("lenet", "lenet", "classify", [1], LENET))
    assert lenet["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
    reply = codec.metadata_to_grpc(meta)
    assert list(reply.inputs[0].shape) == [-1, 3] and reply.versions == ["1"]


def test_unbatched_request_is_one_instance_and_outputs_come_back_whole():
    model = codec.V2Model("add", "add", "add_common", [1], ADD)
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    tensors = [codec.V2Tensor("x1", "FP32", x), codec.V2Tensor("x2", "FP32", x)]
    instances = codec.tensors_to_instances(model, tensors)
    assert len(instances) == 1 and np.array_equal(instances[0]["x2"], x)
    out = codec.instances_to_tensors(model, [{"y": x * 2}])
    assert out[0].datatype == "FP32" and np.array_equal(out[0].data, x * 2)


def test_batched_request_splits_rows_into_instances_and_stacks_outputs():
    model = codec.V2Model("rows", "rows", "rows", [1], ROWS)
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    instances = codec.tensors_to_instances(model, [codec.V2Tensor("x", "INT32", x)])
    assert [i["x"].tolist() for i in instances] == [[0, 1, 2], [3, 4, 5]]
    out = codec.instances_to_tensors(model, [{"y": row} for row in x])
    assert out[0].data.shape == (2, 3)
    images = codec.tensor_from_values("lenet", "image", "BYTES", [2], ["a", b"b"])
    lenet = codec.V2Model("lenet", "lenet", "classify", [1], LENET)
    assert codec.tensors_to_instances(lenet, [images]) == [{"image": b"a"}, {"image": b"b"}]
    labels = codec.instances_to_tensors(lenet, [{"label": "7"}, {"label": "2"}])
    assert labels[0].datatype == "BYTES" and list(labels[0].data) == ["7", "2"]


@pytest.mark.parametrize(
    "tensor, text",
    [
        (codec.V2Tensor("x1", "FP64", np.zeros((2, 2))), "input 'x1' has datatype FP64, but the model expects FP32"),
        (
            codec.V2Tensor("x1", "FP32", np.zeros((2, 3), np.float32)),
            "input 'x1' has shape [2, 3], but the model expects [2, 2]",
        ),
    ],
)
def test_datatype_and_shape_must_match_the_model(tensor, text):
    model = codec.V2Model("add", "add", "add_common", [1], ADD)
    other = codec.V2Tensor("x2", "FP32", np.zeros((2, 2), np.float32))
    with pytest.raises(errors.InvalidInputs) as err:
        codec.tensors_to_instances(model, [tensor, other])
    assert text in err.value.message


def test_missing_unknown_and_size_errors_name_the_input():
    model = codec.V2Model("add", "add", "add_common", [1], ADD)
    with pytest.raises(errors.InvalidInputs, match="input 'x2' is missing"):
        codec.tensors_to_instances(model, [codec.V2Tensor("x1", "FP32", np.zeros((2, 2), np.float32))])
    with pytest.raises(errors.InvalidInputs, match="unknown input 'z'"):
        codec.tensors_to_instances(model, [codec.V2Tensor("z", "FP32", np.zeros(1, np.float32))])
    with pytest.raises(errors.InvalidInputs, match="input 'x1' carries 12 bytes, but datatype FP32 and shape"):
        codec.tensor_from_raw("add", "x1", "FP32", [2, 2], b"\0" * 12)
    with pytest.raises(errors.InvalidInputs, match="input 'x1' holds 3 elements"):
        codec.tensor_from_values("add", "x1", "FP32", [2, 2], [1, 2, 3])
    with pytest.raises(errors.InvalidInputs, match="unknown datatype 'FP8'"):
        codec.tensor_from_values("add", "x1", "FP8", [1], [1])


def test_rest_binary_data_round_trip():
    model = codec.V2Model("add", "add", "add_common", [1], ADD)
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    header = json.dumps(
        {
            "id": "r1",
            "inputs": [
                {"name": "x1", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}},
                {"name": "x2", "datatype": "FP32", "shape": [2, 2], "data": [[0, 1], [2, 3]]},
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    tensors, outputs, request = codec.parse_rest_request("add", header + x.tobytes(), len(header))
    assert np.array_equal(tensors[0].data, x) and np.array_equal(tensors[1].data, x)
    assert outputs == [("y", True)]
    body, length = codec.encode_rest_reply(model, "1", request, [codec.V2Tensor("y", "FP32", x)], {"y": True})
    reply = json.loads(body[:length])
    assert reply["id"] == "r1" and reply["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert np.array_equal(np.frombuffer(body[length:], np.float32).reshape(2, 2), x)
    body, length = codec.encode_rest_reply(model, "1", request, [codec.V2Tensor("y", "FP32", x)], {})
    assert length is None and json.loads(body)["outputs"][0]["data"] == [0.0, 1.0, 2.0, 3.0]


def test_serialized_bytes_are_length_prefixed():
    raw = codec.join_bytes(np.array([b"ab", "c"], dtype=object))
    assert raw == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 1) + b"c"
    assert list(codec.split_bytes("m", "i", raw, 2)) == [b"ab", b"c"]
    with pytest.raises(errors.InvalidInputs, match="holds 2 BYTES elements"):
        codec.split_bytes("m", "i", raw, 3)


def test_grpc_typed_and_raw_contents():
    request = v2.ModelInferRequest(model_name="add")
    item = request.inputs.add(name="x1", datatype="INT32", shape=[2])
    item.contents.int_contents.extend([1, 2])
    tensors = codec.grpc_request_tensors("add", request)
    assert tensors[0].data.dtype == np.int32 and tensors[0].data.tolist() == [1, 2]
    request.raw_input_contents.append(np.array([3, 4], np.int32).tobytes())
    assert codec.grpc_request_tensors("add", request)[0].data.tolist() == [3, 4]
    model = codec.V2Model("add", "add", "add_common", [1], ADD)
    reply = codec.grpc_reply(model, "1", request, [codec.V2Tensor("y", "FP16", np.ones(2, np.float16))])
    assert reply.outputs[0].datatype == "FP16" and reply.raw_output_contents[0] == np.ones(2, np.float16).tobytes()
    fp16 = v2.ModelInferRequest(model_name="add")
    fp16.inputs.add(name="x1", datatype="FP16", shape=[1])
    with pytest.raises(errors.InvalidInputs, match="raw_input_contents only"):
        codec.grpc_request_tensors("add", fp16)
