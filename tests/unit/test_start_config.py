"""ServableStartConfig validation, version resolution and merge_config."""

import os
import re
import sys

import pytest

from mindspore_serving.server import start_config
from mindspore_serving.server.start_config import (
    ServableStartConfig,
    check_servable_configs,
    merge_config,
    newest_version,
    resolve_version,
)


def raises(text):
    return pytest.raises(RuntimeError, match=re.escape(text))


def make_servable(root, name="add", versions=(1,), config=True):
    servable = root / name
    servable.mkdir(parents=True, exist_ok=True)
    if config:
        (servable / "servable_config.py").write_text("")
    for version in versions:
        (servable / str(version)).mkdir(exist_ok=True)
    return str(root)


def config(directory, name="add", **kwargs):
    return ServableStartConfig(directory, name, **kwargs)


def never_share(_device_type):
    return False


def always_share(_device_type):
    return True


# ---------------------------------------------------------------- ServableStartConfig


def test_defaults_and_properties(tmp_path):
    cfg = ServableStartConfig(str(tmp_path), "add", device_ids=2)
    assert cfg.servable_directory == os.path.realpath(str(tmp_path))
    assert cfg.servable_name == "add"
    assert cfg.device_ids == (2,)
    assert cfg.version_number == 0
    assert cfg.device_type == "none"
    assert cfg.num_parallel_workers == 0
    assert cfg.dec_key is None
    assert cfg.dec_mode == "AES-GCM"
    for name in (
        "servable_directory",
        "servable_name",
        "device_ids",
        "version_number",
        "device_type",
        "num_parallel_workers",
        "dec_key",
        "dec_mode",
    ):
        with pytest.raises(AttributeError):
            setattr(cfg, name, None)


def test_relative_directory_is_resolved_against_the_script(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "serving_server.py")])
    monkeypatch.chdir("/")
    cfg = ServableStartConfig("servables", "add")
    assert cfg.servable_directory == os.path.realpath(str(tmp_path / "servables"))


def test_num_parallel_workers(tmp_path):
    assert config(str(tmp_path)).num_parallel_workers == 1
    assert config(str(tmp_path), device_ids=(0, 1)).num_parallel_workers == 0
    assert config(str(tmp_path), device_ids=0, num_parallel_workers=4).num_parallel_workers == 4
    assert config(str(tmp_path), num_parallel_workers=64).num_parallel_workers == 64
    with raises("Parameter 'num_parallel_workers' should be in range [0,64]"):
        config(str(tmp_path), num_parallel_workers=65)
    with raises("Parameter 'num_parallel_workers' should be int, but actually <class 'str'>"):
        config(str(tmp_path), num_parallel_workers="1")


def test_invalid_names_and_versions(tmp_path):
    with raises("Parameter 'servable_directory' should be str, but actually <class 'NoneType'>"):
        ServableStartConfig(None, "add")
    with raises("Parameter 'servable_directory' should not be empty str"):
        ServableStartConfig("", "add")
    with raises("Parameter 'servable_name' should be str, but actually <class 'int'>"):
        ServableStartConfig(str(tmp_path), 1)
    with raises("Parameter 'servable_name' should not be empty str"):
        ServableStartConfig(str(tmp_path), "")
    with raises("Parameter 'version_number' should be >= 0"):
        config(str(tmp_path), version_number=-1)
    with raises("Parameter 'version_number' should be int, but actually <class 'bool'>"):
        config(str(tmp_path), version_number=True)


def test_device_ids(tmp_path):
    assert config(str(tmp_path), device_ids=None).device_ids == ()
    assert config(str(tmp_path), device_ids=[3, 1]).device_ids == (3, 1)
    with raises("The item value '-1' in parameter 'device_ids' should be >= 0"):
        config(str(tmp_path), device_ids=(0, -1))
    with raises("Parameter 'device_ids' should be int or tuple/list of int, but actually <class 'str'>"):
        config(str(tmp_path), device_ids="0")
    with raises("The item value '1' in parameter 'device_ids' should not be repeated"):
        config(str(tmp_path), device_ids=(1, 1))


def test_device_type(tmp_path):
    assert config(str(tmp_path), device_type="Ascend").device_type == "ascend"
    assert config(str(tmp_path), device_type="gpu").device_type == "gpu"
    assert config(str(tmp_path), device_type="CPU").device_type == "cpu"
    with raises("Unsupported device type 'NPU', only support 'Ascend', 'GPU', 'CPU' and None, case ignored"):
        config(str(tmp_path), device_type="NPU")
    with raises("Parameter 'device_type' should not be empty str"):
        config(str(tmp_path), device_type="")
    with raises("Parameter 'device_type' should be str, but actually <class 'int'>"):
        config(str(tmp_path), device_type=1)


def test_dec_key_and_mode(tmp_path):
    for length in (16, 24, 32):
        assert config(str(tmp_path), dec_key=b"k" * length).dec_key == b"k" * length
    assert config(str(tmp_path), dec_mode="AES-CBC").dec_mode == "AES-CBC"
    with raises("Parameter 'dec_key' should be bytes, but actually <class 'str'>"):
        config(str(tmp_path), dec_key="k" * 16)
    with raises("Parameter 'dec_key' should not be empty bytes"):
        config(str(tmp_path), dec_key=b"")
    with raises("Parameter 'dec_key' length 15 expected to be 16, 24 or 32"):
        config(str(tmp_path), dec_key=b"k" * 15)
    with raises("Parameter 'dec_mode' expected to be 'AES-GCM' or 'AES-CBC'"):
        config(str(tmp_path), dec_mode="AES-ECB")
    with raises("Parameter 'dec_mode' should be str, but actually <class 'NoneType'>"):
        config(str(tmp_path), dec_mode=None)


# ---------------------------------------------------------------- start_servables input


def test_check_servable_configs(tmp_path):
    cfg = config(str(tmp_path))
    assert check_servable_configs(cfg) == [cfg]
    assert check_servable_configs((cfg, cfg)) == [cfg, cfg]
    assert check_servable_configs([]) == []
    with raises("should be ServableStartConfig, list or tuple of ServableStartConfig, but actually <class 'str'>"):
        check_servable_configs("add")
    with raises("Parameter 'add' should be ServableStartConfig"):
        check_servable_configs("add")
    with raises("The item of parameter '[") as info:
        check_servable_configs([cfg, 1])
    assert "should be ServableStartConfig, but actually <class 'int'>" in str(info.value)

    class OtherConfig:
        pass

    other = OtherConfig()
    assert check_servable_configs([cfg, other], config_types=(OtherConfig,)) == [cfg, other]


# ---------------------------------------------------------------- versions


def test_newest_version(tmp_path):
    assert newest_version(str(tmp_path), "missing") == 0
    make_servable(tmp_path, versions=())
    assert newest_version(str(tmp_path), "add") == 0
    make_servable(tmp_path, versions=(1, 2, 10))
    (tmp_path / "add" / "3a").mkdir()
    (tmp_path / "add" / "20").write_text("a file, not a version")
    assert newest_version(str(tmp_path), "add") == 10
    assert resolve_version(str(tmp_path), "add", 0) == 10
    assert resolve_version(str(tmp_path), "add", 2) == 2


# ---------------------------------------------------------------- merge_config


def test_merge_resolves_version_zero(tmp_path):
    directory = make_servable(tmp_path, versions=(1, 2))
    merged = merge_config([config(directory, device_ids=0)])
    assert len(merged) == 1 and merged[0].version_number == 2
    no_versions = make_servable(tmp_path / "other", versions=())
    assert merge_config([config(no_versions)])[0].version_number == 0


def test_merge_same_version(tmp_path):
    directory = make_servable(tmp_path, versions=(1,))
    first = config(directory, device_ids=(0, 1), num_parallel_workers=3)
    second = config(directory, device_ids=(1, 2), version_number=1, num_parallel_workers=5)
    merged = merge_config([first, second], allow_reuse_device=always_share)
    assert len(merged) == 1
    assert merged[0].device_ids == (0, 1, 2)
    assert merged[0].num_parallel_workers == 5
    assert merged[0].version_number == 1
    assert first.device_ids == (0, 1) and first.version_number == 0  # the inputs are left alone


def test_merge_keeps_versions_and_servables_apart(tmp_path):
    directory = make_servable(tmp_path, versions=(1, 2))
    make_servable(tmp_path, name="sub")
    merged = merge_config(
        [
            config(directory, device_ids=0, version_number=1),
            config(directory, device_ids=1, version_number=2),
            config(directory, name="sub", device_ids=2),
        ],
        allow_reuse_device=never_share,
    )
    assert [(cfg.servable_name, cfg.version_number, cfg.device_ids) for cfg in merged] == [
        ("add", 1, (0,)),
        ("add", 2, (1,)),
        ("sub", 1, (2,)),
    ]


def test_merge_dec_key_conflict(tmp_path):
    directory = make_servable(tmp_path)
    with raises("The dec key or dec mode of servable name add is different in multiple configurations."):
        merge_config(
            [config(directory, device_ids=0, dec_key=b"a" * 16), config(directory, device_ids=1, dec_key=b"b" * 16)]
        )
    with raises("The dec key or dec mode of servable name add is different in multiple configurations."):
        merge_config(
            [
                config(directory, device_ids=0, dec_key=b"a" * 16),
                config(directory, device_ids=1, dec_key=b"a" * 16, dec_mode="AES-CBC"),
            ]
        )
    merged = merge_config(
        [config(directory, device_ids=0, dec_key=b"a" * 16), config(directory, device_ids=1, dec_key=b"a" * 16)]
    )
    assert merged[0].dec_key == b"a" * 16 and merged[0].device_ids == (0, 1)


def test_merge_directory_conflict(tmp_path):
    first = make_servable(tmp_path / "one")
    second = make_servable(tmp_path / "two")
    with raises("The servable directory of servable name add is different in multiple configurations"):
        merge_config([config(first, device_ids=0), config(second, device_ids=1)])


def test_merge_missing_directory_and_config_file(tmp_path):
    directory = str(tmp_path)
    with raises(
        f"Check servable config failed, directory '{os.path.join(os.path.realpath(directory), 'add')}' "
        f"not exist, servable directory '{os.path.realpath(directory)}', servable name 'add'"
    ):
        merge_config([config(directory)])
    make_servable(tmp_path, config=False)
    real = os.path.realpath(directory)
    with raises(
        f"Check servable config failed, file '{os.path.join(real, 'add', 'servable_config.py')}' not exist,"
        f"  servable directory '{real}', servable name 'add'"
    ):  # two spaces, as MindSpore Serving has them
        merge_config([config(directory)])


def test_merge_device_reuse(tmp_path):
    directory = make_servable(tmp_path, versions=(1, 2))
    make_servable(tmp_path, name="sub")
    with raises("Ascend 910 device id 0 is used repeatedly in servable sub"):
        merge_config(
            [config(directory, device_ids=0), config(directory, name="sub", device_ids=(1, 0))],
            allow_reuse_device=never_share,
        )
    with raises("Ascend 910 device id 1 is used repeatedly in servable add"):
        merge_config(
            [config(directory, device_ids=1, version_number=1), config(directory, device_ids=1, version_number=2)],
            allow_reuse_device=never_share,
        )
    merged = merge_config(
        [config(directory, device_ids=0), config(directory, name="sub", device_ids=0)], allow_reuse_device=always_share
    )
    assert [cfg.device_ids for cfg in merged] == [(0,), (0,)]


def test_default_device_sharing_rule(tmp_path):
    assert start_config.device_share_allowed("gpu")
    assert start_config.device_share_allowed("cpu")
    assert not start_config.device_share_allowed("ascend")
    directory = make_servable(tmp_path)
    make_servable(tmp_path, name="sub")
    with raises("Ascend 910 device id 0 is used repeatedly in servable sub"):
        merge_config(
            [
                config(directory, device_ids=0, device_type="Ascend"),
                config(directory, name="sub", device_ids=0, device_type="Ascend"),
            ]
        )
    merged = merge_config(
        [
            config(directory, device_ids=0, device_type="GPU"),
            config(directory, name="sub", device_ids=0, device_type="GPU"),
        ]
    )
    assert len(merged) == 2


def test_merge_passes_other_configs_through(tmp_path):
    directory = make_servable(tmp_path)
    other = object()
    merged = merge_config([other, config(directory, device_ids=0)])
    assert merged[-1] is other and merged[0].servable_name == "add"


def test_merge_checks_device_reuse_after_merging(tmp_path):
    """MindSpore Serving merges first: the same device in two configs of one servable version is one worker."""
    directory = make_servable(tmp_path, versions=(1,))
    merged = merge_config(
        [config(directory, device_ids=2, version_number=0), config(directory, device_ids=2, version_number=1)],
        allow_reuse_device=never_share,
    )
    assert [(cfg.version_number, cfg.device_ids) for cfg in merged] == [(1, (2,))]


def test_merge_groups_by_servable_name(tmp_path):
    directory = make_servable(tmp_path, versions=(1, 2))
    make_servable(tmp_path, name="add2")
    merged = merge_config(
        [
            config(directory, device_ids=(1, 3), version_number=1),
            config(directory, name="add2", device_ids=0),
            config(directory, device_ids=(4, 5), version_number=1),
            config(directory, device_ids=6, version_number=2),
        ],
        allow_reuse_device=never_share,
    )
    assert [(cfg.servable_name, cfg.version_number, cfg.device_ids) for cfg in merged] == [
        ("add", 1, (1, 3, 4, 5)),
        ("add", 2, (6,)),
        ("add2", 1, (0,)),
    ]


def test_merge_directory_conflict_names_both_directories(tmp_path):
    first = make_servable(tmp_path / "one")
    second = make_servable(tmp_path / "two")
    with raises(
        f"The servable directory of servable name add is different in multiple configurations, servable "
        f"directory: {os.path.realpath(second)} and {os.path.realpath(first)}"
    ):
        merge_config([config(first, device_ids=0), config(second, device_ids=1)])


@pytest.fixture
def devices(monkeypatch):
    """What MindSpore offers, as the master's probe would say (MindSpore Serving's UT stub has
    SERVING_ENABLE_GPU_DEVICE / SERVING_ENABLE_CPU_DEVICE for the same)."""
    from mindspore_serving.common import ms_device

    found = ["CPU"]
    asked = []

    def probe():
        asked.append(True)
        return list(found)

    monkeypatch.setattr(ms_device, "probe_available_devices", probe)
    return found, asked


def test_device_type_must_be_available(tmp_path, devices):
    found, asked = devices
    from mindspore_serving import server

    directory = make_servable(tmp_path)
    start_config.check_device_types([config(directory, device_type="CPU"), config(directory)])
    assert not asked  # CPU is always there and 'none' takes the best: MindSpore is not asked
    with raises(
        "The device type 'ascend' of servable name add is inconsistent with current running environment, "
        "supported device type: None or 'Cpu'"
    ):
        server.start_servables(config(directory, device_ids=0, device_type="Ascend"))
    found[:] = ["GPU", "CPU"]
    with raises(
        "The device type 'ascend' of servable name add is inconsistent with current running environment, "
        "supported device type: None, 'Gpu' or 'Cpu'"
    ):
        server.start_servables(
            [
                config(directory, device_ids=0, device_type="Ascend"),
                config(directory, device_ids=1, device_type="Ascend"),
            ]
        )
    start_config.check_device_types([config(directory, device_type="gpu")])
    found[:] = ["Ascend", "CPU"]
    with raises(
        "The device type 'gpu' of servable name add is inconsistent with current running environment, "
        "supported device type: None, 'Ascend' or 'Cpu'"
    ):
        start_config.check_device_types([config(directory, device_type="GPU")])


def test_device_reuse_follows_the_device(tmp_path, devices):
    found, _ = devices
    directory = make_servable(tmp_path)
    make_servable(tmp_path, name="add_x")
    same_device = [config(directory, device_ids=0), config(directory, name="add_x", device_ids=0)]
    assert len(merge_config(same_device)) == 2  # CPU: shared
    found[:] = ["GPU", "CPU"]
    assert len(merge_config(same_device)) == 2
    found[:] = ["Ascend", "CPU"]
    with raises("Ascend 910 device id 0 is used repeatedly in servable add_x"):
        merge_config(same_device)
    assert (
        len(
            merge_config(
                [
                    config(directory, device_ids=0, device_type="CPU"),
                    config(directory, name="add_x", device_ids=0, device_type="CPU"),
                ]
            )
        )
        == 2
    )


def test_worker_side_device_check_has_the_same_text(monkeypatch):
    from mindspore_serving.common import ms_device

    monkeypatch.setattr(ms_device, "available_devices", lambda: ["CPU"])
    assert ms_device.resolve_device("none") == "CPU"
    assert ms_device.resolve_device("cpu") == "CPU"
    with raises(
        "The device type 'gpu' of servable name add is inconsistent with current running environment, "
        "supported device type: None or 'Cpu'"
    ):
        ms_device.resolve_device("gpu", "add")


def test_probe_asks_a_child_process_once(monkeypatch):
    from mindspore_serving.common import ms_device

    runs = []

    class Done:
        stdout = "noise\n#available_devices=GPU,CPU#\n"

    monkeypatch.setattr(ms_device, "_probed", None)
    monkeypatch.setattr(ms_device, "accelerator_nodes", lambda: ["nvidia0", "nvidiactl"])
    monkeypatch.setattr(ms_device.subprocess, "run", lambda cmd, **kwargs: runs.append(cmd) or Done())
    assert ms_device.probe_available_devices() == ["GPU", "CPU"]
    assert ms_device.probe_available_devices() == ["GPU", "CPU"]
    assert len(runs) == 1 and runs[0][0] == sys.executable
    Done.stdout = "Traceback ..."
    monkeypatch.setattr(ms_device, "_probed", None)
    with raises("Failed to get device type"):
        ms_device.probe_available_devices()


def test_probe_runs_mindspore_in_a_child(monkeypatch):
    from mindspore_serving.common import ms_device

    pytest.importorskip("mindspore")
    monkeypatch.setattr(ms_device, "_probed", None)
    monkeypatch.setattr(ms_device, "accelerator_nodes", lambda: ["davinci0"])  # as if a driver were there
    available = ms_device.probe_available_devices()
    assert available[-1] == "CPU" and set(available) <= {"Ascend", "GPU", "CPU"}


def test_without_an_accelerators_device_file_the_cpu_is_all_without_a_child(monkeypatch, tmp_path):
    from mindspore_serving.common import ms_device

    for name in ("null", "nvme0", "shm"):
        (tmp_path / name).touch()
    assert ms_device.accelerator_nodes(str(tmp_path)) == []
    for name in ("davinci0", "davinci_manager", "nvidia0", "dxg"):
        (tmp_path / name).touch()
    assert ms_device.accelerator_nodes(str(tmp_path)) == ["davinci0", "davinci_manager", "dxg", "nvidia0"]
    assert ms_device.accelerator_nodes(str(tmp_path / "absent")) == []
    monkeypatch.setattr(ms_device, "_probed", None)
    monkeypatch.setattr(ms_device, "accelerator_nodes", lambda: [])
    monkeypatch.setattr(ms_device.subprocess, "run", lambda *args, **kwargs: pytest.fail("a child was started"))
    assert ms_device.probe_available_devices() == ["CPU"]


def test_model_control_reloads_an_encrypted_servable_with_its_key(tmp_path):
    from types import SimpleNamespace

    from mindspore_serving.server import _server

    directory = make_servable(tmp_path, name="enc")
    make_servable(tmp_path, name="plain")
    master = SimpleNamespace(
        model_control=SimpleNamespace(plans_for=None), processes=SimpleNamespace(of_servable=lambda name: [])
    )
    _server._enable_model_control(
        master, [config(directory, name="enc", device_ids=0, dec_key=b"k" * 16, dec_mode="AES-CBC")]
    )
    (plan,) = master.model_control.plans_for("enc", 1)
    assert (plan.dec_key, plan.dec_mode, plan.device_id) == (b"k" * 16, "AES-CBC", 0)
    (plan,) = master.model_control.plans_for("plain", 1)
    assert (plan.dec_key, plan.dec_mode) == (None, "AES-GCM")


def test_enable_lite_is_checked_as_a_bool_and_accepted(tmp_path, devices):
    """MindSpore Serving's start_servables(configs, enable_lite): a bool, checked after the configs; the models run
    in MindSpore either way (a device type not available still fails after the check)."""
    from mindspore_serving import server

    with raises("Parameter 'enable_lite' should be bool, but actually <class 'int'>"):
        server.start_servables(config(make_servable(tmp_path)), enable_lite=1)
    with raises("should be ServableStartConfig, list or tuple of ServableStartConfig"):
        server.start_servables("add", enable_lite=1)  # the configs are checked first
    with raises("The device type 'ascend' of servable name add is inconsistent"):
        server.start_servables(config(make_servable(tmp_path), device_ids=0, device_type="Ascend"), enable_lite=True)
