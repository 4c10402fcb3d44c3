"""Front-end addresses refused with MindSpore Serving's texts (as tests/compat compares them with its own)."""

import pytest
from serving_process import free_port

from mindspore_serving.frontends.address import check_address, check_unix_address

PORT = free_port()  # only parsed here: nothing listens on it
TOO_BIG = f"127.0.0.1:{65535 + 1}"  # one past the largest port


@pytest.mark.parametrize(
    "address, text",
    [
        ("127.0.0.1", "Serving Error: The format of the Serving gRPC address '127.0.0.1' is illegal"),
        (f":{PORT}", f"Serving Error: Missing ip or port of the Serving gRPC address ':{PORT}'"),
        ("127.0.0.1:", "Serving Error: Missing ip or port of the Serving gRPC address '127.0.0.1:'"),
        ("127.0.0.1:ab", "Serving Error: The type of Serving gRPC address '127.0.0.1:ab' port is not a number"),
        (TOO_BIG, f"Serving Error: The port of the Serving gRPC address '{TOO_BIG}' is out of legal range [1 ~ 65535]"),
        (PORT, "Parameter 'address' should be str, but actually <class 'int'>"),
    ],
)
def test_a_bad_address_gets_mindspore_serving_s_text(address, text):
    with pytest.raises(RuntimeError) as info:
        check_address(address, "Serving gRPC")
    assert str(info.value) == text


def test_good_addresses_and_an_empty_unix_path():
    assert check_address(f"127.0.0.1:{PORT}", "RESTful server") == ("127.0.0.1", PORT)
    assert check_address(f"[::1]:{PORT}", "RESTful server") == ("::1", PORT)
    with pytest.raises(RuntimeError, match="^Serving Error: Empty grpc server unix domain socket address$"):
        check_unix_address("unix:")
