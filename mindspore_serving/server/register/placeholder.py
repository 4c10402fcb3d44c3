"""The placeholder values that flow through a `register_method` function while it is recorded."""

from mindspore_serving.spec.servable import TensorRef


class _TensorDef:
    """Output `output_index` of stage `stage_index` (0 = the method inputs) of the method being recorded.

    It stands for data that only exists when a request is served; it supports no operations.
    """

    __slots__ = ("ref", "owner")

    def __init__(self, stage_index: int, output_index: int, owner=None):
        self.ref = TensorRef(stage_index, output_index)
        self.owner = owner  # the recorder of the method that created it

    @property
    def stage_index(self) -> int:
        return self.ref.stage_index

    @property
    def output_index(self) -> int:
        return self.ref.output_index

    def __repr__(self):
        return f"_TensorDef(stage={self.ref.stage_index}, output={self.ref.output_index})"


def is_placeholder(value) -> bool:
    return isinstance(value, _TensorDef)
