"""CPU: the host side of numbatma.intrinsics.warp_roles - register budgets (the arithmetic and its refusals), the
grouped tile order (a bijection that walks group_m tile rows at a time), persistent grids, and the factories'
refusals; that the tensor-core kernels take their roles, turns and barriers from these blocks. (The device blocks
are compiled and checked through Gemm and Attention: tests/test_gemm_cpu.py, tests/test_attention_cpu.py; tile_handoff
also on its own, for every target.)"""
import ast
import pathlib
import re

import numpy as np
import pytest
from numba import cuda
from numba.cuda import types

import numbatma.compile as nbc
from numbatma.intrinsics import (lagged_release, persistent_grid, pingpong, register_budget, store_buffers,
                                 store_warp, tile_handoff, tile_origin, wait_release)


def test_register_budgets_fill_the_register_file():
    assert register_budget(2) == (168, 40, 232, 2, 384)  # the GEMM / attention budgets
    assert register_budget(1) == (248, 40, 256, 1, 256)
    assert register_budget(3, producer=24) == (128, 24, 160, 3, 512)
    for consumers in range(1, 8):
        b = register_budget(consumers)
        assert b.producer * 128 + consumers * b.consumer * 128 <= b.launch * b.threads <= 65536
        assert b.launch % 8 == 0 and b.consumer % 8 == 0 and b.consumer >= b.launch


@pytest.mark.parametrize("args, message", [
    ((0,), "consumers must be an int in 1..7 (8 warpgroups at most), got 0"),
    ((2, 36), "producer must be a multiple of 8 in 24..256 (setmaxnreg's rule), got 36"),
    ((2, 176), "producer=176 is more than the 168 registers"),
    ((7, 72), "producer=72 is more than the 64 registers"),
])
def test_register_budget_refusals_name_the_value(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        register_budget(*args)


@pytest.mark.parametrize("tiles_m, tiles_n, group_m", [(5, 7, 2), (8, 3, 8), (1, 9, 4), (13, 1, 3)])
def test_tile_origin_is_a_grouped_bijection(tiles_m, tiles_n, group_m):
    order = [tile_origin.py_func(t, tiles_m, tiles_n, group_m) for t in range(tiles_m * tiles_n)]
    assert sorted(order) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    for t, (m, n) in enumerate(order):  # tile t lies in group t // (group_m * tiles_n): rows of that group only
        first = t // (group_m * tiles_n) * group_m
        assert first <= m < min(first + group_m, tiles_m)
    assert order[:2] == [(0, 0), (min(1, tiles_m - 1), 0 if tiles_m > 1 else 1)]  # down the group first


def test_persistent_grid():
    assert persistent_grid(1000, 132) == 132
    assert persistent_grid(7, 132) == 7
    assert persistent_grid(0, 132) == 1
    assert persistent_grid(1000, 132, 2) == 264
    with pytest.raises(ValueError, match="sms must be an int >= 1, got 0"):
        persistent_grid(10, 0)


def test_factories_refuse_bad_constants():
    with pytest.raises(ValueError, match="lag must be an int in 0..7 .*got 8"):
        lagged_release(8)
    with pytest.raises(ValueError, match="count must be an int in 1..8, got 0"):
        store_buffers(0)
    with pytest.raises(ValueError, match=r"wait_in_publish needs count >= 2"):
        store_buffers(1, wait_in_publish=True)
    with pytest.raises(ValueError, match=r"consumers >= 2 .*got consumers=1"):
        pingpong(1)
    with pytest.raises(ValueError, match=r"within 1..15, got consumers=2, first_barrier=15"):
        pingpong(2, 15)
    with pytest.raises(ValueError, match=r"wait_release: lag must be an int in 0..7 .*got -1"):
        wait_release(-1)
    with pytest.raises(ValueError, match=r"wait_release: lag must be an int in 0..7 .*got 1.0"):
        wait_release(1.0)
    with pytest.raises(ValueError, match=r"tile_handoff: needs consumers >= 1 .*barrier id in 1..15, got consumers=2, "
                                         r"barrier=16"):
        tile_handoff(2, 16)
    with pytest.raises(ValueError, match=r"tile_handoff: .*got consumers=0"):
        tile_handoff(0)
    assert len(pingpong(2)) == 4 and len(lagged_release(1)) == 2 and len(store_buffers(2)) == 2
    assert store_warp(2)._fields == ("acquire", "publish", "free", "take")
    with pytest.raises(ValueError, match=r"store_warp: needs consumers >= 1 .*barrier ids 13..16 within 1..15, got "
                                         r"consumers=2, first_barrier=13"):
        store_warp(2, 13)
    with pytest.raises(ValueError, match=r"store_warp: .*got consumers=0"):
        store_warp(0)
    assert store_buffers(2, wait_in_publish=True) is not store_buffers(2)  # (another pair of device functions)
    assert len(tile_handoff(2)) == 2 and tile_handoff(2) is tile_handoff(2)
    assert wait_release(1) is wait_release(1)  # (one device function per constant: kernels share its compile)


# What the warp_roles blocks do for a kernel; a kernel of numbatma.kernels that calls these itself has grown its own
# copy of the skeleton again (issue 23).
RAW_SKELETON = {"setmaxnreg_inc", "setmaxnreg_dec", "named_barrier_sync", "named_barrier_arrive",
                "fence_proxy_async_shared_cta", "bulk_wait_group_read"}
KERNELS = pathlib.Path(__file__).resolve().parents[1] / "kernels"


def raw_skeleton_calls(source):
    return sorted({node.func.id for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in RAW_SKELETON})


@pytest.mark.parametrize("name", ["gemm.py", "attention.py", "_attention_backward_kernel.py"])
def test_tensor_core_kernels_take_their_skeleton_from_warp_roles(name):
    source = (KERNELS / name).read_text()
    assert raw_skeleton_calls(source) == [], f"kernels/{name} calls these itself instead of a warp_roles block"
    assert "warp_specialize(" in source and "register_budget(" in source


def test_the_skeleton_scan_finds_a_planted_call():
    assert raw_skeleton_calls("def f():\n    setmaxnreg_inc(232)\n    named_barrier_sync(1, 128)\n") == [
        "named_barrier_sync", "setmaxnreg_inc"]


def _handoff_kernel(out):
    tile = cuda.shared.array((2, 128), np.int32)
    c = cuda.threadIdx.x // 128
    tw = cuda.threadIdx.x % 128
    tile[c, tw] = tw
    HANDOFF.all()
    out[c, tw] = tile[1 - c, tw]
    HANDOFF.own(c)


HANDOFF = tile_handoff(2)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_120a"])
def test_tile_handoff_compiles_and_links_for_every_target(arch):
    """own / all: fence.proxy.async.shared::cta, then bar.sync on the warpgroup's id (1 + c) or on id 5 for 256."""
    ptx = nbc.compile_ptx(_handoff_kernel, (types.int32[:, ::1],), arch=arch)
    assert ptx.count("fence.proxy.async.shared::cta") == 2 and "bar.sync" in ptx
    text = nbc.sass(nbc.link_cubin(ptx, arch=arch))
    assert "BAR.SYNC" in text and "STL" not in text and "LDL" not in text
