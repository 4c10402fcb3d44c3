"""Front-end addresses refused with MindSpore Serving's texts (as tests/compat compares them with its own)."""

import pytest

from mindspore_serving.frontends.address import check_address, check_unix_address


@pytest.mark.parametrize(
    "address, text",
    [
        ("127.0.0.1", "Serving Error: The format of the Serving gRPC address '127.0.0.1' is illegal"),
        (":5500", "Serving Error: Missing ip or port of the Serving gRPC address ':5500'"),
        ("127.0.0.1:", "Serving Error: Missing ip or port of the Serving gRPC address '127.0.0.1:'"),
        ("127.0.0.1:ab", "Serving Error: The type of Serving gRPC address '127.0.0.1:ab' port is not a number"),
        (
            "127.0.0.1:70000",
            "Serving Error: The port of the Serving gRPC address '127.0.0.1:70000' is out of legal range [1 ~ 65535]",
        ),
        (5500, "Parameter 'address' should be str, but actually <class 'int'>"),
    ],
)
def test_a_bad_address_gets_mindspore_serving_s_text(address, text):
    with pytest.raises(RuntimeError) as info:
        check_address(address, "Serving gRPC")
    assert str(info.value) == text


def test_good_addresses_and_an_empty_unix_path():
    assert check_address("127.0.0.1:5500", "RESTful server") == ("127.0.0.1", 5500)
    assert check_address("[::1]:5500", "RESTful server") == ("::1", 5500)
    with pytest.raises(RuntimeError, match="^Serving Error: Empty grpc server unix domain socket address$"):
        check_unix_address("unix:")
