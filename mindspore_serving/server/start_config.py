"""`ServableStartConfig`, servable version resolution and the merge of several start configs."""

import copy
import operator
import os
from collections.abc import Callable, Sequence

from mindspore_serving import log
from mindspore_serving.common import check_type, ms_device
from mindspore_serving.ipc import internal_tls

SERVABLE_CONFIG_FILE = "servable_config.py"
DEVICE_TYPES = ("ascend", "gpu", "cpu")
DEC_MODES = ("AES-GCM", "AES-CBC")


def _read_only(name: str, doc: str | None = None) -> property:
    """The public attribute `name` over the private `_<name>`, the one that `_replace` changes."""
    return property(operator.attrgetter("_" + name), doc=doc)


class ServableStartConfig:
    """How to start one servable: where it is, which version, on which devices.

    Args:
        servable_directory (str): the directory holding `<servable_name>/servable_config.py`; a relative path is
            resolved against the directory of the running script.
        servable_name (str): the servable name, i.e. the directory name under servable_directory.
        device_ids (Union[int, tuple[int], list[int]], optional): one worker process is started per device id.
        version_number (int): the version to load, >= 0; 0 (default) loads the newest version directory.
        device_type (str, optional): "Ascend", "GPU", "CPU" (case ignored) or None for the best available one.
        num_parallel_workers (int): processes running the Python stages, in [0, 64]; extra workers are started when
            it exceeds len(device_ids). It becomes 1 when it is 0 and device_ids is empty.
        dec_key (bytes, optional): the key (16, 24 or 32 bytes) of encrypted models.
        dec_mode (str): "AES-GCM" (default) or "AES-CBC".

    Raises:
        RuntimeError: a parameter is invalid.
    """

    def __init__(
        self,
        servable_directory,
        servable_name,
        device_ids=None,
        version_number=0,
        device_type=None,
        num_parallel_workers=0,
        dec_key=None,
        dec_mode="AES-GCM",
    ):
        check_type.check_str("servable_directory", servable_directory)
        self._servable_directory = check_type.get_abs_path(servable_directory)
        log.info(f"servable directory {servable_directory!r} resolved to {self._servable_directory!r}")
        self._servable_name = check_type.check_str("servable_name", servable_name)
        self._device_ids = (
            () if device_ids is None else check_type.check_and_as_int_tuple_list("device_ids", device_ids, 0)
        )
        self._version_number = check_type.check_int("version_number", version_number, 0)
        self._device_type = _check_device_type(device_type)
        check_type.check_int("num_parallel_workers", num_parallel_workers, 0, 64)
        if num_parallel_workers == 0 and not self._device_ids:
            num_parallel_workers = 1
        self._num_parallel_workers = num_parallel_workers
        self._dec_key = _check_dec_key(dec_key)
        check_type.check_str("dec_mode", dec_mode)
        if dec_mode not in DEC_MODES:
            raise RuntimeError("Parameter 'dec_mode' expected to be 'AES-GCM' or 'AES-CBC'")
        self._dec_mode = dec_mode

    servable_directory = _read_only("servable_directory")
    servable_name = _read_only("servable_name")
    device_ids = _read_only("device_ids")
    version_number = _read_only("version_number")
    device_type = _read_only("device_type", "'ascend', 'gpu', 'cpu' or 'none'.")
    num_parallel_workers = _read_only("num_parallel_workers")
    dec_key = _read_only("dec_key")
    dec_mode = _read_only("dec_mode")

    def _replace(self, **changes) -> "ServableStartConfig":
        """A copy with some attributes changed (for merge_config); the names are the property names."""
        new = copy.copy(self)
        for name, value in changes.items():
            if not hasattr(new, "_" + name):
                raise AttributeError(name)
            setattr(new, "_" + name, value)
        return new

    def __repr__(self):
        return (
            f"ServableStartConfig(servable_directory={self._servable_directory!r}, "
            f"servable_name={self._servable_name!r}, device_ids={self._device_ids}, "
            f"version_number={self._version_number}, device_type={self._device_type!r}, "
            f"num_parallel_workers={self._num_parallel_workers}, dec_mode={self._dec_mode!r})"
        )


def _check_device_type(device_type) -> str:
    if device_type is None:
        return "none"
    check_type.check_str("device_type", device_type)
    if device_type.lower() not in DEVICE_TYPES:
        raise RuntimeError(
            f"Unsupported device type '{device_type}', only support 'Ascend', 'GPU', 'CPU' and None, case ignored"
        )
    return device_type.lower()


def _check_dec_key(dec_key) -> bytes | None:
    if dec_key is None:
        return None
    check_type.check_bytes("dec_key", dec_key)
    if len(dec_key) not in (16, 24, 32):
        raise RuntimeError(f"Parameter 'dec_key' length {len(dec_key)} expected to be 16, 24 or 32")
    return dec_key


def newest_version(servable_directory: str, servable_name: str) -> int:
    """The largest numeric version directory of the servable, 0 when there is none."""
    servable_path = os.path.join(servable_directory, servable_name)
    try:
        names = os.listdir(servable_path)
    except OSError:
        return 0
    versions = [int(name) for name in names if name.isdigit() and os.path.isdir(os.path.join(servable_path, name))]
    return max(versions, default=0)


def resolve_version(servable_directory: str, servable_name: str, version_number: int) -> int:
    """`version_number`, or the newest version (0 if none) when it is 0."""
    if version_number == 0:
        return newest_version(servable_directory, servable_name)
    return version_number


def check_servable_location(servable_directory: str, servable_name: str):
    """Raises when `<servable_directory>/<servable_name>/servable_config.py` is missing."""
    config_dir = os.path.join(servable_directory, servable_name)
    if not os.path.isdir(config_dir):
        raise RuntimeError(
            f"Check servable config failed, directory '{config_dir}' not exist, servable directory "
            f"'{servable_directory}', servable name '{servable_name}'"
        )
    config_file = os.path.join(config_dir, SERVABLE_CONFIG_FILE)
    if not os.path.isfile(config_file):
        raise RuntimeError(
            f"Check servable config failed, file '{config_file}' not exist,  servable directory "
            f"'{servable_directory}', servable name '{servable_name}'"
        )


def check_servable_configs(servable_configs, config_types: Sequence[type] = ()) -> list:
    """start_servables' input: one config or a list/tuple of them, returned as a list.

    `config_types` are further accepted config classes (e.g. the distributed start config).
    """
    accepted = (ServableStartConfig,) + tuple(config_types)
    if isinstance(servable_configs, accepted):
        return [servable_configs]
    if not isinstance(servable_configs, (list, tuple)):
        raise RuntimeError(
            f"Parameter '{servable_configs}' should be ServableStartConfig, list or tuple of "
            f"ServableStartConfig, but actually {type(servable_configs)}"
        )
    for config in servable_configs:
        if not isinstance(config, accepted):
            raise RuntimeError(
                f"The item of parameter '{servable_configs}' should be ServableStartConfig, but actually {type(config)}"
            )
    return list(servable_configs)


def check_device_types(configs):
    """Raises MindSpore Serving's error for a config whose device_type this MindSpore cannot run ("The device type
    '<t>' of servable name <n> is inconsistent with current running environment, supported device type: ...").
    CPU is always there; asking for GPU or Ascend asks MindSpore, in a child process (the master never loads it)."""
    for config in configs:
        if isinstance(config, ServableStartConfig) and config.device_type not in ("none", "cpu"):
            ms_device.check_device_type(config.device_type, config.servable_name, ms_device.probe_available_devices())


def device_share_allowed(device_type: str) -> bool:
    """Whether several workers may use one device id: on GPU and CPU yes, on Ascend (910) no. For device_type
    'none' the answer is the one of the best device MindSpore has."""
    device_type = (device_type or "none").lower()
    if device_type == "none":
        device_type = ms_device.probe_available_devices()[0].lower()
    return device_type != "ascend"


def merge_config(configs, allow_reuse_device: Callable[[str], bool] | None = None) -> list:
    """Checks the configs of start_servables and merges those of the same servable and version.

    * one servable name must always come with the same servable directory, holding servable_config.py;
    * version 0 becomes the newest version directory (0 when there is none);
    * configs of the same (name, version) merge: device_ids are unioned, num_parallel_workers takes the max,
      and their dec_key and dec_mode must be equal;
    * a device id used twice by the merged configs is refused unless `allow_reuse_device(device_type)`
      (default `device_share_allowed`) says the device can be shared.

    The merged configs come grouped by servable name, in the order the names first appear; items that are not
    ServableStartConfig are returned unchanged after them.
    """
    allow_reuse_device = allow_reuse_device or device_share_allowed
    groups = {}  # servable name -> {version: merged config}
    directories = {}
    others = []
    for config in configs:
        if not isinstance(config, ServableStartConfig):
            others.append(config)
            continue
        name, directory = config.servable_name, config.servable_directory
        if name not in groups:
            check_servable_location(directory, name)
            groups[name], directories[name] = {}, directory
        elif directories[name] != directory:
            raise RuntimeError(
                f"The servable directory of servable name {name} is different in multiple "
                f"configurations, servable directory: {directory} and {directories[name]}"
            )
        versions = groups[name]
        version = resolve_version(directory, name, config.version_number)
        old = versions.get(version)
        if old is None:
            versions[version] = config._replace(version_number=version)  # pylint: disable=protected-access
            continue
        if old.dec_key != config.dec_key or old.dec_mode != config.dec_mode:
            raise RuntimeError(
                f"The dec key or dec mode of servable name {name} is different in multiple configurations."
            )
        device_ids = old.device_ids + tuple(item for item in config.device_ids if item not in old.device_ids)
        versions[version] = old._replace(  # pylint: disable=protected-access
            device_ids=device_ids, num_parallel_workers=max(old.num_parallel_workers, config.num_parallel_workers)
        )
    merged = [config for versions in groups.values() for config in versions.values()]
    _check_device_reuse(merged, allow_reuse_device)
    return merged + others


def _check_device_reuse(configs, allow_reuse_device):
    used = set()
    for config in configs:
        for device_id in config.device_ids:
            if device_id in used and not allow_reuse_device(config.device_type):
                raise RuntimeError(
                    f"Ascend 910 device id {device_id} is used repeatedly in servable {config.servable_name}"
                )
            used.add(device_id)


class DistributedStartConfig:
    """How to start a distributed servable (`server.distributed.start_servable`): one worker that waits for the
    rank agents listed in the rank table. Checked as MindSpore Serving checks it; relative paths are resolved
    against the directory of the running script."""

    def __init__(
        self,
        servable_directory,
        servable_name,
        rank_table_json_file,
        version_number=1,
        distributed_address="127.0.0.1:6200",
        wait_agents_time_in_seconds=0,
        ssl_config=None,
    ):
        check_type.check_str("servable_directory", servable_directory)
        check_type.check_str("servable_name", servable_name)
        check_type.check_int("version_number", version_number, 0)
        check_type.check_str("rank_table_json_file", rank_table_json_file)
        check_type.check_str("distributed_address", distributed_address)
        check_type.check_int("wait_agents_time_in_seconds", wait_agents_time_in_seconds, 0)
        self.servable_directory = check_type.get_abs_path(servable_directory)
        self.servable_name = servable_name
        self.version_number = version_number or 1
        self.rank_table_json_file = check_type.get_abs_path(rank_table_json_file)
        self.distributed_address = distributed_address
        self.wait_agents_time_in_seconds = wait_agents_time_in_seconds
        # the distributed worker's environment for mutual TLS with its agents (ipc.internal_tls)
        self.tls_env = (
            {} if ssl_config is None else internal_tls.ssl_config_env(internal_tls.DISTRIBUTED_PREFIX, ssl_config)
        )
