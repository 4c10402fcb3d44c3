"""The parameter validators and their exact error texts."""

import os
import re
import sys

import pytest

from mindspore_serving.common import check_type


def raises(text):
    return pytest.raises(RuntimeError, match=re.escape(text))


def test_check_str():
    assert check_type.check_str("name", "abc") == "abc"
    with raises("Parameter 'name' should be str, but actually <class 'int'>"):
        check_type.check_str("name", 1)
    with raises("Parameter 'name' should not be empty str"):
        check_type.check_str("name", "")


def test_check_bytes():
    assert check_type.check_bytes("key", b"x") == b"x"
    with raises("Parameter 'key' should be bytes, but actually <class 'str'>"):
        check_type.check_bytes("key", "x")
    with raises("Parameter 'key' should not be empty bytes"):
        check_type.check_bytes("key", b"")


def test_check_bool():
    assert check_type.check_bool("flag", False) is False
    with raises("Parameter 'flag' should be bool, but actually <class 'int'>"):
        check_type.check_bool("flag", 1)


def test_check_int_type_and_bool_rejected():
    assert check_type.check_int("n", 3) == 3
    with raises("Parameter 'n' should be int, but actually <class 'bool'>"):
        check_type.check_int("n", True)
    with raises("Parameter 'n' should be int, but actually <class 'float'>"):
        check_type.check_int("n", 1.0)


def test_check_int_ranges():
    assert check_type.check_int("n", 0, 0, 64) == 0
    assert check_type.check_int("n", 64, 0, 64) == 64
    with raises("Parameter 'n' should be in range [0,64]"):
        check_type.check_int("n", 65, 0, 64)
    with raises("Parameter 'n' should be in range [0,64]"):
        check_type.check_int("n", -1, 0, 64)
    with raises("Parameter 'n' should be >= 1"):
        check_type.check_int("n", 0, 1)
    with raises("Parameter 'n' should be <= 5"):
        check_type.check_int("n", 6, maximum=5)


def test_check_int_tuple_item_prefix():
    with raises("The item value '-1' in parameter 'ids' should be >= 0"):
        check_type.check_int("ids", -1, 0, is_tuple_item=True)
    with raises("The item value 'a' in parameter 'ids' should be int, but actually <class 'str'>"):
        check_type.check_int("ids", "a", is_tuple_item=True)
    with raises("The item value '9' in parameter 'ids' should be in range [0,8]"):
        check_type.check_int("ids", 9, 0, 8, is_tuple_item=True)


def test_check_ip_port():
    assert check_type.check_ip_port("port", 5500) == 5500
    with raises("Parameter 'port' should be in range [1,65535]"):
        check_type.check_ip_port("port", 0)


def test_int_or_tuple():
    assert check_type.check_and_as_int_tuple_list("device_ids", 1, 0) == (1,)
    assert check_type.check_and_as_int_tuple_list("device_ids", [1, 2], 0) == (1, 2)
    assert check_type.check_and_as_int_tuple_list("device_ids", (), 0) == ()
    assert check_type.check_int_tuple("device_ids", 3) == (3,)
    with raises("Parameter 'device_ids' should be int or tuple/list of int, but actually <class 'str'>"):
        check_type.check_and_as_int_tuple_list("device_ids", "1")
    with raises("Parameter 'device_ids' should be int or tuple/list of int, but actually <class 'bool'>"):
        check_type.check_and_as_int_tuple_list("device_ids", True)
    with raises("The item value '-1' in parameter 'device_ids' should be >= 0"):
        check_type.check_and_as_int_tuple_list("device_ids", (1, -1), 0)
    with raises("The item value '1' in parameter 'device_ids' should not be repeated"):
        check_type.check_and_as_int_tuple_list("device_ids", (1, 1), 0)
    with raises("The item value 'x' in parameter 'device_ids' should be int, but actually <class 'str'>"):
        check_type.check_and_as_int_tuple_list("device_ids", (1, "x"))


def test_int_tuple_only():
    assert check_type.check_int_tuple_list("cores", [0, 1], 0) == (0, 1)
    with raises("Parameter 'cores' should be tuple/list of int, but actually <class 'int'>"):
        check_type.check_int_tuple_list("cores", 1)
    with raises("The item value '-2' in parameter 'cores' should be >= 0"):
        check_type.check_int_tuple_list("cores", [-2], 0)


def test_str_or_tuple():
    assert check_type.check_and_as_str_tuple_list("output_names", "y") == ("y",)
    assert check_type.check_str_tuple("output_names", ["y", "z"]) == ("y", "z")
    with raises("Parameter 'output_names' should be str or tuple/list of str, but actually <class 'int'>"):
        check_type.check_and_as_str_tuple_list("output_names", 1)
    with raises("The item of parameter 'output_names' should be str, but actually <class 'int'>"):
        check_type.check_and_as_str_tuple_list("output_names", ["y", 1])
    with raises("The item of parameter 'output_names' should not be empty str"):
        check_type.check_and_as_str_tuple_list("output_names", ["y", ""])
    with raises("The item value 'y' in parameter 'output_names' should not be repeated"):
        check_type.check_and_as_str_tuple_list("output_names", ["y", "y"])


def test_relative_paths_resolve_against_the_script_directory(monkeypatch, tmp_path):
    script = tmp_path / "bin" / "serving_server.py"
    script.parent.mkdir()
    script.write_text("")
    monkeypatch.setattr(sys, "argv", [str(script)])
    assert check_type.get_abs_path("servables") == os.path.realpath(str(tmp_path / "bin" / "servables"))
    assert check_type.get_abs_path(str(tmp_path)) == os.path.realpath(str(tmp_path))


@pytest.mark.parametrize(
    "value, minimum, maximum, fault",
    [
        (3, 1, 5, None),
        (3, None, None, None),
        (True, None, None, check_type.IntFault.NOT_INT),
        (3.0, None, None, check_type.IntFault.NOT_INT),
        (0, 1, None, check_type.IntFault.BELOW_MINIMUM),
        (6, None, 5, check_type.IntFault.ABOVE_MAXIMUM),
    ],
)
def test_int_fault_is_the_one_int_test(value, minimum, maximum, fault):
    assert check_type.int_fault(value, minimum, maximum) is fault
