"""KServe v2 inference protocol <-> MindSpore Serving instances: model names, datatypes, tensor checks, and the
JSON (with the binary-data extension) and gRPC encodings. Pure conversion; frontends/kserve.py serves it.

Model names: a servable method is the v2 model `<servable>` when the servable has one method, and
`<servable>.<method>` otherwise (the long form is accepted for one-method servables too). The version is the
servable version; none means the newest.

Tensors <-> instances: when the method's model has a batch dimension (the worker registers it as `batched`),
a v2 tensor's first dimension counts instances and row i of every input makes instance i; outputs are the
instances' values stacked again. Otherwise a request is one instance holding the tensors whole. BYTES
elements are MindSpore Serving bytes values, one per instance; str and bytes outputs come back as BYTES.
"""

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mindspore_serving.common import errors
from mindspore_serving.proto import grpc_predict_v2_pb2 as v2
from mindspore_serving.proto import internal_pb2
from mindspore_serving.proto import ms_service_pb2 as ms

BYTES = "BYTES"
DATATYPES: dict[str, np.dtype | None] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    BYTES: None,
}
"""v2 datatype -> numpy dtype (None: BYTES, an object array of bytes)."""
_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items() if dtype is not None}
_PROTO_NAMES = {
    ms.MS_BOOL: "BOOL",
    ms.MS_INT8: "INT8",
    ms.MS_UINT8: "UINT8",
    ms.MS_INT16: "INT16",
    ms.MS_UINT16: "UINT16",
    ms.MS_INT32: "INT32",
    ms.MS_UINT32: "UINT32",
    ms.MS_INT64: "INT64",
    ms.MS_UINT64: "UINT64",
    ms.MS_FLOAT16: "FP16",
    ms.MS_FLOAT32: "FP32",
    ms.MS_FLOAT64: "FP64",
    ms.MS_STRING: BYTES,
    ms.MS_BYTES: BYTES,
}
# v2 datatype -> the InferTensorContents field of its typed elements (FP16 has none: raw contents only)
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    BYTES: "bytes_contents",
}
HEADER_LENGTH = "inference-header-content-length"
PLATFORM = "mindspore_mindir"


def datatype_of(array: np.ndarray) -> str:
    if array.dtype == object:
        return BYTES
    name = _BY_DTYPE.get(array.dtype.newbyteorder("=") if array.dtype.byteorder == ">" else array.dtype)
    if name is None:
        raise errors.SystemError_(f"Serving Error: an output of numpy dtype {array.dtype} has no v2 datatype")
    return name


# ------------------------------------------------------------------------------------------------ models


@dataclass
class V2Model:
    """One v2 model: a method of a servable, the versions that serve it and what its worker registered."""

    name: str
    servable: str
    method: str
    versions: list[int]
    signature: object  # internal_pb2.MethodSignature

    @property
    def version(self) -> str:
        return str(max(self.versions))


def catalog(workers) -> dict[str, V2Model]:
    """The v2 models served by `workers` (WorkerRecords), by name."""
    methods: dict[str, dict[str, object]] = {}
    versions: dict[tuple[str, str], set] = {}
    for worker in workers:
        for name, signature in worker.methods.items():
            methods.setdefault(worker.servable_name, {})[name] = signature
            versions.setdefault((worker.servable_name, name), set()).add(worker.version_number)
    models = {}
    for servable, by_name in methods.items():
        for method, signature in by_name.items():
            name = servable if len(by_name) == 1 else f"{servable}.{method}"
            models[name] = V2Model(name, servable, method, sorted(versions[(servable, method)]), signature)
    return models


def resolve(workers, name: str, version: str = "") -> tuple[V2Model, int]:
    """The model `name` and the version number asked for (0: the newest); ServableUnavailable (404) when it is
    not served, InvalidInputs for a version that is not a number."""
    models = catalog(workers)
    model = models.get(name)
    if model is None and "." in name:  # the long form of a one-method servable
        model = next((m for m in models.values() if f"{m.servable}.{m.method}" == name), None)
    if model is None:
        raise errors.ServableUnavailable(
            f"Request for unknown model: '{name}' is not served (served: {', '.join(sorted(models)) or 'none'})"
        )
    number = 0
    if version:
        if not version.isdigit():
            raise errors.InvalidInputs(f"model '{name}': version '{version}' is not a version number")
        number = int(version)
        if number and number not in model.versions:
            raise errors.ServableUnavailable(
                f"Request for unknown model: '{name}' version {number} is not served "
                f"(served versions: {', '.join(map(str, model.versions))})"
            )
    return model, number


def _tensor_meta(signature, batched: bool) -> dict:
    if not signature.known:
        return {"name": signature.name, "datatype": BYTES, "shape": [-1]}
    shape = list(signature.shape)
    return {
        "name": signature.name,
        "datatype": _PROTO_NAMES.get(signature.dtype, BYTES),
        "shape": [-1] + shape if batched else shape,
    }


def model_metadata(model: V2Model) -> dict:
    """The v2 model metadata. Inputs and outputs whose type only a Python stage knows read BYTES [-1]."""
    sig = model.signature
    inputs = {s.name: s for s in sig.inputs}
    outputs = {s.name: s for s in sig.outputs}
    unknown = _unknown
    return {
        "name": model.name,
        "versions": [str(v) for v in model.versions],
        "platform": PLATFORM,
        "inputs": [_tensor_meta(inputs.get(n) or unknown(n), sig.batched) for n in sig.input_names],
        "outputs": [_tensor_meta(outputs.get(n) or unknown(n), sig.batched) for n in sig.output_names],
    }


def _unknown(name: str) -> "internal_pb2.TensorSignature":
    """A signature that knows nothing (a worker that registered none)."""
    return internal_pb2.TensorSignature(name=name)


def metadata_to_grpc(metadata: dict) -> "v2.ModelMetadataResponse":
    reply = v2.ModelMetadataResponse(
        name=metadata["name"], versions=metadata["versions"], platform=metadata["platform"]
    )
    for field in ("inputs", "outputs"):
        for tensor in metadata[field]:
            getattr(reply, field).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
    return reply


# ------------------------------------------------------------------------------------------------ tensors


@dataclass
class V2Tensor:
    """A decoded v2 tensor: `data` is a numpy array of its shape (an object array of bytes for BYTES)."""

    name: str
    datatype: str
    data: np.ndarray


def _invalid(model: str, message: str) -> errors.InvalidInputs:
    return errors.InvalidInputs(f"model '{model}': {message}")


def _shape_text(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _datatype(model: str, name: str, datatype: str) -> np.dtype | None:
    if datatype not in DATATYPES:
        raise _invalid(model, f"input '{name}' has unknown datatype '{datatype}' (known: {', '.join(DATATYPES)})")
    return DATATYPES[datatype]


def _check_shape(model: str, name: str, shape: Sequence[int]) -> list[int]:
    shape = [int(d) for d in shape]
    if any(d < 0 for d in shape):
        raise _invalid(model, f"input '{name}' has invalid shape {_shape_text(shape)}")
    return shape


def split_bytes(model: str, name: str, raw: bytes, count: int) -> np.ndarray:
    """The `count` elements of serialized BYTES: each a 4-byte little-endian length, then its bytes."""
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise _invalid(model, f"input '{name}': serialized BYTES end in the middle of a length")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise _invalid(
                model, f"input '{name}': a BYTES element of {size} bytes runs past the {len(raw)} bytes of the tensor"
            )
        items.append(raw[offset : offset + size])
        offset += size
    if len(items) != count:
        raise _invalid(model, f"input '{name}' holds {len(items)} BYTES elements, but its shape needs {count}")
    array = np.empty(count, dtype=object)
    array[:] = items
    return array


def join_bytes(array: np.ndarray) -> bytes:
    parts = []
    for item in array.reshape(-1):
        item = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(struct.pack("<I", len(item)))
        parts.append(item)
    return b"".join(parts)


def tensor_from_raw(model: str, name: str, datatype: str, shape, raw: bytes) -> V2Tensor:
    """A tensor from binary data (the binary-data extension or gRPC raw contents); InvalidInputs naming the
    input when its byte size disagrees with its datatype and shape."""
    dtype = _datatype(model, name, datatype)
    shape = _check_shape(model, name, shape)
    count = math.prod(shape)
    if dtype is None:
        return V2Tensor(name, datatype, split_bytes(model, name, raw, count).reshape(shape))
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise _invalid(
            model,
            f"input '{name}' carries {len(raw)} bytes, but datatype {datatype} and shape "
            f"{_shape_text(shape)} need {expected}",
        )
    return V2Tensor(name, datatype, np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype).reshape(shape))


def tensor_from_values(model: str, name: str, datatype: str, shape, values) -> V2Tensor:
    """A tensor from a flat or nested list of elements (JSON `data`, gRPC typed contents)."""
    dtype = _datatype(model, name, datatype)
    shape = _check_shape(model, name, shape)
    count = math.prod(shape)
    flat = list(_flatten(values))
    if len(flat) != count:
        raise _invalid(
            model, f"input '{name}' holds {len(flat)} elements, but shape {_shape_text(shape)} needs {count}"
        )
    if dtype is None:
        array = np.empty(count, dtype=object)
        array[:] = [item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in flat]
        return V2Tensor(name, datatype, array.reshape(shape))
    try:
        array = np.array(flat, dtype=dtype) if flat else np.zeros(0, dtype)
    except (TypeError, ValueError, OverflowError) as err:
        raise _invalid(model, f"input '{name}': its data is not {datatype}: {err}") from None
    return V2Tensor(name, datatype, array.reshape(shape))


def _flatten(values):
    if isinstance(values, (list, tuple)):
        for value in values:
            yield from _flatten(value)
    else:
        yield values


def _shape_fits(shape: Sequence[int], expected: Sequence[int]) -> bool:
    return len(shape) == len(expected) and all(e < 0 or s == e for s, e in zip(shape, expected))


def tensors_to_instances(model: V2Model, tensors: Sequence[V2Tensor]) -> list[dict]:
    """The instances of a v2 request, checked against the model's inputs (InvalidInputs naming the input)."""
    sig = model.signature
    by_name = {}
    for tensor in tensors:
        if tensor.name in by_name:
            raise _invalid(model.name, f"input '{tensor.name}' is given twice")
        if tensor.name not in sig.input_names:
            raise _invalid(model.name, f"unknown input '{tensor.name}' (inputs: {', '.join(sig.input_names)})")
        by_name[tensor.name] = tensor
    signatures = {s.name: s for s in sig.inputs}
    count = None
    for name in sig.input_names:
        tensor = by_name.get(name)
        if tensor is None:
            raise _invalid(model.name, f"input '{name}' is missing")
        shape = list(tensor.data.shape)
        if sig.batched:
            if not shape or shape[0] == 0:
                raise _invalid(
                    model.name,
                    f"input '{name}' has shape {_shape_text(shape)}, but its first "
                    f"dimension counts instances and cannot be empty",
                )
            if count is None:
                count = shape[0]
            elif shape[0] != count:
                raise _invalid(
                    model.name,
                    f"input '{name}' holds {shape[0]} instances (first dimension) but the other inputs {count}",
                )
        signature = signatures.get(name)
        if signature is not None and signature.known:
            expected = _PROTO_NAMES.get(signature.dtype)
            if tensor.datatype != expected:
                raise _invalid(
                    model.name, f"input '{name}' has datatype {tensor.datatype}, but the model expects {expected}"
                )
            instance_shape = shape[1:] if sig.batched else shape
            if not _shape_fits(instance_shape, signature.shape):
                wanted = ([-1] if sig.batched else []) + list(signature.shape)
                raise _invalid(
                    model.name,
                    f"input '{name}' has shape {_shape_text(shape)}, but the model expects {_shape_text(wanted)}",
                )
        if tensor.datatype == BYTES:
            per_instance = tensor.data.size // (count or 1) if sig.batched else tensor.data.size
            if per_instance != 1:
                raise _invalid(
                    model.name,
                    f"input '{name}' is BYTES of shape {_shape_text(shape)}: each instance takes exactly one element",
                )
    if not sig.batched:
        return [{name: _value(by_name[name]) for name in sig.input_names}]
    return [{name: _row(by_name[name], index) for name in sig.input_names} for index in range(count)]


def _value(tensor: V2Tensor):
    return tensor.data.reshape(-1)[0] if tensor.datatype == BYTES else tensor.data


def _row(tensor: V2Tensor, index: int):
    row = tensor.data[index]
    if tensor.datatype == BYTES:
        return np.asarray(row, dtype=object).reshape(-1)[0]
    return np.ascontiguousarray(row)


def _as_array(value) -> np.ndarray:
    if isinstance(value, (str, bytes, bytearray)):
        array = np.empty(1, dtype=object)
        array[0] = value
        return array
    if isinstance(value, list):  # several str/bytes elements
        array = np.empty(len(value), dtype=object)
        array[:] = value
        return array
    return np.asarray(value)


def instances_to_tensors(
    model: V2Model, outputs: Sequence[dict], requested: Sequence[str] | None = None
) -> list[V2Tensor]:
    """The output tensors of a request's answered instances (decoded dicts), in the model's output order or
    the requested one; InvalidInputs for an output the model does not have."""
    names = list(model.signature.output_names) or (list(outputs[0]) if outputs else [])
    if requested:
        for name in requested:
            if name not in names:
                raise _invalid(model.name, f"unknown output '{name}' (outputs: {', '.join(names)})")
        names = list(requested)
    tensors = []
    for name in names:
        if model.signature.batched:
            rows = [_as_array(instance[name]) for instance in outputs]
            if rows and rows[0].dtype == object:
                data = (
                    np.empty((len(rows),) + rows[0].shape[1:], dtype=object)
                    if rows[0].ndim > 1
                    else np.empty(len(rows), dtype=object)
                )
                for index, row in enumerate(rows):
                    data[index] = row.reshape(-1)[0] if data.ndim == 1 else row
            else:
                data = np.stack(rows)
        else:
            data = _as_array(outputs[0][name])
        tensors.append(V2Tensor(name, datatype_of(data), data))
    return tensors


# ------------------------------------------------------------------------------------------------ REST JSON


def parameter(parameters, key, default=None):
    """A request or tensor `parameters` entry (None when `parameters` is not an object)."""
    if not isinstance(parameters, dict):
        return default
    return parameters.get(key, default)


def parse_rest_request(
    model: str, body: bytes, header_length: int | None
) -> tuple[list[V2Tensor], list[tuple[str, bool | None]], dict]:
    """(input tensors, requested outputs as (name, binary_data or None), the JSON header) of a v2 infer body;
    with the binary-data extension the JSON header is the first `header_length` bytes and the binary inputs
    (`parameters.binary_data_size`) follow in input order."""
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise _invalid(
                model, f"Inference-Header-Content-Length {header_length} is not within the body of {len(body)} bytes"
            )
        header, binary = body[:header_length], memoryview(body)[header_length:]
    else:
        header, binary = body, memoryview(b"")
    try:
        request = json.loads(header)
    except (ValueError, UnicodeDecodeError) as err:
        raise _invalid(model, f"the request is not valid JSON: {err}") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise _invalid(model, "the request has no 'inputs' list")
    tensors, offset = [], 0
    for item in request["inputs"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _invalid(model, "every input needs a 'name'")
        name = item["name"]
        datatype, shape = item.get("datatype"), item.get("shape")
        if (
            not isinstance(datatype, str)
            or not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        ):
            raise _invalid(model, f"input '{name}' needs a 'datatype' string and a 'shape' list of integers")
        size = parameter(item.get("parameters"), "binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise _invalid(
                    model,
                    f"input '{name}': binary_data_size {size} runs past the {len(binary)} binary bytes of the request",
                )
            tensors.append(tensor_from_raw(model, name, datatype, shape, bytes(binary[offset : offset + size])))
            offset += size
        elif "data" in item:
            tensors.append(tensor_from_values(model, name, datatype, shape, item["data"]))
        else:
            raise _invalid(model, f"input '{name}' has neither 'data' nor binary_data_size")
    if offset != len(binary):
        raise _invalid(model, f"the request carries {len(binary)} binary bytes, but its inputs use {offset}")
    outputs = []
    for item in request.get("outputs") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _invalid(model, "every requested output needs a 'name'")
        outputs.append((item["name"], parameter(item.get("parameters"), "binary_data")))
    return tensors, outputs, request


def encode_rest_reply(
    model: V2Model, version: str, request: dict, tensors: Sequence[V2Tensor], binary: dict[str, bool]
) -> tuple[bytes, int | None]:
    """(body, JSON header length or None) of a v2 infer reply; outputs with `binary[name]` travel as binary
    data after the JSON header."""
    outputs, chunks = [], []
    for tensor in tensors:
        entry = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.data.shape)}
        if binary.get(tensor.name):
            raw = (
                join_bytes(tensor.data)
                if tensor.datatype == BYTES
                else np.ascontiguousarray(tensor.data).astype(tensor.data.dtype.newbyteorder("<")).tobytes()
            )
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif tensor.datatype == BYTES:
            entry["data"] = [
                item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
                for item in tensor.data.reshape(-1)
            ]
        else:
            entry["data"] = tensor.data.reshape(-1).tolist()
        outputs.append(entry)
    reply = {"model_name": model.name, "model_version": version, "outputs": outputs}
    if isinstance(request.get("id"), str):
        reply["id"] = request["id"]
    header = json.dumps(reply, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)


# ------------------------------------------------------------------------------------------------ gRPC


def grpc_request_tensors(model: str, request: "v2.ModelInferRequest") -> list[V2Tensor]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise _invalid(model, f"raw_input_contents holds {len(raw)} entries for {len(request.inputs)} inputs")
    tensors = []
    for index, item in enumerate(request.inputs):
        if raw:
            tensors.append(tensor_from_raw(model, item.name, item.datatype, item.shape, raw[index]))
            continue
        field = _CONTENTS.get(item.datatype)
        if field is None:
            _datatype(model, item.name, item.datatype)
            raise _invalid(model, f"input '{item.name}': {item.datatype} travels in raw_input_contents only")
        tensors.append(
            tensor_from_values(model, item.name, item.datatype, item.shape, list(getattr(item.contents, field)))
        )
    return tensors


def grpc_reply(
    model: V2Model, version: str, request: "v2.ModelInferRequest", tensors: Sequence[V2Tensor]
) -> "v2.ModelInferResponse":
    """The reply, every output in raw_output_contents (as Triton answers)."""
    reply = v2.ModelInferResponse(model_name=model.name, model_version=version, id=request.id)
    for tensor in tensors:
        reply.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.data.shape))
        reply.raw_output_contents.append(
            join_bytes(tensor.data)
            if tensor.datatype == BYTES
            else np.ascontiguousarray(tensor.data).astype(tensor.data.dtype.newbyteorder("<")).tobytes()
        )
    return reply
