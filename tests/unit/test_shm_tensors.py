"""The shared-memory codec of extra workers' model calls: both sides in one process, no block left behind."""

import os

import numpy as np
import pytest

from mindspore_serving.ipc import shm_tensors
from mindspore_serving.proto import internal_pb2
from mindspore_serving.worker.model_backend import TensorInfo

MASTER_PID = os.getpid()  # a running "master": no master starting meanwhile takes its blocks for orphans


def blocks_left():
    return sorted(name for name in os.listdir(shm_tensors.SHM_DIR) if name.startswith(f"mss_{MASTER_PID}_"))


@pytest.fixture
def namer():
    shm_tensors.remove_blocks(MASTER_PID)
    yield shm_tensors.BlockNamer(MASTER_PID)
    left = blocks_left()
    shm_tensors.remove_blocks(MASTER_PID)
    assert left == []


def serve(request, run):
    """The serving worker's side: inputs out, `run(inputs) -> outputs` written back, blocks closed."""
    reply = internal_pb2.CallModelReply()
    blocks = shm_tensors.AttachedBlocks()
    try:
        for instance_pb in request.instances:
            blocks.write_outputs(run(blocks.inputs(instance_pb)), instance_pb, reply.instances.add())
    finally:
        blocks.close()
    return reply


def test_inputs_and_outputs_travel_in_one_block_released_after_the_answer(namer):
    x = [np.arange(128 * 128, dtype=np.float32).reshape(128, 128) + i for i in range(3)]  # 64 KiB each
    request = internal_pb2.CallModelRequest()
    block = shm_tensors.encode_call(
        [(xi, np.int32(i) * np.ones(1, np.int32)) for i, xi in enumerate(x)],
        [TensorInfo((128, 128), np.float32)],
        request.instances,
        namer,
    )
    assert block is not None and blocks_left() == [block.name]
    tensor = request.instances[1].items["0"]
    assert tensor.WhichOneof("tensor_data") == "shm_data" and not tensor.data
    assert tensor.shm_data.memory_key == block.name and tensor.shm_data.data_size == 65536
    assert tensor.shm_data.data_offset % shm_tensors.ALIGN == 0
    assert request.instances[0].output_buffers["0"].data_size == 65536
    assert request.ByteSize() < 1000  # the messages carry places, not data

    seen = []
    reply = serve(request, lambda inputs: seen.append(inputs) or (inputs[0] * 2,))
    assert [s[1].tolist() for s in seen] == [[0], [1], [2]]
    np.testing.assert_array_equal(seen[2][0], x[2])
    assert reply.instances[0].items["0"].WhichOneof("tensor_data") == "shm_data"  # written into the buffer
    outputs = [shm_tensors.decode_outputs(instance, 1, block) for instance in reply.instances]
    block.release()
    block.release()  # idempotent
    for xi, (y,) in zip(x, outputs):
        np.testing.assert_array_equal(y, xi * 2)
        y += 1  # a copy of its own: writable, and the block is gone


def test_an_output_of_another_size_comes_back_in_the_message(namer):
    request = internal_pb2.CallModelRequest()
    block = shm_tensors.encode_call(
        [(np.ones(4, np.float32),)], [TensorInfo((4,), np.float32)], request.instances, namer
    )
    reply = serve(request, lambda inputs: (np.ones(5, np.float64),))
    tensor = reply.instances[0].items["0"]
    assert tensor.WhichOneof("tensor_data") == "data"
    (y,) = shm_tensors.decode_outputs(reply.instances[0], 1, block)
    block.release()
    assert y.dtype == np.float64 and y.shape == (5,)


def test_without_shared_memory_tensors_travel_in_the_messages():
    request = internal_pb2.CallModelRequest()
    assert (
        shm_tensors.encode_call([(np.ones(3, np.int64),)], [TensorInfo((3,), np.int64)], request.instances, None)
        is None
    )
    assert request.instances[0].items["0"].WhichOneof("tensor_data") == "data"
    assert not request.instances[0].output_buffers
    reply = serve(request, lambda inputs: (inputs[0] + 1,))
    (y,) = shm_tensors.decode_outputs(reply.instances[0], 1, None)
    assert y.tolist() == [2, 2, 2]


def test_dynamic_output_shapes_get_no_buffer_and_empty_tensors_no_place(namer):
    request = internal_pb2.CallModelRequest()
    block = shm_tensors.encode_call(
        [(np.ones(2, np.float32), np.zeros((0, 3), np.float32))],
        [TensorInfo((-1,), np.float32)],
        request.instances,
        namer,
    )
    assert not request.instances[0].output_buffers
    assert request.instances[0].items["1"].WhichOneof("tensor_data") == "data"  # no bytes: nothing to place
    reply = serve(request, lambda inputs: (inputs[0], inputs[1]))
    y, empty = shm_tensors.decode_outputs(reply.instances[0], 2, block)
    block.release()
    assert y.tolist() == [1.0, 1.0] and empty.shape == (0, 3)


def test_a_place_outside_its_block_is_refused(namer):
    request = internal_pb2.CallModelRequest()
    block = shm_tensors.encode_call([(np.ones(4, np.float32),)], None, request.instances, namer)
    request.instances[0].items["0"].shm_data.data_offset = block.size
    with pytest.raises(ValueError, match="does not fit shape"):
        serve(request, lambda inputs: inputs)
    block.release()


def test_the_master_removes_the_blocks_of_a_dead_worker_only(namer):
    mine, other = shm_tensors.BlockNamer(MASTER_PID), shm_tensors.BlockNamer(MASTER_PID)
    other.prefix = shm_tensors.block_prefix(MASTER_PID, 1)  # as if made by worker pid 1
    kept = shm_tensors.CallBlock(mine(), 64)
    left = [shm_tensors.CallBlock(other(), 64) for _ in range(2)]
    for block in left:
        block.memory.close()  # a dead worker never unlinks
    assert shm_tensors.remove_blocks(MASTER_PID, 1) == 2
    assert blocks_left() == [kept.name]
    kept.memory.close()
    assert shm_tensors.remove_blocks(MASTER_PID) == 1  # when the master stops: everything of its workers


def test_blocks_of_masters_that_no_longer_run_are_removed_by_the_next_master():
    dead_master = 999_999_003  # above the kernel's pid limit: never running
    orphan = shm_tensors.BlockNamer(dead_master)
    live = shm_tensors.BlockNamer(os.getpid())
    blocks = [shm_tensors.CallBlock(orphan(), 64), shm_tensors.CallBlock(live(), 64)]
    for block in blocks:
        block.memory.close()
    try:
        assert shm_tensors.remove_orphan_blocks() >= 1
        left = os.listdir(shm_tensors.SHM_DIR)
        assert blocks[0].name not in left and blocks[1].name in left
    finally:
        shm_tensors.remove_blocks(dead_master)
        shm_tensors.remove_blocks(os.getpid())
