"""An extra worker process (`ServableStartConfig.num_parallel_workers`): one more process running a servable's
Python stages beside its device workers, as MindSpore Serving's start_extra_worker.py.

Started by the master as `python -m mindspore_serving.worker.start_extra_worker ... --extra_index=<i>` once the
servable's device workers have registered (the master starts none for a servable whose methods are all model
stages). The master sends it requests like any worker. It does not load the models: GetModelInfo gives their
shapes, and its model stages and Model.call go through the master to a worker that owns the models
(worker/remote_model.py), so it never imports MindSpore unless servable_config.py does.

As in MindSpore Serving, it loads the models itself, and then owns a device, when they run on CPU: device type
"cpu", or device type None with no device_ids (the only workers of such a servable are extra workers).
"""

from mindspore_serving.common.native_protobuf import prefer_native_protobuf

prefer_native_protobuf()  # before protobuf is imported (see the module)

# pylint: disable=wrong-import-position
import functools  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from mindspore_serving.common import errors  # noqa: E402
from mindspore_serving.ipc import shm_tensors  # noqa: E402
from mindspore_serving.proto import internal_pb2  # noqa: E402
from mindspore_serving.worker import process  # noqa: E402
from mindspore_serving.worker.remote_model import RemoteModelExecutor, model_infos, remote_models  # noqa: E402
from mindspore_serving.worker.servable_loader import import_servable_config, load_servable, resolve_version  # noqa: E402
from mindspore_serving.worker.servable_runtime import ServableRuntime  # noqa: E402

GET_MODEL_INFO_TIMEOUT = 30.0


def parse_args(argv=None):
    parser = process.servable_arguments("MindSpore Serving extra worker")
    parser.add_argument("--device_ids_empty", action="store_true", help="the servable has no device workers")
    parser.add_argument("--extra_index", type=int, required=True)
    args = parser.parse_args(argv)
    args.device_id = 0
    return args


def loads_models_itself(device_type: str, device_ids_empty: bool) -> bool:
    """Whether an extra worker loads the declared models (on CPU) rather than calling a device worker's."""
    device_type = (device_type or "none").lower()
    return device_type == "cpu" or (device_type == "none" and device_ids_empty)


class ExtraWorker(process.Worker):
    def __init__(self, args):
        super().__init__(args)
        self.owns_models = False

    @property
    def device_label(self) -> str:
        return f"version{self.args.version_number}_extra{self.args.extra_index}"

    def load(self):
        args = self.args
        dec_key = bytes.fromhex(sys.stdin.readline().strip()) if args.read_dec_key else None
        spec = import_servable_config(args.servable_directory, args.servable_name)
        if spec is None or not spec.methods and spec.extension is None:
            raise errors.core_failure("There is no method registered for servable")
        if (
            spec.extension is not None
            and args.device_ids_empty
            or spec.models
            and loads_models_itself(args.device_type, args.device_ids_empty)
        ):
            self.owns_models = True
            device_type = "cpu" if spec.extension is None and args.device_type.lower() == "none" else args.device_type
            return load_servable(
                args.servable_directory,
                args.servable_name,
                args.version_number,
                device_type,
                args.device_id,
                dec_key,
                args.dec_mode,
                on_fatal=self.fail,
                socket_directory=self.socket_directory,
            )
        if spec.extension is not None:
            raise RuntimeError(f"servable {args.servable_name} is served by its device workers alone")
        version = resolve_version(args.servable_directory, args.servable_name, args.version_number, bool(spec.models))
        models = {}
        if spec.models:
            reply = self.master.GetModelInfo(
                internal_pb2.GetModelInfoRequest(servable_name=args.servable_name, version_number=version),
                timeout=GET_MODEL_INFO_TIMEOUT,
            )
            models = remote_models(spec, reply)
        make_executor = functools.partial(
            RemoteModelExecutor,
            call=self.master.CallModel,
            version_number=version,
            servable_name=args.servable_name,
            namer=shm_tensors.BlockNamer(self.parent_pid),
        )
        version_dir = os.path.join(args.servable_directory, args.servable_name, str(version))
        runtime = ServableRuntime(spec, version_dir, models=models, make_executor=make_executor)
        runtime.device_type = "none"
        return runtime, version

    def registration(self) -> dict:
        fields = {"owns_device": self.owns_models, "extra": True, "extra_index": self.args.extra_index}
        if self.owns_models:
            fields["model_infos"] = model_infos(getattr(self.runtime, "models", {}))
        return fields


def main(argv=None):
    return process.main(argv, worker_class=ExtraWorker, parse=parse_args)
