"""MindSpore Serving's RESTful request body as instances: JSON document -> list of {input name: value}.

Used by the RESTful front end (frontends/restful_codec.py) and by code that must read instances in the
request format without a front end, e.g. a worker reading a servable's warm-up files.

JSON values become instance values: int -> int32, float -> float32, bool -> bool (0-d arrays, or nested
lists -> arrays), str -> str, `{"b64": .., "type": .., "shape": ..}` -> typed array, str or bytes.
A str/bytes that arrives with a shape other than [] or [1] keeps it (`tensor_codec.ShapedStr/ShapedBytes`)
so the master's input check can reject it with the reference text. Every error is an `errors.InvalidInputs`;
those of the JSON rules carry the prefix "Parser request failed, ".
"""

import base64
import binascii
import itertools
import json
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import ShapedBytes, ShapedStr

PARSE_PREFIX = "Parser request failed, "

_Kind = np.dtype | type
"""The data type of a value: a NumPy dtype, or str / bytes."""

# b64 object "type" values; the error text names a type by its alphabetically first alias
B64_TYPES: dict[str, _Kind] = {
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "fp64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "bool": np.dtype(np.bool_),
    "str": str,
    "bytes": bytes,
}
_TYPE_NAMES: dict[_Kind, str] = {}
for _alias in sorted(B64_TYPES):
    _TYPE_NAMES.setdefault(B64_TYPES[_alias], _alias)


class _ParseError(Exception):
    """A JSON-rule error; parse_instances adds the prefix."""


# ----------------------------------------------------------------------------------------------- body


def load_json(body: bytes, max_bytes: int) -> Any:
    """The JSON document of a request body: "http message invalid" when empty, "http message is bigger than
    <max_bytes>", "Illegal JSON format.<detail>". A key that appears twice keeps its last value, as in MindSpore
    Serving's parser."""
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    if not body:
        raise errors.InvalidInputs("http message invalid")
    if len(body) > max_bytes:
        raise errors.InvalidInputs(f"http message is bigger than {max_bytes}")
    try:
        return orjson.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise errors.InvalidInputs(f"Illegal JSON format.{err}") from None


def parse_instances(document: Any) -> list[dict]:
    """The instances of a parsed request document, following MindSpore Serving's JSON rules."""
    try:
        return _parse_instances(document)
    except _ParseError as err:
        raise errors.InvalidInputs(PARSE_PREFIX + str(err)) from None


def parse_body(body: bytes, max_bytes: int) -> list[dict]:
    return parse_instances(load_json(body, max_bytes))


def _parse_instances(document: Any) -> list[dict]:
    count = int(isinstance(document, dict) and "instances" in document)
    if count != 1:
        raise _ParseError(f"key 'instances' expects to exist once, but actually {count} times")
    instances = document["instances"]
    if isinstance(instances, dict):
        if not instances:
            raise _ParseError("json object, value is empty")
        return [_parse_instance(instances)]
    if not isinstance(instances, list):
        raise _ParseError("instances no key mode is not supported")
    if not instances:
        raise _ParseError("instances value is array type, but no value")
    if not isinstance(instances[0], dict):
        raise _ParseError("instances no key mode is not supported")
    result = []
    for instance in instances:
        if not isinstance(instance, dict):
            raise _ParseError("json array, instance is not object type")
        if not instance:
            raise _ParseError("json array, instance is object type, but no value")
        result.append(_parse_instance(instance))
    return result


def _parse_instance(instance: dict) -> dict:
    values = {}
    for key in sorted(instance):  # the reference walks keys in sorted order: the first error wins
        if not key:
            raise _ParseError("string key is empty")
        values[key] = _parse_item(instance[key])
    return values


def _parse_item(value: Any) -> Any:
    if isinstance(value, dict):
        return _parse_object(value)
    if isinstance(value, list):
        return _parse_array(value)
    return _parse_scalar(value)


def _wrap_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _parse_scalar(value: object) -> np.ndarray | str:
    if isinstance(value, bool):
        return np.array(value, np.bool_)
    if isinstance(value, int):
        return np.array(_wrap_int32(value), np.int32)
    if isinstance(value, float):
        with np.errstate(over="ignore"):
            return np.array(value, np.float32)
    if isinstance(value, str):
        return value
    if value is None:
        raise _ParseError("json value is null, it is not supported")
    raise _ParseError("json value type is unregistered")


def _dump(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _is_unsigned(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_object(obj: dict) -> None:
    if not obj:
        raise _ParseError("json object, value is empty")
    if len(obj) > 3:
        raise _ParseError("json object, items size is more than 3, only support specified ['b64', 'type', 'shape']")
    b64_count = 0
    for key in sorted(obj):
        value = obj[key]
        if key == "b64":
            b64_count += 1
        elif key == "type":
            if not isinstance(value, str):
                raise _ParseError("json object, key is 'type', value should be string type")
            if value not in B64_TYPES:
                raise _ParseError(f"json object, specified type:'{value}' is illegal")
        elif key == "shape":
            if not isinstance(value, list):
                raise _ParseError("json object, key is 'shape', value should be array type")
            zero_before = False
            for item in value:
                if zero_before:
                    raise _ParseError(f"json object, key is 'shape', invalid shape value {_dump(value)}")
                if not _is_unsigned(item):
                    raise _ParseError("json object, key is 'shape', array value should be unsigned integer")
                if _wrap_int32(item) < 0:
                    raise _ParseError(
                        "json object, key is 'shape', number value should not be negative number, "
                        f"shape value: {_dump(value)}"
                    )
                zero_before = zero_before or item == 0
        else:
            raise _ParseError(f"json object, key is not ['b64', 'type', 'shape'], fail key:{key}")
    if b64_count != 1:
        raise _ParseError("json object, 'b64' should be specified only one time")


def _object_type(obj: object) -> _Kind | None:
    """The type a b64 object declares (bytes by default), or None when it is not a known type."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("type", "bytes")
    return B64_TYPES.get(name) if isinstance(name, str) else None


def _b64decode(value: object) -> bytes:
    if not isinstance(value, str):
        raise _ParseError("get scalar data failed, type is string, but json is not string type")
    if len(value) % 4 != 0:
        raise _ParseError(f"'{value}' is illegal b64 encode string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _ParseError(f"'{value}' is illegal b64 encode string") from None


def _string_value(kind: _Kind, raw: bytes, shape: list[int]) -> str | bytes | ShapedStr | ShapedBytes:
    if kind is str:
        text = raw.decode("utf-8", "surrogateescape")
        return text if shape in ([], [1]) else ShapedStr(text, shape)
    return raw if shape in ([], [1]) else ShapedBytes(raw, shape)


def _parse_object(obj: dict) -> np.ndarray | str | bytes | ShapedStr | ShapedBytes:
    _check_object(obj)
    kind = _object_type(obj)
    shape = [int(dim) for dim in obj.get("shape", [])]
    count = math.prod(shape)
    if kind in (str, bytes) and count != 1:
        raise _ParseError(
            "json object, only support scalar when data type is string or bytes, please check 'type' or 'shape'"
        )
    raw = _b64decode(obj["b64"])
    if not isinstance(kind, np.dtype):  # str or bytes: _check_object refused the unknown types
        assert kind is not None
        return _string_value(kind, raw, shape)
    if len(raw) != kind.itemsize * count:
        raise _ParseError(
            f"size is not matched, decode base64 size:{len(raw)}; Given info: type:{_TYPE_NAMES[kind]}; "
            f"type size:{kind.itemsize}; element nums:{count}"
        )
    return np.frombuffer(bytearray(raw), kind).reshape(shape)


_LEAF_ERROR = "json array, data should be number, bool, string or bytes"
_NOT_EQUAL = "json array, elements type is not equal"


def _leaf_kind(leaf: object) -> _Kind | None:
    """The data type the first leaf of an array gives the whole array, None when unknown."""
    if isinstance(leaf, bool):
        return np.dtype(np.bool_)
    if isinstance(leaf, int):
        return np.dtype(np.int32)
    if isinstance(leaf, float):
        return np.dtype(np.float32)
    if isinstance(leaf, str):
        return str
    if isinstance(leaf, dict):
        return _object_type(leaf)
    return None


def _leaf_matches(leaf: object, kind: _Kind) -> bool:
    if isinstance(leaf, bool):
        return bool(kind == np.dtype(np.bool_))
    if isinstance(leaf, int):
        return bool(kind == np.dtype(np.int32))
    if isinstance(leaf, float):
        return bool(kind == np.dtype(np.float32))
    return kind is str  # a str leaf


_PY_TYPE: dict[_Kind, type] = {np.dtype(np.bool_): bool, np.dtype(np.int32): int, np.dtype(np.float32): float}


def _check_leaves(row: list, kind: _Kind) -> None:
    # Fast path: one C-level pass over the row's element types.
    if set(map(type, row)) == {_PY_TYPE.get(kind, str)}:
        return
    for leaf in row:
        if not isinstance(leaf, (bool, int, float, str)):
            raise _ParseError(_LEAF_ERROR)
        if not _leaf_matches(leaf, kind):
            raise _ParseError(_NOT_EQUAL)


_FAST_KINDS = {float: np.dtype(np.float32), bool: np.dtype(np.bool_)}


def _plain_array(value: list) -> np.ndarray | None:
    """The array of a list, or a list of equally long lists, whose leaves are all floats (or all bools): most
    requests, read at C speed. None for anything else, which the general path parses and words the errors of."""
    head = value[0]
    if type(head) is list:  # pylint: disable=unidiomatic-typecheck  (a subclass goes the general way)
        if not head:
            return None
        width = len(head)
        for row in value:
            if type(row) is not list or len(row) != width:  # pylint: disable=unidiomatic-typecheck
                return None
        kind = type(head[0])
        leaves: Iterable[object] = itertools.chain.from_iterable(value)
    else:
        kind = type(head)
        leaves = value
    dtype = _FAST_KINDS.get(kind)
    if dtype is None or set(map(type, leaves)) != {kind}:
        return None
    with np.errstate(over="ignore"):  # beyond float32's range: inf, as the reference
        return np.array(value, dtype)


def _parse_array(value: list) -> np.ndarray | str | bytes | ShapedStr | ShapedBytes:
    if value:
        array = _plain_array(value)
        if array is not None:
            return array
    shape = []
    node = value
    while isinstance(node, list) and node:
        shape.append(len(node))
        node = node[0]
    if not shape:
        raise _ParseError("json array, shape is empty")
    is_object = isinstance(node, dict)
    kind = None if isinstance(node, list) else _leaf_kind(node)
    if kind is None:
        raise _ParseError("json array, data type is unknown")
    is_string = kind in (str, bytes)
    if is_string and math.prod(shape) != 1:
        raise _ParseError("json array, string or bytes type only support one item")
    if is_object and not is_string:
        raise _ParseError("json array, item is object type, object only support string or bytes type")

    leaves: list = []

    def walk(node: object, depth: int) -> None:
        if not isinstance(node, list):
            raise _ParseError("invalid json array: json type is not array")
        if len(node) != shape[depth]:
            raise _ParseError(
                f"invalid json array: json size is {len(node)}, the dim {depth} expected to be {shape[depth]}"
            )
        if depth + 1 < len(shape):
            for child in node:
                walk(child, depth + 1)
        elif is_object:
            for leaf in node:
                if _object_type(leaf) not in (str, bytes):
                    raise _ParseError("json array, object type only support string or bytes type")
                if _object_type(leaf) is not kind:
                    raise _ParseError(_NOT_EQUAL)
                leaves.append(_b64decode(leaf.get("b64")))
        else:
            _check_leaves(node, kind)
            leaves.extend(node)

    walk(value, 0)
    if is_string:
        raw = leaves[0]
        if kind is str and not is_object:
            return raw if shape == [1] else ShapedStr(raw, shape)
        return _string_value(kind, raw, shape)
    if kind == np.dtype(np.int32):
        try:
            array = np.array(leaves, np.int64).astype(np.int32)
        except OverflowError:
            array = np.array([_wrap_int32(leaf) for leaf in leaves], np.int32)
    else:
        with np.errstate(over="ignore"):
            array = np.array(leaves, kind)
    return array.reshape(shape)
