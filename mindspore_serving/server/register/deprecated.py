"""The MindSpore Serving 1.x interfaces, kept for old servable_config.py files.

`declare_servable` is `declare_model`; the `call_*` interfaces are fixed kinds of `add_stage`, used in a
fixed order inside `register_method`: `call_preprocess[_pipeline]` at most once, then `call_servable` exactly
once, then `call_postprocess[_pipeline]` at most once. Each call logs a deprecation warning.
"""

from mindspore_serving.server.register._deprecation import deprecated
from mindspore_serving.server.register._legacy_ast import LegacyMeta
from mindspore_serving.server.register.method import _LegacyState, add_stage, current_recorder
from mindspore_serving.server.register.model import Model, declare_model
from mindspore_serving.server.register.options import AclOptions, GpuOptions

__all__ = [
    "declare_servable",
    "call_preprocess",
    "call_preprocess_pipeline",
    "call_servable",
    "call_postprocess",
    "call_postprocess_pipeline",
    "AclOptions",
    "GpuOptions",
]

_ADD_STAGE = "mindspore_serving.server.register.add_stage"


@deprecated("mindspore_serving.server.register.declare_model")
def declare_servable(servable_file, model_format, with_batch_dim=True, options=None, without_batch_dim_inputs=None):
    """Deprecated: use `declare_model`. Declares the single model of the servable."""
    return declare_model(
        servable_file,
        model_format,
        with_batch_dim=with_batch_dim,
        options=options,
        without_batch_dim_inputs=without_batch_dim_inputs,
    )


def _legacy(interface: str):
    recorder = current_recorder(interface)
    if recorder.legacy is None:  # the method's own statements call no call_*: this call comes from elsewhere
        recorder.legacy = _LegacyState(LegacyMeta(), recorder.method.name)
    return recorder, recorder.legacy


def _check_failed(recorder, text: str):
    raise RuntimeError(f"Check failed in method '{recorder.method.name}', {text}")


_PREPROCESS = "call_preprocess or call_preprocess_pipeline"
_POSTPROCESS = "call_postprocess or call_postprocess_pipeline"


def _preprocess(interface: str, func, args, batch_size):
    """call_preprocess[_pipeline]: at most once, before call_servable and call_postprocess[_pipeline]."""
    recorder, state = _legacy(interface)
    if state.preprocess:
        _check_failed(recorder, f"{_PREPROCESS} should not be invoked more than once")
    if state.servable:
        _check_failed(recorder, f"call_servable should be invoked after {interface}")
    if state.postprocess:
        _check_failed(recorder, f"{_POSTPROCESS} should be invoked after {interface}")
    state.preprocess = True
    return add_stage(func, *args, outputs_count=state.outputs_count(interface), batch_size=batch_size, tag="Preprocess")


def _postprocess(interface: str, func, args, batch_size):
    """call_postprocess[_pipeline]: at most once."""
    recorder, state = _legacy(interface)
    if state.postprocess:
        _check_failed(recorder, f"{_POSTPROCESS} should not be invoked more than once")
    state.postprocess = True
    return add_stage(
        func, *args, outputs_count=state.outputs_count(interface), batch_size=batch_size, tag="Postprocess"
    )


@deprecated(_ADD_STAGE)
def call_preprocess(preprocess_fun, *args):
    """Deprecated: use `add_stage(preprocess_fun, *args, outputs_count=...)`. Called once per instance."""
    return _preprocess("call_preprocess", preprocess_fun, args, None)


@deprecated(_ADD_STAGE)
def call_preprocess_pipeline(preprocess_fun, *args):
    """Deprecated: use `add_stage(preprocess_fun, *args, outputs_count=..., batch_size=0)`."""
    return _preprocess("call_preprocess_pipeline", preprocess_fun, args, 0)


@deprecated(_ADD_STAGE)
def call_servable(*args):
    """Deprecated: use `add_stage(model, *args, outputs_count=...)` with the model of `declare_model`."""
    recorder, state = _legacy("call_servable")
    if state.servable:
        _check_failed(recorder, "call_servable should not be invoked more than once")
    if state.postprocess:
        _check_failed(recorder, f"{_POSTPROCESS} should be invoked after call_servable")
    state.servable = True
    models = recorder.servable.models
    if not models:
        raise RuntimeError("There is no model declared, you can use declare_model to declare models.")
    outputs_count = state.outputs_count("call_servable")
    if len(models) > 1:
        raise RuntimeError(
            "There are more than one servable declared when the interface 'call_servable' is used, "
            "use 'add_stage' to replace 'call_servable'"
        )
    model_spec = next(iter(models.values()))
    model = Model(model_spec.model_key, recorder.servable.name, len(model_spec.model_files))
    return add_stage(model, *args, outputs_count=outputs_count)


@deprecated(_ADD_STAGE)
def call_postprocess(postprocess_fun, *args):
    """Deprecated: use `add_stage(postprocess_fun, *args, outputs_count=...)`. Called once per instance."""
    return _postprocess("call_postprocess", postprocess_fun, args, None)


@deprecated(_ADD_STAGE)
def call_postprocess_pipeline(postprocess_fun, *args):
    """Deprecated: use `add_stage(postprocess_fun, *args, outputs_count=..., batch_size=0)`."""
    return _postprocess("call_postprocess_pipeline", postprocess_fun, args, 0)
