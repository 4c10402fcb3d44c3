"""Loads MindIR graphs with `mindspore.load` + `nn.GraphCell` and describes their inputs and outputs.

MindSpore is imported where a model is loaded or run, not at module import: the stage and batching modules
(and their tests) use TensorInfo and kmsi_name without paying MindSpore's start-up.
"""

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mindspore_serving import log
from mindspore_serving.common.mindir_info import read_mindir_input_infos

_KMSI_NAMES = {
    np.dtype(np.bool_): "kMSI_Bool",
    np.dtype(np.int8): "kMSI_Int8",
    np.dtype(np.uint8): "kMSI_Uint8",
    np.dtype(np.int16): "kMSI_Int16",
    np.dtype(np.uint16): "kMSI_Uint16",
    np.dtype(np.int32): "kMSI_Int32",
    np.dtype(np.uint32): "kMSI_Uint32",
    np.dtype(np.int64): "kMSI_Int64",
    np.dtype(np.uint64): "kMSI_Uint64",
    np.dtype(np.float16): "kMSI_Float16",
    np.dtype(np.float32): "kMSI_Float32",
    np.dtype(np.float64): "kMSI_Float64",
}


def kmsi_name(value) -> str:
    """MindSpore Serving's name for the data type of a stage value."""
    if isinstance(value, str):
        return "kMSI_String"
    if isinstance(value, (bytes, bytearray)):
        return "kMSI_Bytes"
    return _KMSI_NAMES.get(np.dtype(value), f"kMSI_Unknown({value})")


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple
    dtype: np.dtype

    # computed once: model input checks read them for every instance (cached_property writes the instance
    # __dict__ directly, which a frozen dataclass allows)
    @cached_property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize if self.is_static else -1

    @cached_property
    def is_static(self) -> bool:
        return all(dim >= 0 for dim in self.shape)


def read_mindir_inputs(path: str, dec_key: bytes | None = None, dec_mode: str = "AES-GCM") -> list[TensorInfo] | None:
    """Input shapes and dtypes recorded in a MindIR file (decrypted with `dec_key` when it is encrypted); None when
    the file cannot be read or parsed."""
    infos = read_mindir_input_infos(path, dec_key, dec_mode)
    return None if infos is None else [TensorInfo(shape, dtype) for shape, dtype in infos]


# MindSpore's graph executor is one per process, and two threads running graphs at once can deadlock in it (seen
# with two models of one servable, each run from its own thread): a worker runs one graph at a time.
_GRAPH_LOCK = threading.Lock()


class Subgraph:
    """One loaded graph: its GraphCell and the shapes and dtypes of its inputs and outputs."""

    def __init__(self, path: str, dec_key: bytes | None = None, dec_mode: str = "AES-GCM"):
        if not os.path.isfile(path):
            raise RuntimeError(f"model file '{path}' not exist")
        self.path = path
        self._load_kwargs = {"dec_key": dec_key, "dec_mode": dec_mode} if dec_key else {}
        self.cell = self._load_cell()
        self._phases = {}  # input signature -> compiled phase, for the fast call
        self._runner = compiled_runner()
        self.inputs = read_mindir_inputs(path, dec_key, dec_mode)
        if self.inputs is None:
            raise RuntimeError(f"cannot read the inputs of model file '{path}'")
        self.outputs = self._probe_outputs()

    def _load_cell(self):
        import mindspore as ms  # lazy: see the module docstring
        from mindspore import nn  # lazy: see the module docstring

        return nn.GraphCell(ms.load(self.path, **self._load_kwargs))

    def reload(self):
        """Loads the graph afresh (it compiles at its next call): new kernels, whose choices MindSpore makes again."""
        cell = self._load_cell()
        with _GRAPH_LOCK:
            self.cell, self._phases = cell, {}

    def _probe_outputs(self) -> list[TensorInfo]:
        """Runs the graph once on zeros: warms it up and reveals the output shapes and dtypes."""
        zeros = self._zeros()
        if zeros is None:
            return []
        return [TensorInfo(out.shape, out.dtype) for out in self.run(zeros)]

    def _zeros(self) -> list[np.ndarray] | None:
        """Zeros of the graph's full input shapes; None when one of them is not static."""
        if not all(info.is_static for info in self.inputs):
            return None
        return [np.zeros(info.shape, info.dtype) for info in self.inputs]

    def run_on_zeros(self, calls: int, budget_s: float) -> int:
        """Runs the graph on zeros (its full input shapes) `calls` times, or until `budget_s` seconds have passed;
        returns the calls made (none when an input's shape is not static)."""
        zeros = self._zeros()
        if zeros is None:
            return 0
        deadline = time.perf_counter() + budget_s
        for made in range(1, calls + 1):
            self.run(zeros)
            if time.perf_counter() >= deadline:
                return made
        return calls

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        from mindspore import Tensor  # lazy: see the module docstring

        arrays = [np.asarray(value, order="C") for value in inputs]
        signature = tuple((array.shape, array.dtype.str) for array in arrays)
        # from_numpy shares the arrays' memory (they live until the call returns); Tensor() would copy them
        tensors = [Tensor.from_numpy(array) for array in arrays]
        with _GRAPH_LOCK:
            compiled = self._phases.get(signature)
            result = None
            if compiled is not None:
                try:
                    result = self._runner(self.cell, tensors, compiled)
                except Exception as err:  # let the public call decide (and raise its own error if the graph fails)
                    log.warning(f"fast call of '{self.path}' failed, using GraphCell's call: {err}")
                    self._phases.pop(signature, None)
            if result is None:
                result = self.cell(*tensors)
                self._remember_phase(signature)
            if not isinstance(result, (tuple, list)):
                result = (result,)
            return [out.asnumpy() for out in result]

    def _remember_phase(self, signature: tuple):
        if len(self._phases) >= _MAX_PHASES:
            return
        compiled = self._runner.phase_of(self.cell)
        if compiled is not None:
            self._phases[signature] = compiled


# GraphCell.__call__ (Cell.compile_and_run) checks and compiles its arguments on every call, about half of the
# cost of a small graph. Once a GraphCell has been compiled for an input signature (shapes and dtypes), the
# steps of compile_and_run after compile() are repeated here with the phase it compiled, through MindSpore's
# private executor API. When those internals are missing (another MindSpore version), every call goes through
# the public GraphCell call. tests/unit/test_model_backend.py pins the behaviour.
_MAX_PHASES = 64


class _CompiledRunner:
    def __init__(self):
        try:
            # lazy (see the module docstring); MindSpore's private executor moved between releases
            try:
                from mindspore.graph.api import _cell_graph_executor, _convert_python_data  # newer releases
            except ImportError:
                from mindspore.common.api import _cell_graph_executor, _convert_python_data  # older releases
            from mindspore.nn.cell import _DEFAULT_JIT_CONFIG  # lazy: see the module docstring

            executor = _cell_graph_executor._graph_executor
            self._calls = (
                executor,
                executor.get_args_for_run,
                executor.set_jit_config,
                executor.has_compiled,
                _convert_python_data,
                _DEFAULT_JIT_CONFIG,
            )
        except Exception as err:
            log.info(f"GraphCell fast call unavailable, using the public call: {err}")
            self._calls = None

    @property
    def available(self) -> bool:
        return self._calls is not None

    def phase_of(self, cell) -> tuple | None:
        """What the cell's last call compiled (phase, mutable flags, modified sequences), or None."""
        if self._calls is None:
            return None
        phase = getattr(cell, "compile_phase", None)
        if not isinstance(phase, str) or not self._calls[3](phase):
            return None
        return (
            phase,
            list(getattr(cell, "_has_mutable_args_list", None) or []),
            list(getattr(cell, "sequence_modified", None) or []),
        )

    def __call__(self, cell, tensors, compiled: tuple):
        executor, get_args, set_jit_config, _, convert, default_jit_config = self._calls
        phase, mutable_flags, sequence_modified = compiled
        args = get_args(cell, tuple(tensors), {}, mutable_flags, sequence_modified, False, False)
        set_jit_config(getattr(cell, "jit_config_dict", None) or default_jit_config)
        return convert(executor(args, phase))


_runner: _CompiledRunner | None = None


def compiled_runner() -> _CompiledRunner:
    global _runner
    if _runner is None:
        _runner = _CompiledRunner()
    return _runner


def _as_list(values) -> str:
    """A shape or index list as MindSpore Serving prints it: [2, 3]."""
    return "[" + ", ".join(str(value) for value in values) + "]"


class LoadedModel:
    """A declared model: one or more subgraphs sharing a batch size."""

    def __init__(self, spec, version_dir: str, dec_key: bytes | None = None, dec_mode: str = "AES-GCM"):
        import mindspore as ms  # lazy: see the module docstring

        self.spec = spec
        self.subgraphs = [Subgraph(os.path.join(version_dir, name), dec_key, dec_mode) for name in spec.model_files]
        self.batch_size = self._check_batch_size()
        self.device_target = ms.get_context("device_target")  # "CPU", "GPU" or "Ascend"

    def _check_batch_size(self) -> int:
        """The batch size of the model (1 without a batch dim); every subgraph must have the same."""
        if not self.spec.with_batch_dim:
            return 1
        batch = 0
        for index, graph in enumerate(self.subgraphs):
            size = self._subgraph_batch_size(graph)
            if batch and size != batch:
                raise RuntimeError(
                    f"Expect batch size to be same, last batch size: {batch}, subgraph {index} batch size: {size}"
                )
            batch = size
        return batch

    def _subgraph_batch_size(self, graph) -> int:
        """dim 0 shared by the inputs (but without_batch_dim_inputs) and outputs, checked in MindSpore Serving's
        words; 1 when no tensor has a batch dim."""
        excluded = self.spec.without_batch_dim_inputs
        batch = 0
        for kind, infos in (("input", graph.inputs), ("output", graph.outputs)):
            for index, info in enumerate(infos):
                if kind == "input" and index in excluded:
                    continue
                if not info.shape:
                    tail = (
                        f", when with_batch_dim is true and without_batch_dim_inputs is {_as_list(excluded)}"
                        if kind == "input"
                        else ""
                    )
                    raise RuntimeError(f"The shape of model {kind} {index} cannot be empty{tail}")
                if info.shape[0] <= 0:
                    raise RuntimeError(f"The shape of model {kind} {index} is invalid, shape: {_as_list(info.shape)}")
                if batch == 0:
                    batch = info.shape[0]
                elif info.shape[0] != batch:
                    raise RuntimeError(
                        f"The shape {_as_list(info.shape)} of model {kind} {index} does not match "
                        f"current batch size {batch}"
                    )
        return batch or 1

    def instance_inputs(self, subgraph: int) -> list[TensorInfo]:
        """Shape and dtype that one instance must provide for each input of a subgraph."""
        infos = []
        for index, info in enumerate(self.subgraphs[subgraph].inputs):
            batched = self.spec.with_batch_dim and index not in self.spec.without_batch_dim_inputs
            infos.append(TensorInfo(info.shape[1:] if batched else info.shape, info.dtype))
        return infos

    def instance_outputs(self, subgraph: int) -> list[TensorInfo]:
        """Shape and dtype of each output of a subgraph for one instance (none when they depend on the inputs)."""
        outputs = self.subgraphs[subgraph].outputs
        if not self.spec.with_batch_dim:
            return list(outputs)
        return [TensorInfo(tuple(info.shape[1:]), info.dtype) for info in outputs]
