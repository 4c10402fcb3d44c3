"""What `servable_config.py` declares, as plain data read by the worker runtime.

The register DSL (`declare_model`, `register_method`, `add_stage`) fills these objects
when a worker imports `servable_config.py`; the worker then executes them. Stage index 0
stands for the method's inputs; stages added with `add_stage` are numbered from 1.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STAGE_FUNCTION = "function"
STAGE_MODEL = "model"
STAGE_BUILTIN = "builtin"  # a named built-in stage such as "argmax_cpp"

BUILTIN_STAGE_NAMES = ("argmax_cpp",)
"""Names `add_stage` accepts as a built-in stage; the worker implements each one."""


@dataclass(frozen=True)
class TensorRef:
    """One value inside a method: output `output_index` of stage `stage_index` (0 = method inputs)."""

    stage_index: int
    output_index: int


@dataclass
class ModelSpec:
    """One `declare_model` call; several files form one model with several subgraphs."""

    model_key: str
    model_files: tuple[str, ...]
    model_format: str
    with_batch_dim: bool = True
    without_batch_dim_inputs: tuple[int, ...] = ()
    context: Any = None
    config_file: str | None = None
    # subgraph index -> (inputs count, outputs count), as used by add_stage / Model.call registration
    io_counts: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class StageSpec:
    kind: str
    tag: str
    inputs: list[TensorRef]
    outputs_count: int
    batch_size: int | None = None
    function: Callable | None = None
    function_key: str = ""
    model_key: str = ""
    subgraph: int = 0
    builtin_name: str = ""


@dataclass
class MethodSpec:
    name: str
    input_names: list[str]
    output_names: list[str] = field(default_factory=list)
    stages: list[StageSpec] = field(default_factory=list)
    outputs: list[TensorRef] = field(default_factory=list)

    @property
    def only_model_stage(self) -> bool:
        return all(stage.kind == STAGE_MODEL for stage in self.stages)


@dataclass(frozen=True)
class DistributedSpec:
    """`server.distributed.declare_servable`: the model (keyed by the servable name) runs on rank agents."""

    rank_size: int
    stage_size: int
    enable_pipeline_infer: bool = False


@dataclass
class ServableSpec:
    name: str
    models: dict[str, ModelSpec] = field(default_factory=dict)
    methods: dict[str, MethodSpec] = field(default_factory=dict)
    # set by declarations that hand the servable to another runtime (e.g. an LLM engine)
    extension: Any = None
    # set by server.distributed.declare_servable; declare_model then refuses to declare models
    distributed: bool = False
    distributed_spec: DistributedSpec | None = None
    # set by register.enable_warmup(generate=True): methods without a warm-up file are warmed up with zeros
    warmup_generate: bool = False
