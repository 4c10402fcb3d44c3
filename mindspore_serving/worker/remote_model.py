"""Models that another worker runs: what an extra worker (num_parallel_workers) uses instead of loading them.

A worker that owns the models registers their shapes (`model_infos`). An extra worker asks the master for them
(GetModelInfo), so that it checks model inputs and sizes output buffers exactly as the owner would, without
MindSpore. Its model stages and Model.call send the instances through the master (CallModel) to a worker that owns
the models, which runs them in the same batches as its own (`serve_model_call`). Tensors travel in shared memory
(ipc/shm_tensors.py).
"""

from collections.abc import Callable

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import dtype_to_proto, proto_to_dtype
from mindspore_serving.ipc import shm_tensors
from mindspore_serving.proto import internal_pb2
from mindspore_serving.proto import ms_service_pb2 as pb
from mindspore_serving.spec.servable import ModelSpec
from mindspore_serving.worker.executors import ModelExecutor, _BatchLoop, _Item
from mindspore_serving.worker.model_backend import LoadedModel, TensorInfo

MAX_CALL_INSTANCES = 64
"""Instances of one model call at most (at least a batch of the model): the owner cuts them into its batches."""


# ------------------------------------------------------------------------------------- model infos


def _info_to_proto(info: TensorInfo) -> pb.TensorInfo:
    message = pb.TensorInfo(size=max(0, info.nbytes))
    message.shape.dims.extend(int(dim) for dim in info.shape)
    try:
        message.dtype = dtype_to_proto(info.dtype)
    except TypeError:
        message.dtype = pb.MS_UNKNOWN
    return message


def _info_from_proto(message: pb.TensorInfo) -> TensorInfo | None:
    try:
        return TensorInfo(tuple(message.shape.dims), proto_to_dtype(message.dtype))
    except ValueError:  # a dtype without numpy counterpart: unknown
        return None


def model_infos(models: dict[str, LoadedModel]) -> dict[str, internal_pb2.ModelInfo]:
    """What a worker that loaded `models` registers about them."""
    infos = {}
    for key, model in models.items():
        info = infos[key] = internal_pb2.ModelInfo(batch_size=model.batch_size)
        for graph in model.subgraphs:
            subgraph = info.subgraph_infos.add()
            subgraph.inputs.extend(_info_to_proto(item) for item in graph.inputs)
            subgraph.outputs.extend(_info_to_proto(item) for item in graph.outputs)
    return infos


class _RemoteSubgraph:
    def __init__(self, info: internal_pb2.SubgraphInfo):
        self.path = "(another worker)"
        self.inputs = [_info_from_proto(item) for item in info.inputs]
        outputs = [_info_from_proto(item) for item in info.outputs]
        self.outputs = outputs if None not in outputs else []  # an output of unknown dtype: sizes unknown

    def run(self, inputs):
        raise RuntimeError("a model of another worker runs through its executor")


class RemoteModel(LoadedModel):
    """A declared model whose shapes come from the worker that loaded it."""

    def __init__(self, spec: ModelSpec, info: internal_pb2.ModelInfo):  # pylint: disable=super-init-not-called
        self.spec = spec
        self.subgraphs = [_RemoteSubgraph(subgraph) for subgraph in info.subgraph_infos]
        if None in (item for graph in self.subgraphs for item in graph.inputs):
            raise RuntimeError(f"model {spec.model_key} has an input of a data type that cannot be sent")
        self.batch_size = max(1, info.batch_size)
        self.device_target = "remote"


def remote_models(spec, reply: internal_pb2.GetModelInfoReply) -> dict[str, RemoteModel]:
    """The servable's declared models from the master's GetModelInfo answer; RuntimeError when it failed."""
    if reply.error.error_code:
        raise RuntimeError(reply.error.error_msg.decode(errors="replace"))
    missing = [key for key in spec.models if key not in reply.model_infos]
    if missing:
        raise RuntimeError(
            f"the workers that loaded servable {spec.name} do not have models {missing}: their "
            f"servable_config.py differs from this one"
        )
    return {key: RemoteModel(model_spec, reply.model_infos[key]) for key, model_spec in spec.models.items()}


# ------------------------------------------------------------------------------------- the caller

ModelCaller = Callable[[internal_pb2.CallModelRequest], internal_pb2.CallModelReply]


class RemoteModelExecutor(_BatchLoop):
    """An extra worker's executor of one model subgraph: collects the instances its stages submit (those announced
    to it arrive together) and sends them in one call to a worker that owns the model."""

    def __init__(
        self,
        model: RemoteModel,
        subgraph: int,
        max_wait: float,
        call: ModelCaller,
        version_number: int,
        servable_name: str,
        namer: shm_tensors.BlockNamer | None,
    ):
        self.model = model
        self.subgraph = subgraph
        self.instance_infos = model.instance_inputs(subgraph)
        self.output_infos = model.instance_outputs(subgraph)
        self._call = call
        self._namer = namer
        self._told = False  # logged how its calls travel
        self._request_head = internal_pb2.CallModelRequest(
            servable_name=servable_name,
            version_number=version_number,
            model_key=model.spec.model_key,
            subgraph=subgraph,
        )
        super().__init__(
            f"remote-{model.spec.model_key}-{subgraph}",
            max(model.batch_size, MAX_CALL_INSTANCES // model.batch_size * model.batch_size),
            max_wait,
        )

    @property
    def inputs_count(self) -> int:
        return len(self.instance_infos)

    check = ModelExecutor.check

    def _run(self, items: list[_Item]):
        request = internal_pb2.CallModelRequest()
        request.CopyFrom(self._request_head)
        block = None
        try:
            block = shm_tensors.encode_call(
                [item.inputs for item in items], self.output_infos, request.instances, self._namer
            )
            if not self._told:
                self._told = True
                log.info(
                    f"model {self.model.spec.model_key} subgraph {self.subgraph} runs in a worker owning it; "
                    f"the tensors of its calls travel " + ("in shared memory" if block else "in the messages")
                )
            reply = self._call(request)
            results = self._answers(reply, len(items), block)
        except Exception as err:  # the call could not be made: every instance gets the reason
            log.warning(f"model call of {self.model.spec.model_key} subgraph {self.subgraph} failed: {err}")
            results = [RuntimeError(f"model predict failed: {err}")] * len(items)
        finally:
            if block is not None:
                block.release()
        for item, result in zip(items, results):
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    def _answers(self, reply: internal_pb2.CallModelReply, count: int, block) -> list:
        if len(reply.error_msg) == 1 and not reply.instances:
            return [RuntimeError(reply.error_msg[0].error_msg.decode(errors="replace"))] * count
        if len(reply.instances) != count or len(reply.error_msg) != count:
            raise RuntimeError(f"the model call answered {len(reply.instances)} of {count} instances")
        results = []
        for instance_pb, error in zip(reply.instances, reply.error_msg):
            if error.error_code:
                results.append(RuntimeError(error.error_msg.decode(errors="replace")))
                continue
            try:
                results.append(shm_tensors.decode_outputs(instance_pb, len(instance_pb.items), block))
            except Exception as err:
                results.append(RuntimeError(f"model predict failed: {err}"))
        return results


# ------------------------------------------------------------------------------------- the owner


def serve_model_call(runtime, request: internal_pb2.CallModelRequest) -> internal_pb2.CallModelReply:
    """Runs a forwarded model call on this worker's models, in the same batches as its own instances."""
    reply = internal_pb2.CallModelReply()
    blocks = shm_tensors.AttachedBlocks()
    try:
        instances: list[tuple | None] = []
        results: list = []
        for instance_pb in request.instances:
            try:
                instances.append(blocks.inputs(instance_pb))
                results.append(None)
            except Exception as err:
                instances.append(None)
                results.append(RuntimeError(f"model predict failed: {err}"))
        runnable = [index for index, inputs in enumerate(instances) if inputs is not None]
        try:
            answers = runtime.run_model(request.model_key, request.subgraph, [instances[i] for i in runnable])
        except Exception as err:  # no such model: the whole call fails
            reply.error_msg.add(error_code=errors.FAILED, error_msg=str(err).encode())
            return reply
        for index, answer in zip(runnable, answers):
            results[index] = answer
        for instance_pb, result in zip(request.instances, results):
            answer_pb = reply.instances.add()
            error = reply.error_msg.add()
            if isinstance(result, BaseException):
                error.error_code = errors.FAILED
                error.error_msg = str(result).encode()
                continue
            try:
                blocks.write_outputs(result, instance_pb, answer_pb)
            except Exception as err:
                answer_pb.Clear()
                error.error_code = errors.FAILED
                error.error_msg = f"model predict failed: {err}".encode()
        return reply
    finally:
        blocks.close()
