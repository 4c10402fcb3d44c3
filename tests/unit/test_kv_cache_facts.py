"""Pins the MindSpore behaviours (DESIGN.md §5) that the paged KV cache of the LLM graphs relies on.

If one of these starts failing after a MindSpore upgrade, the LLM graphs' in-place cache update (model.py,
`DecoderLayer.forward_paged`) and agent/graph_runner.py must be revisited.
"""

import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import Tensor, nn, ops  # noqa: E402

NB, BS, H, D = 4, 8, 2, 4


class NdWriter(nn.Cell):
    """The project's way: scatter_nd_update on the 4-D cache input with idx = (slot // BS, slot % BS)."""

    def construct(self, cache, kv, slots):
        idx = ops.stack((slots // BS, slots % BS), axis=-1)
        return ops.depend(cache.sum(), ops.scatter_nd_update(cache, idx, kv))


class ReshapeWriter(nn.Cell):
    """The tempting way that does not work: scatter_update on a reshaped view."""

    def construct(self, cache, kv, slots):
        flat = cache.reshape(NB * BS, H, D)
        return ops.depend(cache.sum(), ops.scatter_update(flat, slots, kv))


class WriteThenRead(nn.Cell):
    """Writes, then (ordered by depend) gathers the blocks of a block table and sums per row."""

    def construct(self, cache, kv, slots, block_table):
        idx = ops.stack((slots // BS, slots % BS), axis=-1)
        cache = ops.depend(cache, ops.scatter_nd_update(cache, idx, kv))
        g = ops.gather(cache, block_table, 0)
        return g.reshape(g.shape[0], -1, H, D).sum(axis=(1, 2, 3))


class VarargsWriter(nn.Cell):
    """A construct taking the caches as *args (as the LLM graphs do), each updated in place."""

    def construct(self, kv, slots, *caches):
        idx = ops.stack((slots // BS, slots % BS), axis=-1)
        total = kv.sum()
        for cache in caches:
            cache = ops.depend(cache, ops.scatter_nd_update(cache, idx, kv))
            total = total + cache.sum()
        return total


def export_load(tmp_path, net, *inputs, name):
    path = os.path.join(str(tmp_path), name)
    ms.export(net, *inputs, file_name=path, file_format="MINDIR")
    return nn.GraphCell(ms.load(path + ".mindir"))


def zeros(nb=NB):
    return Tensor(np.zeros((nb, BS, H, D), np.float32))


KV3 = np.ones((3, H, D), np.float32)
SLOTS3 = np.array([0, 9, 17], np.int32)


def test_scatter_nd_update_is_in_place_through_loaded_mindir(tmp_path):
    graph = export_load(tmp_path, NdWriter(), zeros(), Tensor(KV3), Tensor(SLOTS3), name="nd")
    cache = zeros()
    graph(cache, Tensor(KV3), Tensor(SLOTS3))
    got = cache.asnumpy()
    assert got.sum() == 3 * H * D
    for slot in SLOTS3:
        assert (got[slot // BS, slot % BS] == 1).all()
    # a second call keeps writing into the same caller-owned tensor
    graph(cache, Tensor(np.full((3, H, D), 2, np.float32)), Tensor(np.array([1, 2, 3], np.int32)))
    assert cache.asnumpy().sum() == 3 * H * D * 3


def test_scatter_update_on_a_reshape_does_not_reach_the_caller(tmp_path):
    graph = export_load(tmp_path, ReshapeWriter(), zeros(), Tensor(KV3), Tensor(SLOTS3), name="reshape")
    cache = zeros()
    graph(cache, Tensor(KV3), Tensor(SLOTS3))
    assert cache.asnumpy().sum() == 0


def test_two_loaded_graphs_share_one_cache_and_depend_orders_the_read(tmp_path):
    table = Tensor(np.array([[0, 1], [2, 3]], np.int32))
    kv2, slots2 = Tensor(np.full((2, H, D), 2, np.float32)), Tensor(np.array([1, 25], np.int32))
    writer = export_load(tmp_path, NdWriter(), zeros(), Tensor(KV3), Tensor(SLOTS3), name="w")
    reader = export_load(tmp_path, WriteThenRead(), zeros(), kv2, slots2, table, name="r")
    cache = zeros()
    writer(cache, Tensor(KV3), Tensor(SLOTS3))
    # row 0 = blocks 0, 1: slots 0 and 9 (1 each) + slot 1 (2, written by this very call); row 1 = blocks 2, 3
    assert reader(cache, kv2, slots2, table).asnumpy().tolist() == [32.0, 24.0]


def test_dynamic_block_count_and_varargs_caches(tmp_path):
    """Caches exported with a dynamic first dimension work in a fresh GraphCell used with one block count."""
    spec = Tensor(shape=[None, BS, H, D], dtype=ms.float32)
    graph = export_load(tmp_path, VarargsWriter(), Tensor(KV3), Tensor(SLOTS3), spec, spec, name="dyn")
    caches = [zeros(7), zeros(7)]
    total = graph(Tensor(KV3), Tensor(SLOTS3), *caches).asnumpy()
    assert total == 3 * 3 * H * D
    assert [c.asnumpy().sum() for c in caches] == [3 * H * D, 3 * H * D]
