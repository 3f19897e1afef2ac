"""Under NUMBA_ENABLE_CUDASIM=1: wgmma (numbatma.intrinsics.wgmma) against NumPy on fresh random data with poisoned
outputs - the kernels of tests/wgmma_kernels.py on small shapes (the GPU runs the same ones, and more:
tests/test_gpu_wgmma.py): every operand kind, float16 accumulators, A from shared memory and from registers, B in
both majors, every swizzle, scale_d = 0, alpha, bias, the three ways out (acc[i] / wgmma_store + TMA store /
wgmma_store_global) and P @ V through wgmma_a_fragments. Then the misuse the simulator reports: accumulators read
before the covering wait, a wgmma on unfenced accumulators or on A fragments written after the last fence, bf16
fragments fed to an f16 wgmma, a descriptor whose swizzle disagrees with the tile (the tile off its swizzle repeat,
a box narrower than its swizzle), a wgmma reading a tile TMA is still filling."""
import importlib

import numpy as np
import pytest
from numba import cuda

from numbatma.intrinsics import (
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    shared_view,
    tma_load,
    wgmma,
    wgmma_a_fragments,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_scale,
    wgmma_store_global,
    wgmma_wait_group,
    wgmma_zeros,
)
from numbatma.intrinsics._sim import SimulatedMisuse

import wgmma_kernels as K

RNG = np.random.default_rng()


@pytest.mark.parametrize("case", K.SIM_CASES, ids=[c.name for c in K.SIM_CASES])
def test_wgmma_tile(case):
    K.run_case(RNG, case)


@pytest.mark.parametrize("row_origin, col_origin", [(0, 0), (-60, 9), (30, -14), (0, 1000)])
def test_store_global_edges(row_origin, col_origin):
    K.run_case(RNG, K.make(n=16, a_swizzle=32, b_swizzle=32, out="global", k_steps=1), row_origin, col_origin)


def test_rounding_to_nearest_even():
    """What wgmma_a_fragments packs (the simulator's cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32) and the references'
    rounding are ml_dtypes' round-to-nearest-even: ties, subnormals, signed zero."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    E = importlib.import_module("numbatma.intrinsics.wgmma_epilogue")
    x = RNG.standard_normal(1000).astype(np.float32)
    x[:5] = [1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 2.0 ** -130, -0.0, 1.0 + 2.0 ** -11]
    for kind, dtype in (("bf16", ml_dtypes.bfloat16), ("f16", np.float16)):
        want = x.astype(dtype).view(np.uint16)
        np.testing.assert_array_equal(K.to_bits(x, kind), want)
        np.testing.assert_array_equal(E._round_bits(x, kind), want)


# -- misuse ------------------------------------------------------------------------------------------------------------
def _inputs(kind="bf16", swizzle=64, box_cols=None):
    """A (64 x 32) and B (16 x 32, K-major) device arrays and their TensorMaps."""
    a, _ = K.random_operand(RNG, (64, 32), kind)
    b, _ = K.random_operand(RNG, (16, 32), kind)
    cols = box_cols or swizzle // 2
    a_dev, b_dev = cuda.to_device(a), cuda.to_device(b)
    return (K.tensormap(a_dev, kind, (64, cols), swizzle), K.tensormap(b_dev, kind, (16, cols), swizzle),
            np.full((64, 16), np.nan, np.float32))


def _misuse_kernel(mode):
    """One warpgroup: TMA-load A (64 x 32) and B (16 x 32) - bf16, 64-byte swizzle - then m64n16 with a misuse."""

    @cuda.jit
    def kernel(a_map, b_map, out):
        buf = cuda.shared.array(64 * 32 + 512, np.uint16, alignment=1024)
        bt = cuda.shared.array((16, 32), np.uint16, alignment=1024)
        bar = cuda.shared.array(1, np.uint64)
        at = shared_view(buf, 0, (64, 32))
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, a_map.box_bytes + b_map.box_bytes)
            tma_load(at, a_map, (0, 0), bar)
            tma_load(bt, b_map, (0, 0), bar)
        cuda.syncthreads()
        if mode != "no wait for TMA":
            mbarrier_wait_parity(bar, 0)
        t = cuda.threadIdx.x
        acc = wgmma_zeros(16)
        if mode == "unfenced":
            acc = wgmma_scale(acc, 2.0)  # (written by FMULs: a fence must come before a wgmma reads it)
        else:
            acc = wgmma_fence(acc)
        acc = wgmma(acc, wgmma_desc(at, a_map, "K", 0, 0), wgmma_desc(bt, b_map, "K", 0, 0), 1)
        wgmma_commit_group()
        if mode == "read before wait":
            out[t // 4, t % 4] = acc[0]
        if mode == "store before wait":
            wgmma_store_global(acc, out, 0, 0)
        acc = wgmma_wait_group(0, acc)
        if mode.startswith("fragments"):
            frags = wgmma_a_fragments(acc, "f16" if mode == "fragments f16" else "bf16")
            acc = wgmma_zeros(16)
            if mode == "fragments unfenced":
                acc = wgmma(acc, frags[0], wgmma_desc(bt, b_map, "K", 0, 0), 0)
            else:
                acc, frags = wgmma_fence((acc, frags))
                acc = wgmma(acc, frags[0], wgmma_desc(bt, b_map, "K", 0, 0), 1)
            wgmma_commit_group()
            acc = wgmma_wait_group(0, acc)
        wgmma_store_global(acc, out, 0, 0)

    return kernel


@pytest.mark.parametrize("mode, pattern", [
    ("read before wait", r"accumulator\[0\] reads an accumulator that the wgmma at .* is still writing: read it only "
                         r"from the value returned by the wgmma_wait_group"),
    ("store before wait", r"wgmma_store_global reads an accumulator that the wgmma at .* is still writing"),
    ("unfenced", r"wgmma at .* accumulates into registers that other instructions wrote \(wgmma_zeros, wgmma_scale, "
                 r"\.\.\.\) with no wgmma_fence\(acc\) in between"),
    ("fragments unfenced", r"wgmma at .* reads A fragments written at .* with no wgmma_fence after them"),
    ("fragments f16", r"the A fragments hold f16 values \(wgmma_a_fragments at .*\) but B is bf16"),
    ("no wait for TMA", r"wgmma reads shared bytes .* of the tile the TMA load at .* before that copy is known "
                        r"complete"),
])
def test_misuse_is_reported(mode, pattern):
    a_map, b_map, out = _inputs()
    with pytest.raises(SimulatedMisuse, match=pattern):
        _misuse_kernel(mode)[1, 128](a_map, b_map, out)


def test_tile_off_its_swizzle_repeat_is_reported():
    """A tile carved 512 bytes into its buffer and described with a 128-byte swizzle (repeat 1024 bytes): TMA swizzles
    by address bits, the descriptor from the tile's start - they disagree."""
    a, _ = K.random_operand(RNG, (64, 64), "bf16")
    a_map = K.tensormap(cuda.to_device(a), "bf16", (64, 64), 128)

    @cuda.jit
    def kernel(a_map, out):
        buf = cuda.shared.array(64 * 64 + 256, np.uint16, alignment=1024)
        at = shared_view(buf, 256, (64, 64))
        bar = cuda.shared.array(1, np.uint64)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, a_map.box_bytes)
            tma_load(at, a_map, (0, 0), bar)
        cuda.syncthreads()
        mbarrier_wait_parity(bar, 0)
        acc = wgmma(wgmma_fence(wgmma_zeros(64)), wgmma_desc(at, a_map, "K", 0, 0), wgmma_desc(at, a_map, "K", 0, 0),
                    1)
        wgmma_commit_group()
        wgmma_store_global(wgmma_wait_group(0, acc), out, 0, 0)

    # (the TMA load into it is refused first: TMA needs the tile on the swizzle repeat too)
    with pytest.raises(SimulatedMisuse, match=r"(wgmma_desc: the tile starts 512 bytes into its shared allocation, not "
                                              r"on a multiple of 1024 bytes: the descriptor's 128-byte swizzle|"
                                              r"tma_load at .*: the shared tile is at an address that is not a "
                                              r"multiple of 1024 bytes \(the repeat of its 128-byte swizzle\))"):
        kernel[1, 128](a_map, np.zeros((64, 64), np.float32))


def test_box_narrower_than_its_swizzle_is_reported():
    """A 32-element (64-byte) bf16 box with a 128-byte swizzle: TMA pads each row to 128 bytes, wgmma would read the
    padding as K = 32 .. 63."""
    a_map, b_map, out = _inputs(swizzle=128, box_cols=32)

    @cuda.jit
    def kernel(a_map, b_map, out):
        at = cuda.shared.array((64, 64), np.uint16, alignment=1024)
        wgmma_desc(at, a_map, "K", 0, 0)

    with pytest.raises(SimulatedMisuse, match=r"wgmma_desc: the TensorMap's box rows are 64 bytes but its 128-byte "
                                              r"swizzle needs rows of exactly 128 bytes"):
        kernel[1, 1](a_map, b_map, out)


def test_the_fenced_fragments_work():
    """The same kernel without misuse: P = A @ B, then P (bf16 fragments) @ B again, against NumPy."""
    a_map, b_map, out = _inputs()
    _misuse_kernel("fragments ok")[1, 128](a_map, b_map, out)
    a64 = K.from_bits(np.asarray(a_map.array).view(np.uint16), "bf16")
    b64 = K.from_bits(np.asarray(b_map.array).view(np.uint16), "bf16")
    p = K.from_bits(K.to_bits((a64[:, :16] @ b64[:, :16].T).astype(np.float32), "bf16"), "bf16")  # one k-step
    ref = p @ b64[:, :16].T
    # (a float32 P a rounding away from a bf16 tie may round the other way: 2^-8 of the terms)
    K.assert_close(out, ref, 2.0 ** -8 * (np.abs(p) @ np.abs(b64[:, :16].T)) + 1e-6, "P @ B")


def test_descriptor_swizzle_that_disagrees_with_the_load_is_reported():
    """B loaded through a TensorMap with a 32-byte swizzle (16-element box rows), described for wgmma through one with
    a 64-byte swizzle: the descriptor's swizzle bits disagree with how the bytes were written. The simulator names
    the tile, both swizzles and the load."""
    a_map, b_map, out = _inputs()
    b, _ = K.random_operand(RNG, (16, 32), "bf16")
    b32_map = K.tensormap(cuda.to_device(b), "bf16", (16, 16), 32)

    @cuda.jit
    def kernel(a_map, b_map, b32_map, out):
        at = cuda.shared.array((64, 32), np.uint16, alignment=1024)
        bt = cuda.shared.array((16, 32), np.uint16, alignment=1024)
        bar = cuda.shared.array(1, np.uint64)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, a_map.box_bytes + 2 * b32_map.box_bytes)
            tma_load(at, a_map, (0, 0), bar)
            tma_load(shared_view(bt, 0, (16, 16)), b32_map, (0, 0), bar)
            tma_load(shared_view(bt, 16 * 16, (16, 16)), b32_map, (0, 16), bar)
        cuda.syncthreads()
        mbarrier_wait_parity(bar, 0)
        acc = wgmma(wgmma_fence(wgmma_zeros(16)), wgmma_desc(at, a_map, "K", 0, 0),
                    wgmma_desc(bt, b_map, "K", 0, 0), 1)
        wgmma_commit_group()
        wgmma_store_global(wgmma_wait_group(0, acc), out, 0, 0)

    with pytest.raises(SimulatedMisuse, match=r"wgmma_desc: the descriptor reads the tile \(16, 32\) uint16 at byte 0 "
                                              r"of its shared allocation, given at .*wgmma_desc\(bt, b_map.* with a "
                                              r"64-byte swizzle .* but the tile the TMA load at .* wrote it with a "
                                              r"32-byte swizzle"):
        kernel[1, 128](a_map, b_map, b32_map, out)
