"""`declare_servable` of server.distributed: only records the declaration (see spec), like server.register."""

from mindspore_serving import log
from mindspore_serving.common import check_type
from mindspore_serving.server.register.model import Model
from mindspore_serving.spec import registry
from mindspore_serving.spec.servable import DistributedSpec, ModelSpec


def declare_servable(
    rank_size, stage_size, with_batch_dim=True, without_batch_dim_inputs=None, enable_pipeline_infer=False
):
    """Declares, in servable_config.py, that the servable's model is distributed over `rank_size` ranks.

    The model files are not named here: `startup_agents(model_files=...)` gives each rank its own graph. With
    `stage_size` > 1 the ranks form a pipeline of `stage_size` stages of rank_size/stage_size ranks each: stage 0
    gets the inputs, each stage's outputs (from its last rank) are the next stage's inputs, and the last rank's
    outputs are the model's outputs.

    Args:
        rank_size (int): the number of ranks, >= 1; the rank table must list exactly as many.
        stage_size (int): the number of pipeline stages, >= 1; rank_size must be a multiple of it.
        with_batch_dim (bool): whether dim 0 of the inputs and outputs is the batch. Default True.
        without_batch_dim_inputs (Union[int, tuple[int], list[int]], optional): inputs without a batch dim.
        enable_pipeline_infer (bool): accepted for compatibility. Default False.

    Returns:
        Model, to use with `add_stage` or `Model.call` like a model of declare_model.

    Raises:
        RuntimeError: a parameter is invalid, or the servable already declared a model.

    Examples:
        >>> from mindspore_serving.server import distributed, register
        >>> model = distributed.declare_servable(rank_size=2, stage_size=1, with_batch_dim=False)
        >>> @register.register_method(output_names=["y"])
        ... def predict(x):
        ...     y = register.add_stage(model, x, outputs_count=1)
        ...     return y
    """
    check_type.check_bool("with_batch_dim", with_batch_dim)
    check_type.check_bool("enable_pipeline_infer", enable_pipeline_infer)
    if without_batch_dim_inputs:
        without_batch_dim_inputs = check_type.check_and_as_int_tuple_list(
            "without_batch_dim_inputs", without_batch_dim_inputs, 0
        )
    else:
        without_batch_dim_inputs = ()
    check_type.check_int("rank_size", rank_size, 1)
    check_type.check_int("stage_size", stage_size, 1)
    _servable_directory, servable_name = registry.servable_location()
    spec = registry.get_or_create_servable_spec(servable_name)
    if spec.distributed:
        raise RuntimeError(
            "Declare distributed model failed, servable is repeatedly been declared as distributed servable"
        )
    if spec.models:
        raise RuntimeError("Declare distributed model failed, servable has already been declared as local servable")
    spec.distributed = True
    spec.distributed_spec = DistributedSpec(rank_size, stage_size, enable_pipeline_infer)
    spec.models[servable_name] = ModelSpec(
        model_key=servable_name,
        model_files=(),
        model_format="MindIR",
        with_batch_dim=with_batch_dim,
        without_batch_dim_inputs=without_batch_dim_inputs,
    )
    log.info(
        f"Declare distributed servable, servable name: {servable_name}, rank_size: {rank_size}, stage_size: "
        f"{stage_size}, with_batch_dim: {with_batch_dim}, without_batch_dim_inputs: {without_batch_dim_inputs}, "
        f"enable_pipeline_infer: {enable_pipeline_infer}"
    )
    return Model(servable_name, servable_name, 1)
