"""MindSpore Serving's RESTful protocol without a web framework: URL, request body, reply body.

Request: `POST /model/<name>[/version/<v>]:<method>` (the key order is free), body
`{"instances": [{...}, ...]}` or `{"instances": {...}}`. Reply: always HTTP 200 `application/json`;
`{"instances": [{"<output>": value, ...} | {"error_msg": ...}, ...]}` or a top-level `{"error_msg": ...}`.

The reference checks, in this order: the HTTP method, the body (empty, too big, JSON syntax), the URL,
then the JSON rules; only errors of that last step carry the prefix "Parser request failed, ".
`parse_request` follows that order; every error is an `errors.InvalidInputs` with the final text.

The body's JSON rules (JSON values -> instance values) live in `common.restful_instances`, which a worker
also uses to read warm-up files.
"""

import base64
import re

import numpy as np
import orjson

from mindspore_serving.common import errors
from mindspore_serving.common.restful_instances import PARSE_PREFIX, load_json, parse_body, parse_instances  # noqa: F401  (parse_body, PARSE_PREFIX: re-exported)
from mindspore_serving.common.tensor_codec import is_error
from mindspore_serving.frontends.errors import Protocol, classic_error, http_error
from mindspore_serving.frontends.replies import global_error

CONTENT_TYPE = "application/json"
NOT_POST_ERROR = "http message only support POST right now"
MAX_VERSION = 2**32 - 1  # exclusive

_STOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")

# ------------------------------------------------------------------------------------------------ URL


def _url_query(url: str, key: str) -> str:
    """The text after the first `key` + one separator, up to the next '/' or ':'."""
    start = url.find(key)
    if start < 0:
        return ""
    begin = start + len(key) + 1
    ends = [pos for pos in (url.find("/", begin), url.find(":", begin)) if pos >= 0]
    return url[begin : min(ends)] if ends else url[begin:]


def parse_url(url: str) -> tuple[str, str, int]:
    """(servable_name, method_name, version) of a request target such as `/model/add/version/1:add_common`.

    Pass the raw request target (path and query as sent, not percent-decoded)."""
    servable_name = _url_query(url, "model")
    if not servable_name:
        raise errors.InvalidInputs("please check url, the keyword:[model] must contain.")
    version = 0
    if "version" in url:
        text = _url_query(url, "version")
        match = _STOL.match(text)
        if match is None:
            raise errors.InvalidInputs(
                f"please check url, the keyword:[version] value invalid, request version number {text}"
            )
        version = int(match.group(1))  # like std::stol: leading blanks, a sign, then digits; the rest is ignored
        if version < 0 or version >= MAX_VERSION:
            raise errors.InvalidInputs(f"please check url, version number range failed, request version number {text}")
    colon = url.find(":")
    method_name = url[colon + 1 :] if colon >= 0 else ""
    if not method_name:
        raise errors.InvalidInputs("please check url, the keyword:[service method] must contain.")
    return servable_name, method_name, version


def parse_request(url: str, body: bytes, max_bytes: int, http_method: str = "POST") -> tuple[str, str, int, list[dict]]:
    """(servable_name, method_name, version, instances), checking in the reference's order."""
    if http_method.upper() != "POST":
        raise errors.InvalidInputs(NOT_POST_ERROR)
    document = load_json(body, max_bytes)
    servable_name, method_name, version = parse_url(url)
    return servable_name, method_name, version, parse_instances(document)


# ---------------------------------------------------------------------------------------------- reply

_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS


class _ReplyError(Exception):
    pass


def _nested_empty(array: np.ndarray):
    """The reference's JSON for an array without elements: `[]` for a 0 in the last dim, null for a 0 before."""
    if array.ndim == 1:
        return []
    if array.shape[0] == 0:
        return None
    return [_nested_empty(array[i]) for i in range(array.shape[0])]


def _array_json(array: np.ndarray):
    if array.dtype.kind == "f" and array.dtype.itemsize < 8:
        # MindSpore Serving widens float16/float32 to double and prints the double's shortest form: 0.1 in float32
        # is 0.10000000149011612, its exact value
        array = array.astype(np.float64)
    if array.ndim == 0:
        return array[()] if array.dtype.isnative else array.item()
    if array.size == 0:
        return _nested_empty(array)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return np.ascontiguousarray(array)


def _value_json(value):
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise _ReplyError("reply data type is unknown")
        return _array_json(value)
    if isinstance(value, np.generic):
        return _array_json(np.asarray(value))
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(item, (str, bytes)) for item in value):
        return [_value_json(item) for item in value]
    raise _ReplyError(f"reply data type {type(value).__name__} is not supported")


def _instance_json(result):
    if is_error(result):
        return http_error(Protocol.MINDSPORE, errors.as_serving_error(result))[1]
    if not result:
        raise _ReplyError("reply instance items is empty")
    return {name: _value_json(value) for name, value in result.items()}


def encode_error(error: BaseException) -> bytes:
    """The body of a reply that fails the whole request with `error` (`classic_error` names an unexpected one)."""
    _, body = http_error(Protocol.MINDSPORE, classic_error(error))
    try:
        return orjson.dumps(body)
    except TypeError:  # e.g. lone surrogates from undecodable bytes
        return orjson.dumps({key: text.encode("utf-8", "replace").decode("utf-8") for key, text in body.items()})


def encode_results(results) -> bytes:
    """The reply body for `results`: one exception that failed the whole request, or per-instance results."""
    return encode_error(results) if isinstance(results, BaseException) else encode_reply(results)


def encode_reply(results) -> bytes:
    """The reply body for per-instance results (dicts of outputs or errors) or one global error: a top-level
    error_msg for a global error or when every instance failed with the same error, else one entry per
    instance, `{"error_msg": ..}` for the failed ones."""
    single = global_error(results)
    if single is not None:
        return encode_error(single if single.message else errors.make_error(single.code, "Predict failed"))
    try:
        document = {"instances": [_instance_json(result) for result in results]}
        return orjson.dumps(document, option=_DUMP_OPTIONS)
    except _ReplyError as err:
        return encode_error(errors.SystemError_(f"Failed to construct the response: {err}"))
    except (TypeError, ValueError):
        return encode_error(errors.SystemError_("Failed to construct the response"))
