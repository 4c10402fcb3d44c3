"""start_servables / load_servable / unload_servable / start_grpc_server / start_restful_server / stop on top of the
master."""

import functools
import os

from mindspore_serving import log
from mindspore_serving.common import check_type, errors
from mindspore_serving.frontends.address import check_address, check_max_msg_mb_size
from mindspore_serving.frontends.api_groups import Access
from mindspore_serving.frontends.grpc_server import GrpcFrontend, read_ssl_files
from mindspore_serving.frontends.restful_server import RestfulFrontend
from mindspore_serving.master.master import (
    get_api_groups,
    get_api_key,
    get_master,
    get_request_limits,
    install_signal_handlers,
    set_model_control,
    stop_master,
)
from mindspore_serving.master.worker_processes import WorkerPlan
from mindspore_serving.proto import frontend_pb2
from mindspore_serving.server.master.context import check_grace
from mindspore_serving.server.model_repository import DEFAULT_POLL_INTERVAL, RepositoryPoller, parse_policies
from mindspore_serving.server.ssl_config import SSLConfig
from mindspore_serving.server.start_config import (
    DistributedStartConfig,
    ServableStartConfig,
    check_device_types,
    check_servable_configs,
    check_servable_location,
    merge_config,
)

_GRPC, _RESTFUL = "grpc", "restful"
# MindSpore Serving's start-up line of each front end (printed whatever GLOG_v says), and its log line (INFO)
_STARTED = {_GRPC: "Serving gRPC server", _RESTFUL: "Serving RESTful server"}
_LISTENING = {_GRPC: "Serving gRPC server start success, listening on", _RESTFUL: "Serving RESTful server listening on"}


def _plans(configs):
    plans = []
    for config in configs:
        if isinstance(config, DistributedStartConfig):
            check_servable_location(config.servable_directory, config.servable_name)
            plans.append(
                WorkerPlan(
                    servable_directory=config.servable_directory,
                    servable_name=config.servable_name,
                    version_number=config.version_number,
                    device_type=None,
                    device_id=0,
                    dec_key=None,
                    dec_mode="AES-GCM",
                    rank_table_json_file=config.rank_table_json_file,
                    distributed_address=config.distributed_address,
                    wait_agents_time_in_seconds=config.wait_agents_time_in_seconds,
                    env=config.tls_env,
                )
            )
            continue
        common = dict(
            servable_directory=config.servable_directory,
            servable_name=config.servable_name,
            version_number=config.version_number,
            device_type=config.device_type,
            dec_key=config.dec_key,
            dec_mode=config.dec_mode,
        )
        for device_id in config.device_ids:
            plans.append(WorkerPlan(device_id=device_id, **common))
        # extra workers run the Python stages too (worker/extra_worker.py); without device ids they are the only
        # workers (num_parallel_workers is at least 1 then)
        for index in range(config.num_parallel_workers - len(config.device_ids)):
            plans.append(WorkerPlan(device_id=0, extra_index=index, device_ids_empty=not config.device_ids, **common))
    return plans


def _stop_on_except(function):
    """As MindSpore Serving's server functions: a failure stops the whole server (its workers and the front ends
    started before) before it is raised, so that a script that dies there leaves nothing half started."""

    @functools.wraps(function)
    def stopping(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except BaseException:
            stop()
            raise

    return stopping


@_stop_on_except
def start_servables(servable_configs, enable_lite=False):
    """Starts one worker per servable per device id, then its extra workers (num_parallel_workers beyond the
    device ids), and blocks until all have registered.

    `enable_lite` is MindSpore Serving's choice of MindSpore Lite as the inference runtime: it is checked and
    accepted, and the models run in MindSpore either way (MindIR loaded with `mindspore.load`).

    Raises RuntimeError("Fail to start workers: ...") with the worker's reason when one fails; everything
    started so far is stopped then.
    """
    configs = check_servable_configs(servable_configs, (DistributedStartConfig,))
    check_type.check_bool("enable_lite", enable_lite)
    check_device_types(configs)
    try:
        configs = merge_config(configs)
    except RuntimeError as err:
        log.error(f"Start servables failed: {err}")
        raise
    master = get_master()
    install_signal_handlers()
    _enable_model_control(master, configs)
    master.start_workers(_plans(configs))
    log.info("all workers have registered")


def _enable_model_control(master, configs):
    """Lets the front ends load servables by name from the servable directory of `configs` (the first
    ServableStartConfig's), on the devices of the running workers of that servable, else of that config."""
    template = next((c for c in configs if isinstance(c, ServableStartConfig)), None)
    if template is None or master.model_control.plans_for is not None:
        return

    def plans_for(name: str, version: int):
        if not os.path.isdir(os.path.join(template.servable_directory, name)):
            raise FileNotFoundError(f"servable '{name}' is not in the servable directory {template.servable_directory}")
        running = [w.plan for w in master.processes.of_servable(name)]
        device_ids = tuple(sorted({p.device_id for p in running if not p.extra})) or template.device_ids
        device_type = running[0].device_type if running else template.device_type
        same = name == template.servable_name  # an encrypted servable reloads with its key
        config = ServableStartConfig(
            template.servable_directory,
            name,
            device_ids=device_ids,
            version_number=version,
            device_type=None if device_type in (None, "none") else device_type,
            num_parallel_workers=template.num_parallel_workers,
            dec_key=template.dec_key if same else None,
            dec_mode=template.dec_mode if same else "AES-GCM",
        )
        return _plans(merge_config([config]))

    master.model_control.plans_for = plans_for


def load_servable(config):
    """Loads a servable (a ServableStartConfig) while the server serves, and blocks until its workers have
    registered. Workers of the same servable, version and device that served before then drain and stop (a
    reload); other versions keep serving. Raises RuntimeError with the reason when it fails, and then what
    served before is untouched."""
    if not isinstance(config, ServableStartConfig):
        raise RuntimeError(f"Parameter 'config' should be ServableStartConfig, but actually {type(config)}")
    master = get_master()
    install_signal_handlers()
    check_device_types([config])
    (config,) = merge_config([config])
    _enable_model_control(master, [config])
    try:
        master.model_control.load(_plans([config]))
    except errors.ServingError as err:
        raise RuntimeError(err.message) from None
    master.now_serving()  # a server may start with no servable and load them all


def unload_servable(servable_name, version_number=0):
    """Stops serving a servable (one version of it; 0: every version): its workers leave the routing, their
    requests in flight finish (within the stop grace), then they exit. Raises RuntimeError when it is not
    loaded."""
    master = get_master()
    try:
        master.model_control.unload(servable_name, version_number)
    except errors.ServingError as err:
        raise RuntimeError(err.message) from None


_pollers = []


def start_model_control_poll(
    servable_directory,
    servable_names=None,
    version_policy="latest:1",
    device_ids=(0,),
    device_type=None,
    interval=DEFAULT_POLL_INTERVAL,
):
    """Serves what `servable_directory` holds and follows it: every `interval` seconds, version folders added or
    removed and changed servable_config.py files are loaded, unloaded and reloaded (`server.model_repository`).

    `version_policy` is `latest:N`, `all` or `specific:V1,V2`, and `;`-separated `name=policy` items override it
    per servable. The directory's servables (only `servable_names`, when given) are loaded before this returns;
    a load that fails is logged, and retried once the servable's files change."""
    default, per_servable = parse_policies(version_policy)
    set_model_control("poll")  # the directory decides what is served: clients' load/unload requests are refused
    directory = check_type.get_abs_path(check_type.check_str("servable_directory", servable_directory))
    device_ids = tuple(device_ids) or (0,)

    def load(name: str, version: int):
        if get_master(create=False) is None and _pollers:
            raise RuntimeError("the server stopped")
        load_servable(
            ServableStartConfig(directory, name, device_ids=device_ids, version_number=version, device_type=device_type)
        )

    def unload(name: str, version: int):
        if get_master(create=False) is not None:
            unload_servable(name, version)

    poller = RepositoryPoller(
        directory,
        list(servable_names) if servable_names else None,
        lambda name: per_servable.get(name, default),
        load,
        unload,
        interval,
    )
    poller.poll_once()
    _pollers.append(poller)
    poller.start()
    return poller


def _start_frontend(kind: str, label: str, frontend_class, address, max_msg_mb_size, ssl_config, **extra):
    """Starts a front end after the arguments' checks; its failures are MindSpore Serving's C++ core's: an ERROR
    line, an EXCEPTION line and RuntimeError("Raise failed: Serving Error: ...")."""
    try:
        _open_frontend(kind, label, frontend_class, address, max_msg_mb_size, ssl_config, **extra)
    except RuntimeError as err:
        failure = errors.core_failure(str(err))
        log.error(str(err))
        log.raised(str(failure))
        raise failure from None


def _open_frontend(kind: str, label: str, frontend_class, address, max_msg_mb_size, ssl_config, **extra):
    master = get_master()
    if kind in master.frontends:
        raise RuntimeError(f"Serving Error: {label} is already running")
    # with front-end processes the port is shared (SO_REUSEPORT); a unix socket is served by the master alone
    shared = master.frontend_count() > 1 and not str(address).startswith("unix:")
    # without model control open to clients, their load/unload requests get 403 / PERMISSION_DENIED
    model_control = master.model_control if master.model_control_open() else None
    frontend = frontend_class(
        address,
        max_msg_mb_size,
        ssl_config,
        master.dispatcher,
        llm_backend=master.llm_backend,
        readiness=master.readiness,
        reuse_port=shared,
        access=_access(),
        model_control=model_control,
        limits=get_request_limits(),
        **{name: getattr(master, attribute) for name, attribute in extra.items()},
    )
    master.run(frontend.start())
    master.frontends[kind] = frontend
    if shared:
        try:
            processes = master.ensure_frontend_processes()
            config = _server_config(kind, address, max_msg_mb_size, ssl_config, model_control is not None)
            master.run(processes.start_server(config))
        except BaseException:
            master.frontends.pop(kind, None)
            master.run(frontend.close())
            raise
    processes = f" ({master.frontend_count()} processes)" if shared else ""
    log.info(f"{_LISTENING[kind]} {address}{processes}")
    print(f"Serving: {_STARTED[kind]} start success, listening on {address}{processes}", flush=True)


def _access() -> Access:
    """The key each API group of the servers started now needs."""
    restricted, opened = get_api_groups()
    return Access(get_api_key(), restricted, opened)


def _server_config(
    kind: str, address: str, max_msg_mb_size: int, ssl_config, model_control: bool
) -> frontend_pb2.ServerConfig:
    """What a front-end process needs to open the same server."""
    config = frontend_pb2.ServerConfig(
        kind=kind,
        address=address,
        max_msg_mb_size=max_msg_mb_size,
        api_key=get_api_key() or "",
        model_control=model_control,
        limits=get_request_limits().to_proto(),
        restricted_api=get_api_groups()[0],
        open_api=get_api_groups()[1],
    )
    if ssl_config is not None:
        config.tls = True
        config.certificate = ssl_config.certificate
        config.private_key = ssl_config.private_key
        config.custom_ca = ssl_config.custom_ca or ""
        config.verify_client = bool(ssl_config.verify_client)
    return config


@_stop_on_except
def start_grpc_server(address, max_msg_mb_size=100, ssl_config=None):
    """Serves MSService on `ip:port` or `unix:<path>`; messages up to `max_msg_mb_size` MiB each way."""
    check_type.check_str("address", address)
    check_max_msg_mb_size(max_msg_mb_size)
    if ssl_config is not None:
        if not isinstance(ssl_config, SSLConfig):
            raise RuntimeError("The type of ssl_config should be type of SSLConfig")
        read_ssl_files(ssl_config)  # as MindSpore Serving: an unreadable file fails before anything else
    _start_frontend(
        _GRPC,
        "Serving gRPC server",
        GrpcFrontend,
        address,
        max_msg_mb_size,
        ssl_config,
        readiness_changes="readiness_changes",
    )


@_stop_on_except
def start_restful_server(address, max_msg_mb_size=100, ssl_config=None):
    """Serves the RESTful API on `ip:port`; request bodies up to `max_msg_mb_size` MiB."""
    check_type.check_str("address", address)
    check_max_msg_mb_size(max_msg_mb_size)
    if ssl_config is not None and not isinstance(ssl_config, SSLConfig):
        raise RuntimeError("The type of ssl_config should be class of SSLConfig")  # sic: gRPC's says "type of"
    _start_frontend(
        _RESTFUL, "RESTful server", RestfulFrontend, address, max_msg_mb_size, ssl_config, metrics="metrics_collector"
    )


def start_metrics_server(address):
    """Serves Prometheus metrics (`GET /metrics`) on `ip:port` besides the RESTful port's `/metrics`."""
    host, port = check_address(address, "metrics server")
    get_master().start_metrics_server(host, port)
    print(f"Serving: metrics server start success, listening on {address}", flush=True)


def stop(grace=None):
    """Stops the front ends, the workers and the master; start_servables may be called again afterwards.

    The front ends refuse new requests at once and give requests in flight `grace` seconds to finish (default:
    `server.master.context.set_stop_grace`, 10 s); those still running then get an unavailable error."""
    if grace is not None:
        check_grace(grace)
    while _pollers:
        _pollers.pop().stop()
    stop_master(grace)
