"""The block sub-allocator (runtime/memory.py)."""
from __future__ import annotations

import gc

import os

import numpy as np
import pytest

import vkml
from vkml.runtime import vk


def _placements(allocs) -> list:
    return [(id(a.block), a.offset, a.size) for a in allocs]


def test_sub_allocation_reuses_and_coalesces(device):
    """Sub-allocations are aligned and disjoint; freeing them in an interleaved order
    leaves every block's free list coalesced (no two free ranges touching: a block the
    test emptied is one free range again) and ``used`` as before; the same requests
    again reuse exactly the same places (first fit over the coalesced lists) without
    reserving any more device memory."""
    heap = device._ctx.tensor_heap
    gc.collect()
    with heap.lock:
        heap._drain()
        heap._trim()          # no empty block another test left: placements are ours alone
    before = heap.stats()
    sizes = [1000 + 37 * i for i in range(50)]
    allocs = [device._ctx.allocate(n) for n in sizes]
    first = _placements(allocs)
    reserved = heap.stats()["reserved"]
    align = heap.alignment
    offsets = sorted((a.block.buffer, a.offset, a.size) for a in allocs)
    for (b1, o1, s1), (b2, o2, _) in zip(offsets, offsets[1:]):
        assert o1 % align == 0
        if b1 == b2:
            assert o1 + s1 <= o2, "overlapping allocations"
    blocks = {id(a.block): a.block for a in allocs}
    for a in allocs[::2]:
        a.free()
    for a in allocs[1::2]:
        a.free()
    for a in allocs:
        a.free()                                  # idempotent
    after = heap.stats()
    assert after["used"] == before["used"]
    assert after["blocks"] <= before["blocks"] + 1
    for block in heap.blocks:
        free = block.free_list
        assert all(o1 + n1 < o2 for (o1, n1), (o2, _) in zip(free, free[1:])), free
        if block.used == 0:
            assert free == [(0, block.size)], free
    assert all(b in heap.blocks for b in blocks.values())   # (at most one empty: kept)
    again = [device._ctx.allocate(n) for n in sizes]
    assert _placements(again) == first                      # the same places, reused
    assert heap.stats()["reserved"] == reserved             # no new device memory
    for a in again:
        a.free()
    assert heap.stats()["used"] == before["used"]


def test_large_allocations_get_dedicated_blocks(device):
    """More than half a block gets a block of its own; once freed it is kept (within a
    budget) for the next large allocation of a similar size, and given back under
    memory pressure."""
    heap = device._ctx.tensor_heap
    with heap.lock:
        heap._trim()             # spare blocks other tests left could fit the second request
    big = device._ctx.allocate(heap.block_size)   # more than half a block
    block = big.block
    assert block.dedicated and big.offset == 0
    used = heap.stats()["used"]
    big.free()
    assert heap.stats()["used"] == used - big.size
    again = device._ctx.allocate(heap.block_size - 4096)
    assert again.block is block                   # reused, not allocated anew
    again.free()
    with heap.lock:
        heap._trim()
    assert block not in heap.blocks


def test_dropped_tensors_are_freed(device):
    gc.collect()
    used = device.memory_stats()["used"]
    for _ in range(20):
        vkml.tensor(np.ones(100_000, np.float32), device=device)
    gc.collect()
    assert device.memory_stats()["used"] == used


def test_mapped_memory_round_trip(device):
    """Host-visible devices copy straight into mapped memory; staging devices copy via
    the transfer queue; both give the same bytes.  A CPU driver maps its tensors unless
    told to stage; a discrete GPU stages either way (memory module doc)."""
    x = np.random.default_rng(0).integers(0, 255, 3 << 20, dtype=np.uint8)
    forced = os.environ.get("VKML_FORCE_STAGING", "0") not in ("", "0")
    for staged in (False, True):
        with vkml.Device(device.index, force_staging=staged) as dev:
            if staged or forced:
                assert not dev._ctx.mappable
            elif dev.info.device_type == "cpu":
                assert dev._ctx.mappable
            t = dev.tensor(x)
            np.testing.assert_array_equal(t.numpy(), x)


def test_parts_of_an_allocation(device):
    """``Allocation.sub_allocation``: a part bound on its own, with its own buffer views;
    freeing it keeps the parent's bytes, freeing the parent releases its parts (views
    destroyed before the block can go), and closing the device marks parts dead."""
    fmt = vk.VK_FORMAT_R32_UINT
    with vkml.Device(device.index) as dev:
        ctx = dev.context
        heap = ctx.tensor_heap
        parent = ctx.allocate(4096)
        used = heap.stats()["used"]
        a = parent.sub_allocation(1024, 512)
        assert (a.block, a.offset, a.size, a.parent) == (parent.block, parent.offset + 1024,
                                                           512, parent)
        a.view(fmt, 0, 512)
        assert len(parent.block.views) == 1
        a.free()
        assert not a.alive and parent.alive and heap.stats()["used"] == used
        assert not parent.block.views
        b = parent.sub_allocation(0, 4096)
        b.view(fmt, 0, 64)
        block = parent.block
        parent.free()
        assert not b.alive and not block.views and b not in heap.live
        with pytest.raises(vkml.DeviceError, match="freed"):
            parent.sub_allocation(0, 4)
        small = ctx.allocate(64)
        with pytest.raises(ValueError):
            small.sub_allocation(small.size - 32, 64)
        c = ctx.allocate(256).sub_allocation(0, 128)
        c.view(fmt, 0, 128)
    assert not c.alive
    c.free()                                   # a no-op once the device is closed
