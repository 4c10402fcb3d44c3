"""What clients see of an error: no absolute file paths, no memory addresses, no reprs of internal objects, in every
protocol; an unexpected exception's text not at all, but the request id the log line about it ends with."""

import grpc
import pytest
from serving_process import free_port

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import error_msg
from mindspore_serving.frontends.errors import Protocol, classic_error, grpc_error, http_error

PORT = free_port()  # a URL's port, kept as text (nothing listens)

LEAKY = (
    "servable 'nope' is not in the servable directory /usr/lib/servables; "
    "stage failed: <PIL.PngImagePlugin.PngImageFile image mode=L size=5x5 at 0x7F3A2B1C4D50>"
)
CLEAN = (
    "servable 'nope' is not in the servable directory servables; "
    "stage failed: <PIL.PngImagePlugin.PngImageFile image mode=L size=5x5>"
)


@pytest.fixture
def request_id():
    token = log.bind_request_id("req-42")
    yield "req-42"
    log.unbind_request_id(token)


@pytest.mark.parametrize(
    "text, clean",
    [
        (LEAKY, CLEAN),
        ("read /tmp/x/y.py failed", "read y.py failed"),
        ("cannot write in /tmp", "cannot write in tmp"),
        ("open '/usr/lib/python3/x.py', line 3", "open 'x.py', line 3"),
        ("file=/usr/lib/x.py:12", "file=x.py:12"),
        ("error msg: bad <_io.BytesIO object at 0x7f3a2b1c4d50>", "error msg: bad <_io.BytesIO object>"),
        ("<bound method A.f of <a.A object at 0x7f3a2b1c4d50>>", "<bound method A.f of <a.A object>>"),
        ("<function f at 0x7f3a2b1c4d50> failed", "<function f> failed"),
        ("handle 0x7f3a2b1c4d50 closed", "handle <address> closed"),
        # kept: URL paths, short hex numbers, texts without either
        (
            "Request /v2/models/add/infer and /model/add:add_common failed; see /ready",
            "Request /v2/models/add/infer and /model/add:add_common failed; see /ready",
        ),
        (f"see http://127.0.0.1:{PORT}/model/add", f"see http://127.0.0.1:{PORT}/model/add"),
        ("flags 0xff", "flags 0xff"),
        ("x1 should be float32, got int32", "x1 should be float32, got int32"),
    ],
    ids=lambda value: value.replace(str(PORT), "PORT"),  # the same ids in every pytest-xdist worker
)
def test_client_text_cuts_paths_reprs_and_addresses(text, clean):
    assert errors.client_text(text) == clean


def test_every_protocol_answers_the_clean_text():
    error = errors.ServableUnavailable(LEAKY)
    for protocol in Protocol:
        body = str(http_error(protocol, error)[1])
        assert "/usr/lib" not in body and "0x" not in body
    assert error_msg(error).error_msg.decode() == CLEAN
    assert grpc_error(error)[1].error_msg.decode() == CLEAN


def test_an_unexpected_exception_is_named_by_the_request_id_only(request_id):
    bug = TypeError("bad operand <_io.BytesIO object at 0x7f3a2b1c4d50> in /usr/lib/x.py")
    generic = "internal error (request req-42): see the server log"
    assert errors.message_of(bug) == generic
    for protocol in Protocol:
        assert generic in str(http_error(protocol, bug)[1])
    assert str(classic_error(bug)) == f"Serving Error: {generic}"
    assert grpc_error(bug)[0] is grpc.StatusCode.OK
    assert grpc_error(bug)[1].error_msg.decode() == f"Serving Error: {generic}"
    assert grpc_error(bug)[1].error_code == errors.SYSTEM_ERROR


def test_without_a_request_id_the_text_is_still_generic():
    assert errors.message_of(RuntimeError("at /usr/lib/x.py")) == "internal error: see the server log"
