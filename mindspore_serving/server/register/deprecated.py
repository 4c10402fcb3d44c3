"""The MindSpore Serving 1.x interfaces, kept for old servable_config.py files.

`declare_servable` is `declare_model`; the `call_*` interfaces are fixed kinds of `add_stage`, used in a
fixed order inside `register_method`: `call_preprocess[_pipeline]` at most once, then `call_servable` exactly
once, then `call_postprocess[_pipeline]` at most once. Each call logs a deprecation warning.
"""
from mindspore_serving.server.register._deprecation import deprecated
from mindspore_serving.server.register.method import _LegacyState, add_stage, current_recorder
from mindspore_serving.server.register.model import Model, declare_model
from mindspore_serving.server.register.options import AclOptions, GpuOptions

__all__ = ["declare_servable", "call_preprocess", "call_preprocess_pipeline", "call_servable", "call_postprocess",
           "call_postprocess_pipeline", "AclOptions", "GpuOptions"]

_ADD_STAGE = "mindspore_serving.server.register.add_stage"


@deprecated("mindspore_serving.server.register.declare_model")
def declare_servable(servable_file, model_format, with_batch_dim=True, options=None, without_batch_dim_inputs=None):
    """Deprecated: use `declare_model`. Declares the single model of the servable."""
    return declare_model(servable_file, model_format, with_batch_dim=with_batch_dim, options=options,
                         without_batch_dim_inputs=without_batch_dim_inputs)


def _legacy(interface: str):
    recorder = current_recorder(interface)
    if recorder.legacy is None:  # the source could not be read: enforce the order anyway
        recorder.legacy = _LegacyState({})
    return recorder, recorder.legacy


def _check_failed(recorder, text: str):
    raise RuntimeError(f"Check failed in method '{recorder.method.name}', {text}")


# the 1.x stages in the order register_method must call them, and how their errors name each one
_STAGES = ("preprocess", "servable", "postprocess")
_STAGE_INTERFACES = {"preprocess": "call_preprocess or call_preprocess_pipeline", "servable": "call_servable",
                     "postprocess": "call_postprocess or call_postprocess_pipeline"}


def _enter(interface: str, stage: str):
    """The recorder and legacy state for a call of `stage`, once the 1.x order allows it: each stage at most once,
    none after a later one."""
    recorder, state = _legacy(interface)
    if getattr(state, stage):
        _check_failed(recorder, f"{_STAGE_INTERFACES[stage]} should not be invoked more than once")
    for later in _STAGES[_STAGES.index(stage) + 1:]:
        if getattr(state, later):
            _check_failed(recorder, f"{_STAGE_INTERFACES[later]} should be invoked after call_{stage}")
    return recorder, state


def _process(interface: str, stage: str, func, args, batch_size):
    """A preprocess or postprocess stage of the 1.x interfaces."""
    _, state = _enter(interface, stage)
    setattr(state, stage, True)
    return add_stage(func, *args, outputs_count=state.outputs_count(interface), batch_size=batch_size,
                     tag=stage.capitalize())


@deprecated(_ADD_STAGE)
def call_preprocess(preprocess_fun, *args):
    """Deprecated: use `add_stage(preprocess_fun, *args, outputs_count=...)`. Called once per instance."""
    return _process("call_preprocess", "preprocess", preprocess_fun, args, None)


@deprecated(_ADD_STAGE)
def call_preprocess_pipeline(preprocess_fun, *args):
    """Deprecated: use `add_stage(preprocess_fun, *args, outputs_count=..., batch_size=0)`."""
    return _process("call_preprocess_pipeline", "preprocess", preprocess_fun, args, 0)


@deprecated(_ADD_STAGE)
def call_servable(*args):
    """Deprecated: use `add_stage(model, *args, outputs_count=...)` with the model of `declare_model`."""
    recorder, state = _enter("call_servable", "servable")
    models = recorder.servable.models
    if not models:
        raise RuntimeError("There is no model declared, you can use declare_model to declare models")
    if len(models) > 1:
        raise RuntimeError(f"There are {len(models)} models declared, 'call_servable' can only be used when one "
                           f"model is declared, use 'add_stage' to replace 'call_servable'")
    state.servable = True
    model_spec = next(iter(models.values()))
    model = Model(model_spec.model_key, recorder.servable.name, len(model_spec.model_files))
    return add_stage(model, *args, outputs_count=state.outputs_count("call_servable"))


@deprecated(_ADD_STAGE)
def call_postprocess(postprocess_fun, *args):
    """Deprecated: use `add_stage(postprocess_fun, *args, outputs_count=...)`. Called once per instance."""
    return _process("call_postprocess", "postprocess", postprocess_fun, args, None)


@deprecated(_ADD_STAGE)
def call_postprocess_pipeline(postprocess_fun, *args):
    """Deprecated: use `add_stage(postprocess_fun, *args, outputs_count=..., batch_size=0)`."""
    return _process("call_postprocess_pipeline", "postprocess", postprocess_fun, args, 0)
