"""What clients see of an error: no absolute file paths, no memory addresses, in every protocol; the log keeps
the details."""
import grpc

from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import error_msg
from mindspore_serving.frontends.errors import Protocol, grpc_error, http_error

LEAKY = ("servable 'nope' is not in the servable directory /usr/lib/servables; "
         "stage failed: <PIL.PngImagePlugin.PngImageFile image mode=L size=5x5 at 0x7F3A2B1C4D50>")
CLEAN = "servable 'nope' is not in the servable directory servables; " \
        "stage failed: <PIL.PngImagePlugin.PngImageFile image mode=L size=5x5 at 0x...>"


def test_paths_and_addresses_are_cut_and_url_paths_kept():
    assert errors.client_text(LEAKY) == CLEAN
    kept = "Request /v2/models/add/infer and /model/add:add_common failed; see /ready"
    assert errors.client_text(kept) == kept
    assert errors.client_text("read /tmp/x/y.py failed") == "read y.py failed"


def test_every_protocol_answers_the_clean_text():
    error = errors.ServableUnavailable(LEAKY)
    for protocol in Protocol:
        assert "/usr/lib" not in str(http_error(protocol, error)[1]) and "0x7F" not in str(http_error(protocol, error)[1])
    assert error_msg(error).error_msg.decode() == CLEAN
    assert grpc_error(error)[1].error_msg.decode() == CLEAN
    assert grpc_error(RuntimeError("at /usr/lib/x.py"))[0] is grpc.StatusCode.OK
    assert grpc_error(RuntimeError("at /usr/lib/x.py"))[1].error_msg.decode() == "Serving Error: at x.py"
