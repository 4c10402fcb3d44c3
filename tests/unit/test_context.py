"""Context, the device infos and the deprecated AclOptions/GpuOptions."""

import re

import pytest

from mindspore_serving import log
from mindspore_serving.server import register


def raises(text):
    return pytest.raises(RuntimeError, match=re.escape(text))


@pytest.fixture
def warnings(monkeypatch):
    messages = []
    monkeypatch.setattr(log, "warning", lambda msg, *args, **kwargs: messages.append(msg))
    return messages


def test_context_defaults():
    model_context = register.Context().model_context
    assert model_context.thread_num == -1
    assert model_context.thread_affinity_core_list == []
    assert model_context.enable_parallel == -1
    assert model_context.device_list == []


def test_context_options():
    context = register.Context(thread_num=3, thread_affinity_core_list=(1, 2, 3), enable_parallel=True)
    assert context.model_context.thread_num == 3
    assert context.model_context.thread_affinity_core_list == [1, 2, 3]
    assert context.model_context.enable_parallel == 1
    assert register.Context(enable_parallel=False).model_context.enable_parallel == 0


def test_context_invalid_options():
    with raises("Set context failed, unsupported option thread_count"):
        register.Context(thread_count=1)
    with raises("Parameter 'thread_num' should be >= 1"):
        register.Context(thread_num=0)
    with raises("Parameter 'thread_num' should be int, but actually <class 'str'>"):
        register.Context(thread_num="1")
    with raises("Parameter 'thread_affinity_core_list' should be tuple/list of int, but actually <class 'int'>"):
        register.Context(thread_affinity_core_list=1)
    with raises("The item value '-1' in parameter 'thread_affinity_core_list' should be >= 0"):
        register.Context(thread_affinity_core_list=[0, -1])
    with raises("Parameter 'enable_parallel' should be bool, but actually <class 'int'>"):
        register.Context(enable_parallel=1)


def test_append_device_infos():
    context = register.Context()
    context.append_device_info(register.CPUDeviceInfo(precision_mode="fp16"))
    context.append_device_info(register.GPUDeviceInfo())
    context.append_device_info(register.AscendDeviceInfo(input_format="NCHW"))
    assert context.model_context.device_list == [
        {"precision_mode": "fp16", "device_type": "cpu"},
        {"device_type": "gpu"},
        {"input_format": "NCHW", "device_type": "ascend"},
    ]
    with raises("Device info of type gpu has already been appended"):
        context.append_device_info(register.GPUDeviceInfo(precision_mode="origin"))
    with raises(
        "Parameter 'device_info' should instance of CPUDeviceInfo, GPUDeviceInfo, or AscendDeviceInfo, but "
        "actually <class 'dict'>"
    ):
        context.append_device_info({"device_type": "cpu"})


def test_cpu_gpu_device_info():
    assert register.CPUDeviceInfo(precision_mode="origin").context_map == {
        "precision_mode": "origin",
        "device_type": "cpu",
    }
    assert register.GPUDeviceInfo().context_map == {"device_type": "gpu"}
    with raises("Gpu device info 'precision_mode' can only be 'origin', 'fp16'. given 'fp32'"):
        register.GPUDeviceInfo(precision_mode="fp32")
    with raises("Cpu device info 'precision_mode' can only be 'origin', 'fp16'. given 'fp32'"):
        register.CPUDeviceInfo(precision_mode="fp32")
    with raises("Set gpu device info failed, unsupported option precision"):
        register.GPUDeviceInfo(precision="fp16")
    with raises("Set cpu device info failed, unsupported option precision"):
        register.CPUDeviceInfo(precision="fp16")
    with raises("Parameter 'precision_mode' should be str, but actually <class 'int'>"):
        register.CPUDeviceInfo(precision_mode=1)


def test_ascend_device_info():
    info = register.AscendDeviceInfo(
        insert_op_cfg_path="aipp.cfg",
        input_format="NHWC",
        input_shape="x:1,2",
        output_type="FP16",
        precision_mode="allow_fp32_to_fp16",
        op_select_impl_mode="high_precision",
        fusion_switch_config_path="fusion.cfg",
        buffer_optimize_mode="l1_and_l2_optimize",
    )
    assert info.context_map == {
        "insert_op_cfg_path": "aipp.cfg",
        "input_format": "NHWC",
        "input_shape": "x:1,2",
        "output_type": "FP16",
        "precision_mode": "allow_fp32_to_fp16",
        "op_select_impl_mode": "high_precision",
        "fusion_switch_config_path": "fusion.cfg",
        "buffer_optimize_mode": "l1_and_l2_optimize",
        "device_type": "ascend",
    }
    with raises("Set ascend device info failed, unsupported parameter device_id"):
        register.AscendDeviceInfo(device_id=1)
    errors = {
        "input_format": (
            "NCWH",
            "Ascend device info 'input_format' can only be 'ND', 'NCHW', 'NHWC', 'CHWN', "
            "'NC1HWC0', or 'NHWC1C0', actually given 'NCWH'",
        ),
        # MindSpore Serving's text for output_type names op_select_impl_mode
        "output_type": (
            "INT8",
            "Ascend device info 'op_select_impl_mode' can only be 'FP32'(default), 'FP16' or "
            "'UINT8', actually given 'INT8'",
        ),
        "precision_mode": (
            "fp16",
            "Ascend device info 'precision_mode' can only be 'force_fp16'(default), "
            "'allow_fp32_to_fp16' 'must_keep_origin_dtype' or 'allow_mix_precision', actually "
            "given 'fp16'",
        ),
        "op_select_impl_mode": (
            "fast",
            "Ascend device info 'op_select_impl_mode' can only be "
            "'high_performance'(default) or 'high_precision', actually given 'fast'",
        ),
        "buffer_optimize_mode": (
            "on",
            "Ascend device info 'buffer_optimize_mode' can only be 'off_optimize'(default), "
            "'l1_optimize', 'l2_optimize' or 'l1_and_l2_optimize', actually given 'on'",
        ),
    }
    for key, (value, text) in errors.items():
        with pytest.raises(RuntimeError) as info:
            register.AscendDeviceInfo(**{key: value})
        assert str(info.value) == text
    with raises("Parameter 'insert_op_cfg_path' should not be empty str"):
        register.AscendDeviceInfo(insert_op_cfg_path="")


def test_acl_and_gpu_options(warnings):
    acl = register.AclOptions(precision_mode="force_fp16", input_format="ND")
    assert acl.context.model_context.device_list == [
        {"precision_mode": "force_fp16", "input_format": "ND", "device_type": "ascend"}
    ]
    gpu = register.GpuOptions(precision_mode="fp16")
    assert gpu.context.model_context.device_list == [{"precision_mode": "fp16", "device_type": "gpu"}]
    assert (
        "'AclOptions' is deprecated from version 1.6.0 and will be removed in a future version, use "
        "'mindspore_serving.server.register.AscendDeviceInfo' instead."
    ) in warnings
    assert (
        "'GpuOptions' is deprecated from version 1.6.0 and will be removed in a future version, use "
        "'mindspore_serving.server.register.GPUDeviceInfo' instead."
    ) in warnings
    # every AscendDeviceInfo option, as in MindSpore Serving
    acl = register.AclOptions(
        insert_op_cfg_path="some path of insert_op_cfg_path",
        input_format="NHWC1C0",
        input_shape="input_op_name1: n1,c2,h3,w4;input_op_name2: n4,c3,h2,w1",
        output_type="FP16",
        precision_mode="allow_mix_precision",
        op_select_impl_mode="high_precision",
        fusion_switch_config_path="some path of fusion_switch_config_path",
        buffer_optimize_mode="l1_and_l2_optimize",
    )
    (acl_map,) = acl.context.model_context.device_list
    assert acl_map["fusion_switch_config_path"] == "some path of fusion_switch_config_path"
    assert acl_map["buffer_optimize_mode"] == "l1_and_l2_optimize"
    assert acl_map["device_type"] == "ascend"
    with raises("Set ascend device info failed, unsupported parameter device_id"):
        register.AclOptions(device_id=0)
    with raises("Set gpu device info failed, unsupported option thread_num"):
        register.GpuOptions(thread_num=1)
    with raises("Gpu device info 'precision_mode' can only be 'origin', 'fp16'. given 'fp32'"):
        register.GpuOptions(precision_mode="fp32")


def test_model_context_as_string():
    """How "Load model failed, ..., model context: <this>, load error details: ..." prints a model's context."""
    assert register.Context().model_context.as_string() == "{}"
    context = register.Context(thread_num=2, thread_affinity_core_list=[0, 1], enable_parallel=False)
    context.append_device_info(register.CPUDeviceInfo(precision_mode="fp16"))
    context.append_device_info(register.GPUDeviceInfo())
    assert context.model_context.as_string() == (
        "{device infos: [{device_type: cpu, precision_mode: fp16}, {device_type: gpu}], enable parallel: 0, "
        "thread affinity core list: [0, 1], thread num: 2}"
    )
