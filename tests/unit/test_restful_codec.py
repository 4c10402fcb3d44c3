"""MindSpore Serving's RESTful protocol: URL rules, JSON rules with their exact texts, reply encoding."""

import base64
import json

import numpy as np
import pytest

from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import ShapedBytes, ShapedStr
from mindspore_serving.frontends import restful_codec as rc

PREFIX = "Parser request failed, "


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def body(document) -> bytes:
    return json.dumps(document).encode()


def parse(document):
    return rc.parse_body(body(document), 1 << 20)


def parse_value(value):
    return parse({"instances": [{"x": value}]})[0]["x"]


def parse_error(document) -> str:
    with pytest.raises(errors.InvalidInputs) as info:
        rc.parse_body(document if isinstance(document, bytes) else body(document), 1 << 20)
    assert info.value.code == errors.INVALID_INPUTS
    return str(info.value)


def value_error(value) -> str:
    return parse_error({"instances": [{"x": value}]})


# ------------------------------------------------------------------------------------------------- URL


@pytest.mark.parametrize(
    "url,expected",
    [
        ("/model/add:add_common", ("add", "add_common", 0)),
        ("/model/add/version/1:add_common", ("add", "add_common", 1)),
        ("/model/add/version/0:add_common", ("add", "add_common", 0)),
        ("/version/2/model/add:add_common", ("add", "add_common", 2)),
        ("/model/add/version/4294967294:m", ("add", "m", 4294967294)),
        ("/model/add:a:b", ("add", "a:b", 0)),
        ("/model/add/version/ 3:m", ("add", "m", 3)),  # std::stol skips leading blanks
    ],
)
def test_parse_url(url, expected):
    assert rc.parse_url(url) == expected


@pytest.mark.parametrize(
    "url,text",
    [
        ("/x/:add_common", "please check url, the keyword:[model] must contain."),
        ("/model/:add_common", "please check url, the keyword:[model] must contain."),
        ("/model/add", "please check url, the keyword:[service method] must contain."),
        ("/model/add:", "please check url, the keyword:[service method] must contain."),
        ("/model/add/version/-1:m", "please check url, version number range failed, request version number -1"),
        (
            "/model/add/version/4294967295:m",
            "please check url, version number range failed, request version number 4294967295",
        ),
        (
            "/model/add/version/99999999999999999999999:m",
            "please check url, version number range failed, request version number 99999999999999999999999",
        ),
        (
            "/model/add/version/abc:m",
            "please check url, the keyword:[version] value invalid, request version number abc",
        ),
        ("/model/add/version/:m", "please check url, the keyword:[version] value invalid, request version number "),
    ],
)
def test_parse_url_errors(url, text):
    with pytest.raises(errors.InvalidInputs) as info:
        rc.parse_url(url)
    assert str(info.value) == text


# ------------------------------------------------------------------------------------------------ body


def test_body_size_and_syntax_errors_have_no_prefix():
    assert parse_error(b"") == "http message invalid"
    with pytest.raises(errors.InvalidInputs, match="^http message is bigger than 10$"):
        rc.parse_body(b'{"instances": [{"x": 1}]}', 10)
    assert rc.parse_body(b'{"instances":{"x":1}}', 21)  # exactly the limit passes
    assert parse_error(b"{abc").startswith("Illegal JSON format.")
    assert parse_error(b'{"instances": NaN}').startswith("Illegal JSON format.")
    assert parse_error(b'{"instances": [{"x": 1}], "instances": NaN}').startswith("Illegal JSON format.")


@pytest.mark.parametrize(
    "document,text",
    [
        ({"a": 1}, "key 'instances' expects to exist once, but actually 0 times"),
        ([{"instances": 1}], "key 'instances' expects to exist once, but actually 0 times"),
        ({"instances": []}, "instances value is array type, but no value"),
        ({"instances": {}}, "json object, value is empty"),
        ({"instances": [{}]}, "json array, instance is object type, but no value"),
        ({"instances": 1}, "instances no key mode is not supported"),
        ({"instances": "abc"}, "instances no key mode is not supported"),
        ({"instances": [1, 2]}, "instances no key mode is not supported"),
        ({"instances": [{"x": 1}, 2]}, "json array, instance is not object type"),
        ({"instances": [{"x": 1}, {}]}, "json array, instance is object type, but no value"),
        ({"instances": {"x": None}}, "json value is null, it is not supported"),
        ({"instances": {"": 1}}, "string key is empty"),
    ],
)
def test_request_shape_errors(document, text):
    assert parse_error(document) == PREFIX + text


def test_a_key_given_twice_keeps_its_last_value():
    """As MindSpore Serving's JSON parser: `{"instances": [...], "instances": []}` is a document of empty instances."""
    document = b'{"instances": [{"x": 1}], "instances": []}'
    assert parse_error(document) == PREFIX + "instances value is array type, but no value"
    assert rc.parse_body(b'{"instances": [{"x": 1}], "instances": [{"x": 2}]}', 1000)[0]["x"] == 2
    # the word inside values does not matter
    result = rc.parse_body(b'{"instances": [{"x": "\\"instances\\""}]}', 1000)
    assert result == [{"x": '"instances"'}]


def test_single_object_and_list_forms():
    single = parse({"instances": {"a": 1, "b": 2.5}})
    assert len(single) == 1 and set(single[0]) == {"a", "b"}
    many = parse({"instances": [{"a": 1}, {"a": 2}, {"a": 3}]})
    assert [int(item["a"]) for item in many] == [1, 2, 3]


# ------------------------------------------------------------------------------------------ JSON values


def test_json_scalars():
    value = parse_value(3)
    assert isinstance(value, np.ndarray) and value.dtype == np.int32 and value.shape == () and value == 3
    value = parse_value(2.5)
    assert value.dtype == np.float32 and value.shape == () and value == 2.5
    value = parse_value(True)
    assert value.dtype == np.bool_ and value.shape == () and bool(value) is True
    assert parse_value("abc") == "abc" and type(parse_value("abc")) is str
    assert parse_value(-5) == -5
    assert parse_value(2**32 + 7) == 7  # the reference stores ints as int32
    assert parse_value(1e300) == np.inf


def test_json_arrays():
    value = parse_value([[1, 2], [3, 4]])
    assert value.dtype == np.int32 and value.shape == (2, 2)
    np.testing.assert_array_equal(value, [[1, 2], [3, 4]])
    value[0, 0] = 9  # writable
    value = parse_value([1.5, 2.0])
    assert value.dtype == np.float32 and value.tolist() == [1.5, 2.0]
    value = parse_value([[[True], [False]]])
    assert value.dtype == np.bool_ and value.shape == (1, 2, 1)
    assert parse_value([-1, 2**40]).tolist() == [-1, 0]
    # like the reference's JSON parser, integers beyond 64 bits are read as floats
    assert value_error([2**70, 1]) == PREFIX + "json array, elements type is not equal"
    assert parse_value([2**63, 1]).tolist() == [0, 1]
    value = parse_value(["abc"])
    assert value == "abc" and type(value) is str
    value = parse_value([["abc"]])
    assert isinstance(value, ShapedStr) and value == "abc" and value.dims == (1, 1)


def test_float_and_bool_arrays_read_whole_match_the_general_walk():
    """Flat lists and lists of equal rows of floats or bools are read in one numpy call; the same values in a
    deeper nesting take the general walk: both give the same arrays."""
    for flat, nested in [([1.5, -2.0, 1e300], [[[1.5], [-2.0], [1e300]]]), ([True, False], [[[True], [False]]])]:
        value = parse_value(flat)
        assert value.dtype == (np.bool_ if isinstance(flat[0], bool) else np.float32) and value.flags.writeable
        np.testing.assert_array_equal(value, parse_value(nested).reshape(-1))
    value = parse_value([[1.0, 2.0], [3.0, 4.0]])
    assert value.dtype == np.float32 and value.shape == (2, 2) and value[1, 0] == 3.0
    assert parse_value([1e300])[0] == np.inf  # beyond float32: inf, as the reference


@pytest.mark.parametrize(
    "value,text",
    [
        ([[1.0, 2.0], [3.0]], "invalid json array: json size is 1, the dim 1 expected to be 2"),
        ([[1.0, 2.0], 3.0], "invalid json array: json type is not array"),
        ([[1.0, 2.0], [3.0, 4]], "json array, elements type is not equal"),
        ([[True, False], [True, 0.5]], "json array, elements type is not equal"),
        ([1.0, [2.0]], "json array, data should be number, bool, string or bytes"),
        ([1.0, None], "json array, data should be number, bool, string or bytes"),
    ],
)
def test_float_array_errors_are_worded_by_the_general_walk(value, text):
    assert value_error(value) == PREFIX + text


@pytest.mark.parametrize(
    "value,text",
    [
        ([], "json array, shape is empty"),
        ([[]], "json array, data type is unknown"),
        ([None], "json array, data type is unknown"),
        ([[1, 2], [3]], "invalid json array: json size is 1, the dim 1 expected to be 2"),
        ([[1, 2], [3, 4, 5]], "invalid json array: json size is 3, the dim 1 expected to be 2"),
        ([[1, 2], 3], "invalid json array: json type is not array"),
        ([1, [2]], "json array, data should be number, bool, string or bytes"),
        ([1, None], "json array, data should be number, bool, string or bytes"),
        ([1, {"b64": "AA=="}], "json array, data should be number, bool, string or bytes"),
        ([1, 2.0], "json array, elements type is not equal"),
        ([1.0, 2], "json array, elements type is not equal"),
        ([True, 1], "json array, elements type is not equal"),
        ([1, True], "json array, elements type is not equal"),
        ([1, "a"], "json array, elements type is not equal"),
        (["a", "b"], "json array, string or bytes type only support one item"),
        ([["a"], ["b"]], "json array, string or bytes type only support one item"),
        ([{"b64": "AA=="}, {"b64": "AA=="}], "json array, string or bytes type only support one item"),
        (
            [{"b64": "AAAA", "type": "int32"}],
            "json array, item is object type, object only support string or bytes type",
        ),
        ([{"b64": "AAAA", "type": "nope"}], "json array, data type is unknown"),
        ([{"b64": 1}], "get scalar data failed, type is string, but json is not string type"),
        ([{"b64": "abc"}], "'abc' is illegal b64 encode string"),
    ],
)
def test_json_array_errors(value, text):
    assert value_error(value) == PREFIX + text


def test_b64_in_arrays():
    assert parse_value([{"b64": b64(b"ab")}]) == b"ab"
    assert parse_value([{"b64": b64(b"ab"), "type": "str"}]) == "ab"
    value = parse_value([[{"b64": b64(b"ab")}]])
    assert isinstance(value, ShapedBytes) and value.dims == (1, 1)


# ------------------------------------------------------------------------------------------ b64 objects

B64_NUMERIC = [
    ("int8", np.int8),
    ("int16", np.int16),
    ("int32", np.int32),
    ("int64", np.int64),
    ("uint8", np.uint8),
    ("uint16", np.uint16),
    ("uint32", np.uint32),
    ("uint64", np.uint64),
    ("fp16", np.float16),
    ("fp32", np.float32),
    ("fp64", np.float64),
    ("float16", np.float16),
    ("float32", np.float32),
    ("float64", np.float64),
    ("bool", np.bool_),
]


@pytest.mark.parametrize("type_name,dtype", B64_NUMERIC)
@pytest.mark.parametrize("shape", [None, [], [1], [3], [2, 3], [0], [2, 0]])
def test_b64_numeric(type_name, dtype, shape):
    real_shape = () if shape is None else tuple(shape)
    data = (np.arange(int(np.prod(real_shape))) % 2).astype(dtype).reshape(real_shape)
    obj = {"b64": b64(data.tobytes()), "type": type_name}
    if shape is not None:
        obj["shape"] = shape
    value = parse_value(obj)
    assert value.dtype == np.dtype(dtype) and value.shape == real_shape
    np.testing.assert_array_equal(value, data)
    value[...] = 0  # writable


def test_b64_bool_from_int8_bytes():
    assert bool(parse_value({"b64": b64(np.int8(1).tobytes()), "type": "bool"})) is True


@pytest.mark.parametrize("shape", [None, [], [1]])
def test_b64_str_and_bytes(shape):
    obj = {"b64": b64(b"ABC")}
    if shape is not None:
        obj["shape"] = shape
    value = parse_value(obj)
    assert value == b"ABC" and type(value) is bytes
    value = parse_value({**obj, "type": "str"})
    assert value == "ABC" and type(value) is str
    assert parse_value({"b64": "", "type": "bytes"}) == b""
    assert parse_value({"b64": "", "type": "str"}) == ""


def test_b64_str_with_shape_1_1_keeps_it():
    value = parse_value({"b64": b64(b"a"), "type": "str", "shape": [1, 1]})
    assert isinstance(value, ShapedStr) and value.dims == (1, 1)


@pytest.mark.parametrize(
    "obj,text",
    [
        ({}, "json object, value is empty"),
        (
            {"b64": "", "type": "int8", "shape": [1], "x": 1},
            "json object, items size is more than 3, only support specified ['b64', 'type', 'shape']",
        ),
        ({"b64": "", "foo": 1}, "json object, key is not ['b64', 'type', 'shape'], fail key:foo"),
        ({"type": "int32"}, "json object, 'b64' should be specified only one time"),
        ({"b64": "", "type": 1}, "json object, key is 'type', value should be string type"),
        ({"b64": "", "type": "dtype_unknow"}, "json object, specified type:'dtype_unknow' is illegal"),
        ({"b64": "", "type": ""}, "json object, specified type:'' is illegal"),
        ({"b64": "", "type": "int32", "shape": "x"}, "json object, key is 'shape', value should be array type"),
        (
            {"b64": "", "type": "int32", "shape": [1, 2, 0, 1]},
            "json object, key is 'shape', invalid shape value [1,2,0,1]",
        ),
        (
            {"b64": "", "type": "fp16", "shape": [[]]},
            "json object, key is 'shape', array value should be unsigned integer",
        ),
        (
            {"b64": "", "type": "fp16", "shape": ["abc"]},
            "json object, key is 'shape', array value should be unsigned integer",
        ),
        (
            {"b64": "", "type": "fp16", "shape": [1.1]},
            "json object, key is 'shape', array value should be unsigned integer",
        ),
        (
            {"b64": "", "type": "fp16", "shape": [-1]},
            "json object, key is 'shape', array value should be unsigned integer",
        ),
        (
            {"b64": "", "type": "fp16", "shape": [True]},
            "json object, key is 'shape', array value should be unsigned integer",
        ),
        (
            {"b64": "", "type": "fp16", "shape": [2**31]},
            "json object, key is 'shape', number value should not be negative number, shape value: [2147483648]",
        ),
        (
            {"b64": b64(b"ABC"), "type": "str", "shape": [2]},
            "json object, only support scalar when data type is string or bytes, please check 'type' or 'shape'",
        ),
        (
            {"b64": b64(b"ABC"), "type": "str", "shape": [0]},
            "json object, only support scalar when data type is string or bytes, please check 'type' or 'shape'",
        ),
        (
            {"b64": b64(b"ABC"), "shape": [0]},
            "json object, only support scalar when data type is string or bytes, please check 'type' or 'shape'",
        ),
        ({"b64": 123}, "get scalar data failed, type is string, but json is not string type"),
        ({"b64": None, "type": "int8"}, "get scalar data failed, type is string, but json is not string type"),
        ({"b64": "abc", "type": "int8"}, "'abc' is illegal b64 encode string"),
        ({"b64": "ab$=", "type": "int8"}, "'ab$=' is illegal b64 encode string"),
        (
            {"b64": "", "type": "fp16"},
            "size is not matched, decode base64 size:0; Given info: type:float16; type size:2; element nums:1",
        ),
        (
            {"b64": b64(np.zeros((2, 2), np.float16).tobytes()), "type": "fp16", "shape": [3, 3]},
            "size is not matched, decode base64 size:8; Given info: type:float16; type size:2; element nums:9",
        ),
        (
            {"b64": b64(np.zeros(2, np.float32).tobytes()), "type": "fp32", "shape": [1]},
            "size is not matched, decode base64 size:8; Given info: type:float32; type size:4; element nums:1",
        ),
        (
            {"b64": b64(b"a"), "type": "int32"},
            "size is not matched, decode base64 size:1; Given info: type:int32; type size:4; element nums:1",
        ),
        (
            {"b64": b64(b"ab"), "type": "bool"},
            "size is not matched, decode base64 size:2; Given info: type:bool; type size:1; element nums:1",
        ),
    ],
)
def test_b64_errors(obj, text):
    assert value_error(obj) == PREFIX + text


def test_first_error_in_sorted_key_order():
    # the reference walks keys sorted: "shape" is checked before "type"
    text = value_error({"b64": "", "type": "bad", "shape": "bad"})
    assert text == PREFIX + "json object, key is 'shape', value should be array type"
    text = parse_error({"instances": {"b": None, "a": []}})
    assert text == PREFIX + "json array, shape is empty"


# ------------------------------------------------------------------------------------------- request


def test_parse_request_checks_in_reference_order():
    good = b'{"instances": [{"x": 1}]}'
    assert rc.parse_request("/model/add:m", good, 100)[:3] == ("add", "m", 0)
    with pytest.raises(errors.InvalidInputs, match="^http message only support POST right now$"):
        rc.parse_request("/model/add:m", good, 100, http_method="GET")
    with pytest.raises(errors.InvalidInputs, match="^Illegal JSON format"):
        rc.parse_request("/bad", b"{", 100)
    with pytest.raises(errors.InvalidInputs, match=r"^please check url, the keyword:\[model\] must contain.$"):
        rc.parse_request("/bad", b'{"instances": []}', 100)
    with pytest.raises(errors.InvalidInputs, match="^Parser request failed, instances value is array type"):
        rc.parse_request("/model/add:m", b'{"instances": []}', 100)


# ------------------------------------------------------------------------------------------------ reply


def decode(reply: bytes):
    return json.loads(reply)


def test_reply_tensors_to_json():
    outputs = {
        "scalar_f32": np.array(1.5, np.float32),
        "scalar_i64": np.array(-3, np.int64),
        "scalar_bool": np.array(True),
        "f16": np.array([[0.5, 1.5]], np.float16),
        "u64": np.array([2**64 - 1], np.uint64),
        "bools": np.array([True, False]),
        "i8": np.arange(6, dtype=np.int8).reshape(2, 3),
        "trailing0": np.zeros((2, 0), np.float32),
        "empty": np.zeros((0,), np.int32),
        "leading0": np.zeros((0, 2), np.int32),
        "text": "abc",
        "raw": b"\x00\x01",
        "f32": np.array([0.1], np.float32),
        "noncontig": np.arange(6, dtype=np.int32).reshape(2, 3)[:, ::2],
        "big_endian": np.array([1, 2], ">i4"),
        "np_scalar": np.float64(2.5),
    }
    reply = decode(rc.encode_reply([outputs]))
    item = reply["instances"][0]
    assert item["scalar_f32"] == 1.5 and item["scalar_i64"] == -3 and item["scalar_bool"] is True
    assert item["f16"] == [[0.5, 1.5]]
    assert item["u64"] == [2**64 - 1]
    assert item["bools"] == [True, False]
    assert item["i8"] == [[0, 1, 2], [3, 4, 5]]
    assert item["trailing0"] == [[], []] and item["empty"] == [] and item["leading0"] is None
    assert item["text"] == "abc" and item["raw"] == {"b64": b64(b"\x00\x01")}
    assert abs(item["f32"][0] - 0.1) < 1e-6
    assert item["noncontig"] == [[0, 2], [3, 5]] and item["big_endian"] == [1, 2]
    assert item["np_scalar"] == 2.5


def test_reply_rules():
    ok = {"y": np.array([1.0], np.float32)}
    assert decode(rc.encode_reply([ok, ok])) == {"instances": [{"y": [1.0]}, {"y": [1.0]}]}
    # per-instance errors
    reply = decode(rc.encode_reply([ok, errors.InvalidInputs("bad")]))
    assert reply == {"instances": [{"y": [1.0]}, {"error_msg": "bad"}]}
    reply = decode(rc.encode_reply([errors.Failed("a"), errors.Failed("b")]))
    assert reply == {"instances": [{"error_msg": "a"}, {"error_msg": "b"}]}
    # every instance failed with the same error, or a global error: top-level error_msg
    assert decode(rc.encode_reply([errors.Failed("Preprocess Failed"), errors.Failed("Preprocess Failed")])) == {
        "error_msg": "Preprocess Failed"
    }
    assert decode(rc.encode_reply([errors.Failed("x")])) == {"error_msg": "x"}
    assert decode(rc.encode_reply(errors.ServableUnavailable("servable is not available"))) == {
        "error_msg": "servable is not available"
    }
    # an instance without outputs cannot be encoded
    assert decode(rc.encode_reply([ok, {}])) == {
        "error_msg": "Failed to construct the response: reply instance items is empty"
    }
    assert decode(rc.encode_reply([{"y": np.array(["a"])}]))["error_msg"].startswith("Failed to construct the response")


def test_encode_error():
    assert decode(rc.encode_error(errors.InvalidInputs("please check url"))) == {"error_msg": "please check url"}
    assert decode(rc.encode_error(errors.Failed("bad \udcff byte")))["error_msg"].startswith("bad ")
    generic = "Serving Error: internal error: see the server log"  # an unexpected exception's text stays in the log
    assert decode(rc.encode_error(KeyError("bug"))) == {"error_msg": generic}
    assert rc.CONTENT_TYPE == "application/json"


def test_round_trip_through_json():
    instances = parse({"instances": [{"x": [[1.5, 2.5]], "s": "hi", "b": {"b64": b64(b"\x01\x02")}}]})
    reply = decode(rc.encode_reply(instances))
    assert reply == {"instances": [{"x": [[1.5, 2.5]], "s": "hi", "b": {"b64": b64(b"\x01\x02")}}]}


def test_float32_outputs_print_as_the_doubles_they_are():
    """MindSpore Serving widens float16/float32 outputs to double: 0.1 in float32 prints 0.10000000149011612."""
    reply = json.loads(
        rc.encode_reply(
            [{"y": np.array([0.1, 123456.789], np.float32), "s": np.float32(0.1), "h": np.array(0.1, np.float16)}]
        )
    )
    assert reply == {
        "instances": [{"h": 0.0999755859375, "s": 0.10000000149011612, "y": [0.10000000149011612, 123456.7890625]}]
    }
