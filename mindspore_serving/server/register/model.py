"""`declare_model` and the `Model` it returns; `Model.call` runs the model from inside a Python stage
through the handler the worker installs in `spec.model_call`."""

import os
from collections.abc import Sequence

import numpy as np

from mindspore_serving import log
from mindspore_serving.common import check_type, errors
from mindspore_serving.server.register.context import Context
from mindspore_serving.server.register.options import AclOptions, GpuOptions
from mindspore_serving.server.register.placeholder import is_placeholder
from mindspore_serving.spec import registry
from mindspore_serving.spec.model_call import call_prefix, get_model_call_handler
from mindspore_serving.spec.servable import ModelSpec

MODEL_FORMATS = {"om": "OM", "mindir": "MindIR", "mindir_opt": "MindIR_Lite", "mindir_lite": "MindIR_Lite"}

_CALL_USAGE = "the inputs can be call(x1, x2) for single instance or call([[x1, x2], [x1, x2]]) for multi instances"


class Model:
    """A model declared by `declare_model`, used by `add_stage` or called with `Model.call` in a stage function."""

    def __init__(self, model_key: str, servable_name: str = "", subgraph_count: int = 1):
        self.model_key = model_key
        self.servable_name = servable_name
        self.subgraph_count = subgraph_count

    def __repr__(self):
        return f"Model({self.model_key})"

    def call(self, *args, subgraph=0):
        """Runs the model on one or several instances from inside a Python stage function.

        `model.call(x1, x2)` runs one instance and returns its only output, or a tuple of its outputs.
        `model.call([[x1, x2], (x3, x4)])` runs several instances and returns a tuple with one output tuple per
        instance. The inputs are numpy arrays (or objects with `asnumpy()`, or Python scalars). `subgraph`
        selects the file of a model declared with a list of files.

        Example::

            model = register.declare_model(model_file=["matmul_0.mindir", "matmul_1.mindir"], model_format="MindIR")

            def process(x1, x2):
                y1 = model.call(x1, subgraph=0)
                y2 = model.call(x2, subgraph=1)
                return y1, y2

        Raises:
            RuntimeError: texts starting with "Model(<key>).call() failed: " (or "Model(<key>, subgraph=<s>).call()
                failed: "), e.g. no inputs, an invalid format, an unknown subgraph or a wrong inputs count.
        """
        prefix = call_prefix(self.model_key, subgraph)
        try:
            check_type.check_int("subgraph", subgraph, 0)
        except RuntimeError as err:
            raise RuntimeError(prefix + str(err)) from None
        if not args:
            raise RuntimeError(prefix + f"no inputs provided, {_CALL_USAGE}.")
        multi_instances = len(args) == 1 and isinstance(args[0], (tuple, list))
        if multi_instances:
            raw_instances = args[0]
            for instance in raw_instances:
                if not isinstance(instance, (tuple, list)):
                    raise RuntimeError(prefix + f"inputs format invalid, {_CALL_USAGE}.")
        else:
            raw_instances = [args]
        instances = [
            tuple(_as_array(value, prefix, index, position) for position, value in enumerate(instance))
            for index, instance in enumerate(raw_instances)
        ]
        if subgraph >= self.subgraph_count:
            raise RuntimeError(
                prefix + f"The model does not have subgraph of index {subgraph}, "
                f"the subgraph count of the model is {self.subgraph_count}"
            )
        if not instances:
            raise RuntimeError(prefix + "Input instances count is 0")
        handler = get_model_call_handler()
        if handler is None:
            raise RuntimeError(prefix + "the model is not declared or not loaded")
        outputs = handler(self.model_key, subgraph, instances)
        if multi_instances:
            return tuple(tuple(instance) for instance in outputs)
        result = tuple(outputs[0])
        return result[0] if len(result) == 1 else result


def _as_array(value, prefix: str, instance_index: int, input_index: int) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if is_placeholder(value):
        raise RuntimeError(
            prefix + "inputs format invalid, Model.call() runs in stage functions and cannot take "
            "the placeholders of register_method, use add_stage instead"
        )
    if hasattr(value, "asnumpy"):
        return np.asarray(value.asnumpy())
    if isinstance(value, (bool, int, float, np.generic)):
        return np.asarray(value)
    raise RuntimeError(
        prefix + f"inputs format invalid, input {input_index} of instance {instance_index} should be "
        f"numpy.ndarray, but actually {type(value)}; {_CALL_USAGE}."
    )


def _format_files(files: Sequence[str]) -> str:
    return "[" + ", ".join(files) + "]"


def _resolve_context(context, options):
    if options is not None and not isinstance(options, (AclOptions, GpuOptions)):
        raise RuntimeError(f"Parameter 'options' should be None, GpuOptions or AclOptions, but gotten {type(options)}")
    if context is not None:
        if not isinstance(context, Context):
            raise RuntimeError(f"Parameter 'context' should be Context, but gotten {type(context)}")
        if options is not None:
            log.warning(
                "'options' will be deprecated in the future, we recommend using 'context', if these two "
                "parameters are both set, 'options' will be ignored"
            )
        return context
    if options is not None:
        log.warning("'options' will be deprecated in the future, we recommend using 'context'")
        return options.context
    return None


def declare_model(
    model_file,
    model_format,
    with_batch_dim=True,
    options=None,
    without_batch_dim_inputs=None,
    context=None,
    config_file=None,
):
    r"""Declares one model of the servable, in servable_config.py.

    The model files live in the version directories: `<servable_directory>/<servable_name>/<version>/<file>`.
    The returned `Model` is used in `add_stage(model, ...)` inside a method registered with `register_method`,
    or called with `model.call(...)` inside a Python stage function.

    Args:
        model_file (Union[str, list[str]]): the model file name, or a list of names that form one model with
            several subgraphs (subgraph index = position in the list; all must have the same batch size).
        model_format (str): "OM", "MindIR", "MindIR_Opt" or "MindIR_Lite", case ignored.
        with_batch_dim (bool): whether dim 0 of the inputs and outputs is the batch dimension. Default True.
            With False the model handles one instance per call, with its whole tensors.
        options (Union[AclOptions, GpuOptions], optional): deprecated, use `context`.
        without_batch_dim_inputs (Union[int, tuple[int], list[int]], optional): indices of the inputs that have
            no batch dimension (taken from the first instance of a batch). Default None.
        context (Context, optional): inference options, e.g. thread_num or device infos. Default None.
        config_file (str, optional): a config file for the model, absolute or relative to
            `<servable_directory>/<servable_name>/`. Default None.

    Returns:
        Model, to pass to `add_stage` or to call with `Model.call`.

    Raises:
        RuntimeError: a parameter is invalid, a model file is used by two declarations, or the servable has been
            declared as a distributed servable.

    Examples:
        >>> from mindspore_serving.server import register
        >>> add_model = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR",
        ...                                    with_batch_dim=False)
        >>> @register.register_method(output_names=["y"])
        ... def add_common(x1, x2):
        ...     y = register.add_stage(add_model, x1, x2, outputs_count=1)
        ...     return y
    """
    model_files = check_type.check_and_as_str_tuple_list("model_file", model_file)
    check_type.check_str("model_format", model_format)
    format_name = MODEL_FORMATS.get(model_format.lower())
    if format_name is None:
        raise RuntimeError("model format can only be OM, MindIR or MindIR_Lite, case ignored")
    check_type.check_bool("with_batch_dim", with_batch_dim)
    if without_batch_dim_inputs is None:
        without_batch_dim_inputs = ()
    else:
        without_batch_dim_inputs = check_type.check_and_as_int_tuple_list(
            "without_batch_dim_inputs", without_batch_dim_inputs, 0
        )
    context = _resolve_context(context, options)
    servable_directory, servable_name = registry.servable_location()
    if config_file is not None:
        check_type.check_str("config_file", config_file)
        if not os.path.isabs(config_file):
            config_file = os.path.join(servable_directory, servable_name, config_file)

    spec = registry.get_or_create_servable_spec(servable_name)
    if spec.distributed:
        raise RuntimeError("Declare model failed, servable has already been declared as distributed servable")
    model_key = ";".join(model_files)
    used_files = {name for model in spec.models.values() for name in model.model_files}
    for name in model_files:  # declaring the same model again is reported so too, as MindSpore Serving does
        if name in used_files:
            raise errors.core_failure(
                f"Declare model {_format_files(model_files)} failed, model file '{name}' has already been used"
            )
    spec.models[model_key] = ModelSpec(
        model_key=model_key,
        model_files=model_files,
        model_format=format_name,
        with_batch_dim=with_batch_dim,
        without_batch_dim_inputs=without_batch_dim_inputs,
        context=context,
        config_file=config_file,
    )
    log.info(f"declare model {model_key} of servable {servable_name}")
    return Model(model_key, servable_name, len(model_files))
