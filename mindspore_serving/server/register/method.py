"""`register_method` and `add_stage`: a method is recorded once, at import time, as a list of stages.

The decorated function is called with placeholders (`_TensorDef`) instead of data; every `add_stage`
appends a `StageSpec` to the method being recorded and returns placeholders for the stage's outputs.
"""

import inspect

from mindspore_serving import log
from mindspore_serving.common import check_type, errors
from mindspore_serving.server.register._legacy_ast import LegacyMeta, complex_statements_text, parse_legacy_calls
from mindspore_serving.server.register.model import Model
from mindspore_serving.server.register.placeholder import _TensorDef
from mindspore_serving.spec import registry
from mindspore_serving.spec.servable import (
    BUILTIN_STAGE_NAMES,
    STAGE_BUILTIN,
    STAGE_FUNCTION,
    STAGE_MODEL,
    MethodSpec,
    ServableSpec,
    StageSpec,
)


class _LegacyState:
    """What the 1.x call_* interfaces did so far in the method being recorded."""

    def __init__(self, meta: LegacyMeta, method_name: str):
        self.meta = meta
        self.method_name = method_name
        self.invoked: dict[str, int] = {}
        self.preprocess = False
        self.servable = False
        self.postprocess = False

    def outputs_count(self, name: str) -> int:
        """The outputs count of this call of `name`, from the assignment it appears in."""
        index = self.invoked.get(name, 0)
        self.invoked[name] = index + 1
        counts = self.meta.counts.get(name, [])
        if index < len(counts):
            return counts[index]
        if self.meta.source_known:  # called where the method's top-level statements do not show it
            raise RuntimeError(complex_statements_text(self.method_name, name))
        return 1


class _MethodRecorder:
    """The method whose register_method function is running."""

    def __init__(self, servable: ServableSpec, method: MethodSpec, legacy: _LegacyState | None):
        self.servable = servable
        self.method = method
        self.legacy = legacy
        self.functions: dict[str, tuple[int, int, bool]] = {}  # committed to the registry on success

    def function_info(self, key: str):
        return self.functions.get(key) or registry.stage_function_info(key)


_recorder: _MethodRecorder | None = None


def current_recorder(interface: str) -> _MethodRecorder:
    if _recorder is None:
        raise RuntimeError(f"'{interface}' should be invoked in the function registered by register_method")
    return _recorder


def _input_names(func, method_name: str) -> list[str]:
    names = []
    for name, param in inspect.signature(func).parameters.items():
        if param.kind == inspect.Parameter.VAR_POSITIONAL:
            raise RuntimeError(f"'{method_name}' input {name} cannot be VAR_POSITIONAL !")
        if param.kind == inspect.Parameter.VAR_KEYWORD:
            raise RuntimeError(f"'{method_name}' input {name} cannot be VAR_KEYWORD !")
        if param.kind == inspect.Parameter.KEYWORD_ONLY:
            raise RuntimeError(f"'{method_name}' input {name} cannot be KEYWORD_ONLY !")
        names.append(name)
    return names


def _output_refs(returned, recorder: _MethodRecorder):
    values = returned if isinstance(returned, (tuple, list)) else (returned,)
    for value in values:
        if not isinstance(value, _TensorDef) or value.owner is not recorder:
            raise RuntimeError(
                "Each value returned is a placeholder for data and must come from the method inputs "
                "or the outputs of add_stage"
            )
    return [value.ref for value in values]


def register_method(output_names):
    """Registers a method of the servable, in servable_config.py.

    The decorated function describes the method as a pipeline of stages built with `add_stage`. Its parameter
    names are the method's input names and `output_names` names what it returns. It runs **once, when
    servable_config.py is imported**: the parameters are placeholders for the request data, not data, so the
    function may only pass them to `add_stage` and return placeholders (no arithmetic, conditions or loops on
    them). At serving time every instance of a request flows through the stages in order.

    Args:
        output_names (Union[str, tuple[str], list[str]]): the names of the method's outputs.

    Raises:
        RuntimeError: the parameters are *args, **kwargs or keyword-only; the function returns something that
            is not a placeholder; the number of returned values differs from `output_names`; or the method name
            has been registered before.

    Examples:
        >>> import numpy as np
        >>> from mindspore_serving.server import register
        >>> add_model = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR",
        ...                                    with_batch_dim=False)
        >>> def add_trans_datatype(x1, x2):
        ...     return x1.astype(np.float32), x2.astype(np.float32)
        >>> @register.register_method(output_names=["y"])
        ... def add_cast(x1, x2):
        ...     x1, x2 = register.add_stage(add_trans_datatype, x1, x2, outputs_count=2)
        ...     y = register.add_stage(add_model, x1, x2, outputs_count=1)
        ...     return y

        A client then calls method "add_cast" of servable "add" with instances such as {"x1": ..., "x2": ...}
        and gets {"y": ...} back.
    """
    output_names = check_type.check_and_as_str_tuple_list("output_names", output_names)

    def register(func):
        global _recorder  # pylint: disable=global-statement
        _, servable_name = registry.servable_location()
        method_name = getattr(func, "__name__", str(func))
        input_names = _input_names(func, method_name)
        servable = registry.get_or_create_servable_spec(servable_name)
        if method_name in servable.methods:
            raise errors.core_failure(f"Method {method_name} has been registered more than once.")
        if _recorder is not None:
            raise RuntimeError("register_method cannot be used inside another method registered by register_method")
        meta = parse_legacy_calls(func, method_name, len(output_names))
        method = MethodSpec(name=method_name, input_names=input_names, output_names=list(output_names))
        recorder = _MethodRecorder(servable, method, _LegacyState(meta, method_name) if meta is not None else None)
        _recorder = recorder
        try:
            returned = func(*[_TensorDef(0, index, recorder) for index in range(len(input_names))])
        finally:
            _recorder = None
        if meta is not None and meta.calls and meta.source_known and meta.calls != len(method.stages):
            raise RuntimeError(
                f"Failed to parse method {method_name}, the number of stages obtained through the AST "
                f"{meta.calls} is inconsistent with the running result {len(method.stages)}. "
                f"Condition and loop statements are not supported in methods currently."
            )
        if recorder.legacy is not None and not recorder.legacy.servable:
            raise RuntimeError("Not find the invoke of 'call_servable'")
        method.outputs = _output_refs(returned, recorder)
        if len(method.outputs) != len(output_names):
            raise RuntimeError(
                f"Method return output size {len(method.outputs)} not match registered {len(output_names)}"
            )
        for key, info in recorder.functions.items():
            registry.set_stage_function_info(key, *info)
        servable.methods[method_name] = method
        log.info(
            f"register method {method_name} of servable {servable_name}: inputs {input_names}, "
            f"outputs {list(output_names)}, {len(method.stages)} stages"
        )
        return func

    return register


def _positional_count(func) -> int | None:
    """How many positional arguments `func` takes; None when it accepts any number."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    count = 0
    for param in params:
        if param.kind == inspect.Parameter.VAR_POSITIONAL:
            return None
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


def _function_stage(
    recorder: _MethodRecorder, func, inputs_count: int, outputs_count: int, batch_size: int | None
) -> StageSpec:
    servable_name = recorder.servable.name
    func_name = getattr(func, "__name__", type(func).__name__)
    key = f"{servable_name}.{func_name}"
    if batch_size is None:
        arity = _positional_count(func)
        if arity is not None and arity != inputs_count:
            raise RuntimeError(
                f"function {func_name} input args count {arity} not match the count {inputs_count} registered in method"
            )
    last = recorder.function_info(key)
    method_name = recorder.method.name
    if last is not None:
        last_inputs, last_outputs, last_batch = last
        if last_inputs != inputs_count:
            raise RuntimeError(
                f"Stage function '{key}' inputs count {inputs_count} not match last registered count "
                f"{last_inputs}, method name '{method_name}'"
            )
        if last_outputs != outputs_count:
            raise RuntimeError(
                f"Stage function '{key}' outputs count {outputs_count} not match last registered "
                f"count {last_outputs}, method name '{method_name}'"
            )
        if last_batch != (batch_size is not None):
            raise RuntimeError(
                f"Failed to add stage function {key}: parameter 'batch_size' in multiple 'add_stage' "
                f"should be enabled or disabled consistently"
            )
    recorder.functions[key] = (inputs_count, outputs_count, batch_size is not None)
    return StageSpec(
        kind=STAGE_FUNCTION,
        tag=f"Function '{key}'",
        inputs=[],
        outputs_count=outputs_count,
        batch_size=batch_size,
        function=func,
        function_key=key,
    )


def _model_stage(
    recorder: _MethodRecorder, model: Model, inputs_count: int, outputs_count: int, batch_size: int | None
) -> StageSpec:
    model_spec = recorder.servable.models.get(model.model_key)
    if model_spec is None:
        raise RuntimeError(
            f"Check failed in method '{recorder.method.name}', the parameter 'stage' of add_stage must "
            f"be function or Model returned by declare_model, and ensure that interface "
            f"'declare_model' can take effect when importing servable_config.py by the serving server"
        )
    subgraph = 0
    old = model_spec.io_counts.get(subgraph)
    if old is not None:
        if old[0] != inputs_count:
            raise errors.core_failure(
                f"RegisterInputOutputInfo failed, inputs count {inputs_count} not match old count {old[0]}"
            )
        if old[1] != outputs_count:
            raise errors.core_failure(
                f"RegisterInputOutputInfo failed, outputs count {outputs_count} not match old count {old[1]}"
            )
    model_spec.io_counts[subgraph] = (inputs_count, outputs_count)
    return StageSpec(
        kind=STAGE_MODEL,
        tag=f"Model '{model.model_key}'",
        inputs=[],
        outputs_count=outputs_count,
        batch_size=batch_size,
        model_key=model.model_key,
        subgraph=subgraph,
    )


def _builtin_stage(name: str, outputs_count: int, batch_size: int | None) -> StageSpec:
    if not name or name not in BUILTIN_STAGE_NAMES:
        raise RuntimeError(
            f"Stage function '{name}' is not defined, the built-in stage functions: {sorted(BUILTIN_STAGE_NAMES)}"
        )
    return StageSpec(
        kind=STAGE_BUILTIN,
        tag=f"Function '{name}'",
        inputs=[],
        outputs_count=outputs_count,
        batch_size=batch_size,
        builtin_name=name,
    )


def add_stage(stage, *args, outputs_count, batch_size=None, tag=None):
    r"""Adds a stage to the method being registered, inside a function decorated by `register_method`.

    A stage is a Python function, a model declared by `declare_model`, or the name of a built-in stage
    (e.g. "argmax_cpp"). It takes the placeholders `*args` (method inputs or outputs of earlier stages) and
    produces `outputs_count` outputs.

    Args:
        stage (Union[function, Model, str]): what the stage runs.
        args: the stage inputs, each a placeholder from the method inputs or an earlier add_stage.
        outputs_count (int): the number of outputs of the stage, >= 1.
        batch_size (int, optional): only for Python functions. None (default): the function is called once per
            instance with the instance's inputs as arguments, `func(x1, x2)`, and its parameters count must equal
            len(args). An int >= 0: the function gets a list of up to batch_size instances (each a tuple of
            inputs) and returns a list/tuple, or yields, one result per instance; 0 lets the server pick the
            size from the models of the method.
        tag (str, optional): the name of the stage in error messages. Default "Function '<servable>.<name>'" or
            "Model '<model key>'".

    Returns:
        One placeholder when outputs_count is 1, otherwise a tuple of outputs_count placeholders.

    Raises:
        RuntimeError: an argument is not a placeholder, the stage is of an unsupported type, or the counts do not
            match earlier registrations of the same function or model.

    Examples:
        >>> import numpy as np
        >>> from mindspore_serving.server import register
        >>> add_model = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR",
        ...                                    with_batch_dim=False)
        >>> def preprocess(instances):
        ...     for x1, x2 in instances:
        ...         yield x1.astype(np.float32), x2.astype(np.float32)
        >>> @register.register_method(output_names="y")
        ... def add_cast(x1, x2):
        ...     x1, x2 = register.add_stage(preprocess, x1, x2, outputs_count=2, batch_size=4)
        ...     y = register.add_stage(add_model, x1, x2, outputs_count=1)
        ...     return y
    """
    recorder = current_recorder("add_stage")
    if tag is not None:
        check_type.check_str("tag", tag)
    check_type.check_int("outputs_count", outputs_count, 1)
    if batch_size is not None:
        check_type.check_int("batch_size", batch_size, 0)
    for item in args:
        if not isinstance(item, _TensorDef) or item.owner is not recorder:
            raise RuntimeError(
                "Each value of parameter *args is a placeholder for data and must come from the "
                "method inputs or the outputs of add_stage"
            )
    if isinstance(stage, Model):
        spec = _model_stage(recorder, stage, len(args), outputs_count, batch_size)
    elif isinstance(stage, str):
        spec = _builtin_stage(stage, outputs_count, batch_size)
    elif inspect.isfunction(stage) or inspect.ismethod(stage) or inspect.isbuiltin(stage):
        spec = _function_stage(recorder, stage, len(args), outputs_count, batch_size)
    else:
        raise RuntimeError(
            f"Check failed in method '{recorder.method.name}', the parameter 'stage' of add_stage must "
            f"be function or Model returned by declare_model, now is {type(stage)}"
        )
    spec.inputs = [item.ref for item in args]
    if tag is not None:
        spec.tag = tag
    recorder.method.stages.append(spec)
    stage_index = len(recorder.method.stages)
    outputs = tuple(_TensorDef(stage_index, index, recorder) for index in range(outputs_count))
    return outputs[0] if outputs_count == 1 else outputs
