"""The tensors of an extra worker's model calls, in shared memory (internal.proto CallModelRequest).

An extra worker runs a servable's Python stages; its model calls go through the master to a worker that owns the
models. So that large tensors are not serialised into those messages (and through the master), the caller puts
every input of a call, and a buffer for every output whose size the model declares, into one block of shared
memory (`multiprocessing.shared_memory`). The messages only name the places: `Tensor.shm_data` for an input,
`Instance.output_buffers[<output index>]` for an output, both ShmTensorData {memory_key, bytes_size (the block),
data_offset, data_size}; the reply's output tensors carry the ShmTensorData they were written to.

Lifetime: the caller creates the block and unlinks it once the call is answered, whatever the answer
(`CallBlock.release`). The serving worker maps it only while it serves the call: it copies the inputs out, writes
the outputs in and closes it before it replies (`AttachedBlocks`), so no view outlives its mapping. A caller
killed during a call leaves its block behind; the master removes a dead worker's blocks and, when it stops, all of
its workers' (`remove_blocks`); a master killed outright leaves them to the next master that starts
(`remove_orphan_blocks`): block names are `mss_<master pid>_<caller pid>_<n>`.

Without shared memory (no /dev/shm, or it is full) the tensors travel in `Tensor.data`, as in every other message.
"""

import itertools
import math
import os
import sys
from collections.abc import Sequence, Sized
from typing import Any

import numpy as np

from mindspore_serving import log
from mindspore_serving.common.tensor_codec import dtype_to_proto, proto_to_dtype, tensor_to_value, value_to_tensor
from mindspore_serving.proto import ms_service_pb2 as pb

try:
    from multiprocessing import shared_memory
except ImportError:  # a platform without POSIX shared memory: tensors travel in the messages
    shared_memory = None  # type: ignore[assignment]  # every use checks for None first

PREFIX = "mss_"
SHM_DIR = "/dev/shm"  # where Linux shows POSIX shared memory, for removing what dead workers left
ALIGN = 64  # every tensor starts on a cache line


def block_prefix(master_pid: int, owner_pid: int | None = None) -> str:
    """The name prefix of the blocks made by the workers of master `master_pid` (of worker `owner_pid` only)."""
    return f"{PREFIX}{master_pid}_" + ("" if owner_pid is None else f"{owner_pid}_")


def remove_blocks(master_pid: int, owner_pid: int | None = None) -> int:
    """Unlinks the blocks left by the workers of master `master_pid` (of worker `owner_pid` only); how many."""
    prefix = block_prefix(master_pid, owner_pid)
    try:
        names = [name for name in os.listdir(SHM_DIR) if name.startswith(prefix)]
    except OSError:
        return 0
    removed = 0
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed += 1
        except OSError:
            pass
    if removed:
        log.warning(f"removed {removed} shared memory block(s) {prefix}* of model calls that were never answered")
    return removed


def remove_orphan_blocks() -> int:
    """Unlinks the blocks of masters that no longer run (killed before they could remove them); how many."""
    try:
        names = [name for name in os.listdir(SHM_DIR) if name.startswith(PREFIX)]
    except OSError:
        return 0
    dead = set()
    for name in names:
        master = name[len(PREFIX) :].split("_", 1)[0]
        if master.isdigit() and not _running(int(master)):
            dead.add(int(master))
    return sum(remove_blocks(master) for master in dead)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


_tracker_filtered = False


def _open_block(name: str, create: bool, size: int = 0) -> "shared_memory.SharedMemory":
    """A SharedMemory that no resource tracker process watches: blocks are released by their call, and the master
    removes those of dead workers. Before Python 3.13 every SharedMemory, even one only mapped, is registered with
    a tracker process that would unlink it when the process exits, while its creator still uses it."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name, create=create, size=size, track=False)
    _filter_tracker()
    return shared_memory.SharedMemory(name, create=create, size=size)


def _filter_tracker() -> None:
    global _tracker_filtered  # pylint: disable=global-statement
    if _tracker_filtered:
        return
    from multiprocessing import resource_tracker  # pylint: disable=import-outside-toplevel

    register, unregister = resource_tracker.register, resource_tracker.unregister

    def ours(name: Sized, rtype: str) -> bool:
        return rtype == "shared_memory" and str(name).lstrip("/").startswith(PREFIX)

    def filtered_register(name: Sized, rtype: str) -> None:
        if not ours(name, rtype):
            register(name, rtype)

    def filtered_unregister(name: Sized, rtype: str) -> None:
        if not ours(name, rtype):
            unregister(name, rtype)

    resource_tracker.register, resource_tracker.unregister = filtered_register, filtered_unregister
    _tracker_filtered = True


def _mapped(memory: "shared_memory.SharedMemory | None", name: str) -> memoryview:
    """The buffer of a block still mapped; ValueError for one released or closed."""
    buffer = None if memory is None else memory.buf
    if buffer is None:
        raise ValueError(f"shared memory {name} is no longer mapped")
    return buffer


class CallBlock:
    """The caller's block of one model call: created by `encode_call`, released once the call is answered."""

    def __init__(self, name: str, size: int) -> None:
        self.memory: shared_memory.SharedMemory | None = _open_block(name, create=True, size=size)
        self.name = name
        self.size = size

    def write(self, offset: int, array: np.ndarray) -> None:
        target = np.frombuffer(_mapped(self.memory, self.name), array.dtype, array.size, offset)
        np.copyto(target.reshape(array.shape), array)

    def read(self, place: pb.ShmTensorData, dtype: np.dtype, dims: Sequence[int]) -> np.ndarray:
        """A copy of what the serving worker wrote at `place`."""
        _check_place(place, self.size, dtype, dims)
        buffer = _mapped(self.memory, self.name)
        return np.frombuffer(buffer, dtype, math.prod(dims), place.data_offset).reshape(dims).copy()

    def release(self) -> None:
        """Unmaps and unlinks the block (idempotent)."""
        if self.memory is None:
            return
        memory, self.memory = self.memory, None
        memory.close()
        try:
            memory.unlink()
        except FileNotFoundError:  # removed by the master meanwhile
            pass


class BlockNamer:
    """Unique block names of one caller process."""

    def __init__(self, master_pid: int) -> None:
        self.prefix = block_prefix(master_pid, os.getpid())
        self._numbers = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self._numbers)}"


_shm_failed = False  # warned once that shared memory could not be made


def _new_block(namer: BlockNamer | None, size: int) -> CallBlock | None:
    global _shm_failed  # pylint: disable=global-statement
    if shared_memory is None or namer is None or size == 0:
        return None
    for _ in range(3):
        try:
            return CallBlock(namer(), size)
        except FileExistsError:  # left by an earlier process of the same pid: take the next number
            continue
        except OSError as err:
            if not _shm_failed:
                log.warning(
                    f"model call tensors travel in the messages: cannot make shared memory of {size} bytes: {err}"
                )
                _shm_failed = True
            return None
    return None


def encode_call(
    instances: Sequence[Sequence[np.ndarray]],
    output_infos: Sequence | None,
    repeated_field: Any,
    namer: BlockNamer | None,
) -> CallBlock | None:
    """Appends one Instance per input tuple to `repeated_field` (a CallModelRequest's instances): inputs keyed by
    their index, in shared memory with a buffer for each output of `output_infos` (per-instance TensorInfo, None
    or dynamic shapes: no buffer) when a block can be made, else in the messages. Returns the block, which the
    caller releases once the call is answered, or None."""
    outputs = [
        (index, np.dtype(info.dtype), tuple(info.shape))
        for index, info in enumerate(output_infos or ())
        if info.is_static
    ]
    output_size = sum(_aligned(info_nbytes(dtype, shape)) for _, dtype, shape in outputs)
    size = sum(_aligned(array.nbytes) for instance in instances for array in instance) + len(instances) * output_size
    block = _new_block(namer, size)
    offset = 0
    for instance in instances:
        instance_pb = repeated_field.add()
        items = instance_pb.items
        for index, array in enumerate(instance):
            tensor = items[str(index)]
            if block is None or not array.nbytes:
                value_to_tensor(array, tensor)
                continue
            tensor.dtype = dtype_to_proto(array.dtype)
            tensor.shape.dims.extend(array.shape)
            _set_place(tensor.shm_data, block, offset, array.nbytes)
            block.write(offset, np.asarray(array, order="C"))
            offset += _aligned(array.nbytes)
        if block is None:
            continue
        for index, dtype, shape in outputs:
            nbytes = info_nbytes(dtype, shape)
            _set_place(instance_pb.output_buffers[str(index)], block, offset, nbytes)
            offset += _aligned(nbytes)
    return block


def info_nbytes(dtype: np.dtype, shape: Sequence[int]) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


def _set_place(place: pb.ShmTensorData, block: CallBlock, offset: int, nbytes: int) -> None:
    place.memory_key = block.name
    place.bytes_size = block.size
    place.data_offset = offset
    place.data_size = nbytes


def _check_place(place: pb.ShmTensorData, block_size: int, dtype: np.dtype, dims: Sequence[int]) -> None:
    expected = math.prod(dims) * np.dtype(dtype).itemsize
    if place.data_size != expected or place.data_offset + place.data_size > block_size or min(dims, default=0) < 0:
        raise ValueError(
            f"shared memory tensor of {place.data_size} bytes at offset {place.data_offset} does not "
            f"fit shape {list(dims)} of {np.dtype(dtype)} in a block of {block_size} bytes"
        )


def decode_outputs(instance_pb: pb.Instance, count: int, block: CallBlock | None) -> tuple:
    """The outputs of one answered instance (copies, whether they came in the block or in the message)."""
    values = []
    for index in range(count):
        tensor = instance_pb.items.get(str(index))
        if tensor is None:
            raise RuntimeError(f"the model call answered without output {index}")
        if tensor.WhichOneof("tensor_data") == "shm_data":
            if block is None or tensor.shm_data.memory_key != block.name:
                raise RuntimeError(
                    f"the model call answered output {index} in unknown shared memory '{tensor.shm_data.memory_key}'"
                )
            values.append(block.read(tensor.shm_data, proto_to_dtype(tensor.dtype), tensor.shape.dims[:]))
        else:
            values.append(tensor_to_value(tensor))
    return tuple(values)


class AttachedBlocks:
    """The serving worker's side of one call: the blocks it names, mapped until `close()`."""

    def __init__(self) -> None:
        self._blocks: dict[str, shared_memory.SharedMemory] = {}

    def _block(self, place: pb.ShmTensorData) -> "shared_memory.SharedMemory":
        block = self._blocks.get(place.memory_key)
        if block is None:
            if shared_memory is None or not place.memory_key.startswith(PREFIX):
                raise ValueError(f"cannot map shared memory '{place.memory_key}'")
            block = self._blocks[place.memory_key] = _open_block(place.memory_key, create=False)
        return block

    def inputs(self, instance_pb: pb.Instance) -> tuple:
        """One instance's inputs, keyed "0".."n-1", as arrays of their own (copied out of shared memory)."""
        items = instance_pb.items
        values: list[np.ndarray] = []
        for index in range(len(items)):
            tensor = items.get(str(index))
            if tensor is None:
                raise ValueError(f"model call input {index} is missing")
            if tensor.WhichOneof("tensor_data") != "shm_data":
                values.append(tensor_to_value(tensor))
                continue
            block = self._block(tensor.shm_data)
            dtype, dims = proto_to_dtype(tensor.dtype), tensor.shape.dims[:]
            _check_place(tensor.shm_data, block.size, dtype, dims)
            values.append(
                np.frombuffer(_mapped(block, block.name), dtype, math.prod(dims), tensor.shm_data.data_offset)
                .reshape(dims)
                .copy()
            )
        return tuple(values)

    def write_outputs(self, outputs: Sequence, instance_pb: pb.Instance, answer_pb: pb.Instance) -> None:
        """Puts one instance's outputs into `answer_pb`: into the caller's buffer of the same size when it gave
        one, else into the message."""
        for index, value in enumerate(outputs):
            tensor = answer_pb.items[str(index)]
            place = instance_pb.output_buffers.get(str(index))
            if (
                place is None
                or not isinstance(value, np.ndarray)
                or place.data_size != value.nbytes
                or not value.nbytes
            ):
                value_to_tensor(value, tensor)
                continue
            block = self._block(place)
            _check_place(place, block.size, value.dtype, value.shape)
            target = np.frombuffer(_mapped(block, block.name), value.dtype, value.size, place.data_offset)
            np.copyto(target.reshape(value.shape), value)
            del target  # no view of the block may outlive close()
            tensor.dtype = dtype_to_proto(value.dtype)
            tensor.shape.dims.extend(value.shape)
            tensor.shm_data.CopyFrom(place)

    def close(self) -> None:
        blocks, self._blocks = self._blocks, {}
        for block in blocks.values():
            try:
                block.close()
            except BufferError:  # a view still held by a failure's traceback: unmapped once that goes
                log.warning(f"shared memory {block.name} stays mapped until its last view is released")
