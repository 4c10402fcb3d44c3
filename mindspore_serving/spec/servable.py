"""What `servable_config.py` declares, as plain data read by the worker runtime.

The register DSL (`declare_model`, `register_method`, `add_stage`) fills these objects
when a worker imports `servable_config.py`; the worker then executes them. Stage index 0
stands for the method's inputs; stages added with `add_stage` are numbered from 1.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

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
    model_files: Tuple[str, ...]
    model_format: str
    with_batch_dim: bool = True
    without_batch_dim_inputs: Tuple[int, ...] = ()
    context: Any = None
    config_file: Optional[str] = None
    # subgraph index -> (inputs count, outputs count), as used by add_stage / Model.call registration
    io_counts: Dict[int, Tuple[int, int]] = field(default_factory=dict)


@dataclass
class StageSpec:
    kind: str
    tag: str
    inputs: List[TensorRef]
    outputs_count: int
    batch_size: Optional[int] = None
    function: Optional[Callable] = None
    function_key: str = ""
    model_key: str = ""
    subgraph: int = 0
    builtin_name: str = ""


@dataclass
class MethodSpec:
    name: str
    input_names: List[str]
    output_names: List[str] = field(default_factory=list)
    stages: List[StageSpec] = field(default_factory=list)
    outputs: List[TensorRef] = field(default_factory=list)

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
    models: Dict[str, ModelSpec] = field(default_factory=dict)
    methods: Dict[str, MethodSpec] = field(default_factory=dict)
    # set by declarations that hand the servable to another runtime (e.g. an LLM engine)
    extension: Any = None
    # set by server.distributed.declare_servable; declare_model then refuses to declare models
    distributed: bool = False
    distributed_spec: Optional[DistributedSpec] = None
    # set by register.enable_warmup(generate=True): methods without a warm-up file are warmed up with zeros
    warmup_generate: bool = False
