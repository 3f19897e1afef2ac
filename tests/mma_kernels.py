"""Kernels, runners and NumPy references shared by the mma.sync / ldmatrix / stmatrix tests: tests/test_mma_cpu.py
(compile checks), tests/sim/test_sim_mma.py (simulator) and tests/test_gpu_mma.py (GPU).

* ``fragment_mma_kernel(kind)``: each warp of the block builds the A / B / C fragments of its own 16 x 8 x 16
  problem straight from global memory through ``mma_a_row_col`` / ``mma_b_row_col`` / ``mma_c_row_col``, runs
  one ``mma_m16n8k16`` and writes D back through ``mma_c_row_col``.
* ``fragment_f16acc_kernel()``: the same with float16 accumulators (``mma_m16n8k16_f16acc``); C and D travel as
  float16 bit patterns, packed into registers by hand.
* ``gemm_kernel(kind, b_layout, k)``: two warps compute a 32 x 8 tile ``D = A @ B + C`` over ``k`` (a multiple of
  16) from shared memory: A (32 x k, row-major) through ``ldmatrix`` x4, B through ``ldmatrix`` x2 of B stored
  (N, K) (``"nk"``), x2 ``.trans`` of B stored (K, N) (``"kn"``) or two x1 ``.trans`` (``"kn-x1"``).
* ``roundtrip_kernel(count, ld_trans, st_trans)``: one warp ``ldmatrix``-es ``count`` 8 x 8 matrices whose rows
  sit at shuffled 16-byte slots of a shared tile (each lane's row address from an array), writes the fragments
  out, then ``stmatrix``-es them to other shuffled slots of a poisoned tile that is copied out whole.
* ``pack_kernel(kind)``: ``pack_bf16x2`` / ``pack_f16x2`` and ``unpack_bf16x2`` / ``unpack_f16x2`` elementwise.

Inputs are fresh random data; outputs are poisoned (NaN, or bit patterns no correct result has). The references
are NumPy in float64, written from the PTX ISA's fragment tables independently of numbatma's simulator code.
"""
import functools

import numpy as np
from numba import cuda

from numbatma.intrinsics.mma import (
    ldmatrix,
    mma_a_row_col,
    mma_b_row_col,
    mma_c_row_col,
    mma_m16n8k16,
    mma_m16n8k16_f16acc,
    pack_bf16x2,
    pack_f16x2,
    stmatrix,
    unpack_bf16x2,
    unpack_f16x2,
)

KINDS = ("bf16", "f16")
B_LAYOUTS = ("nk", "kn", "kn-x1")
COUNTS = (1, 2, 4)
POISON16 = 0x7FFF  # a NaN in both bfloat16 and float16: no product of finite data
# SIM_START: every kernel passes a block barrier before its first warp-collective call. The simulator starts a
# block's threads one after another, and its hang check (intrinsics/_sim.py, _check_hang) looks only at the
# threads already started: on a loaded machine the first warps can wait in a collective for 50 ms while the last
# ones are not started yet, which it reports as a SimulatedHang. The barrier releases no thread before all exist.


# -- 16-bit formats in NumPy (no ml_dtypes needed: the GPU image may not have it) -----------------------------------
def to_bits(x, kind):
    """float values -> uint16 bit patterns of bfloat16 / float16, rounded to nearest even (from float32); NaN gives
    the canonical 0x7FFF (what cvt.rn.{bf16x2,f16x2}.f32 gave on an H100)."""
    x = np.asarray(x, np.float32)
    if kind == "f16":
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(np.isnan(x), np.uint16(0x7FFF), x.astype(np.float16).view(np.uint16))
    b = x.view(np.uint32).astype(np.uint64)
    out = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FFF), out)


def from_bits(bits, kind):
    """uint16 bit patterns -> float64 values."""
    bits = np.asarray(bits, np.uint16)
    with np.errstate(invalid="ignore"):  # (NaN patterns)
        if kind == "f16":
            return bits.view(np.float16).astype(np.float64)
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def random_bits(rng, shape, kind, scale=1.0):
    return to_bits(rng.standard_normal(shape) * scale, kind)


def check_product(got, a64, b64, c64, k, acc="f32"):
    """``got`` against ``a64 @ b64 + c64`` (float64): within ``2 (k / 16) + 2`` units of the accumulator type's
    precision (2^-23 float32, 2^-11 float16) of the sum of magnitudes ``|A| @ |B| + |C|`` - two per mma.sync plus
    slack, as the order and rounding inside the tensor core are the hardware's. (Seen on an H100: at most 0.8 units
    after one m16n8k16, 1.2 after sixteen; float16 accumulators gave the exactly rounded sum.) A misplaced element
    or a lost k-step is off by about the size of the terms, thousands of times more."""
    ref = a64 @ b64 + c64
    got = np.asarray(got, np.float64)
    assert got.shape == ref.shape
    assert not np.isnan(got).any(), f"{int(np.isnan(got).sum())} outputs never written (poison left)"
    eps, tiny = (2.0 ** -23, 1e-30) if acc == "f32" else (2.0 ** -11, 2.0 ** -24)  # (float16 subnormal spacing)
    bound = (2 * (k // 16) + 2) * eps * (np.abs(a64) @ np.abs(b64) + np.abs(c64)) + tiny
    bad = np.abs(got - ref) > bound
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} outside tolerance; first at "
                           f"{tuple(int(i) for i in np.argwhere(bad)[0])}: got {got[bad][0]}, want {ref[bad][0]}")
    return ref


# -- fragment mma -------------------------------------------------------------------------------------------------
@cuda.jit(device=True, inline="always")
def _pair(lo, hi):
    return np.uint32(np.uint32(lo) | (np.uint32(hi) << 16))  # (Numba widens the arithmetic to 64 bits)


@cuda.jit(device=True, inline="always")
def _a_reg(a_bits, r0, reg, lane):
    r, c = mma_a_row_col(reg, 0, lane)
    r1, c1 = mma_a_row_col(reg, 1, lane)
    return _pair(a_bits[r0 + r, c], a_bits[r0 + r1, c1])


@cuda.jit(device=True, inline="always")
def _b_reg(b_bits, reg, lane):
    r, c = mma_b_row_col(reg, 0, lane)
    r1, c1 = mma_b_row_col(reg, 1, lane)
    return _pair(b_bits[r, c], b_bits[r1, c1])


@cuda.jit(device=True, inline="always")
def _c_val(c, r0, reg, lane):
    r, col = mma_c_row_col(reg, lane)
    return c[r0 + r, col]


@cuda.jit(device=True, inline="always")
def _c16_reg(c_bits, r0, reg, lane):
    r, col = mma_c_row_col(2 * reg, lane)
    r1, col1 = mma_c_row_col(2 * reg + 1, lane)
    return _pair(c_bits[r0 + r, col], c_bits[r0 + r1, col1])


@cuda.jit(device=True, inline="always")
def _store_d(d, r0, lane, acc):
    r, c = mma_c_row_col(0, lane)
    d[r0 + r, c] = acc[0]
    r, c = mma_c_row_col(1, lane)
    d[r0 + r, c] = acc[1]
    r, c = mma_c_row_col(2, lane)
    d[r0 + r, c] = acc[2]
    r, c = mma_c_row_col(3, lane)
    d[r0 + r, c] = acc[3]


@functools.lru_cache(maxsize=None)
def fragment_mma_kernel(kind):
    """``kernel[1, 32 * warps](a_bits (16 w, 16) uint16, b_bits (w, 16, 8) uint16, c (16 w, 8) f32, d)``: warp
    ``w`` computes rows ``16 w ..`` of D from its own B."""

    @cuda.jit
    def kernel(a_bits, b_bits, c, d):
        cuda.syncthreads()  # (SIM_START)
        lane = cuda.threadIdx.x % 32
        w = cuda.threadIdx.x // 32
        r0 = 16 * w
        a = (_a_reg(a_bits, r0, 0, lane), _a_reg(a_bits, r0, 1, lane), _a_reg(a_bits, r0, 2, lane),
             _a_reg(a_bits, r0, 3, lane))
        bw = b_bits[w]
        b = (_b_reg(bw, 0, lane), _b_reg(bw, 1, lane))
        acc = (_c_val(c, r0, 0, lane), _c_val(c, r0, 1, lane), _c_val(c, r0, 2, lane), _c_val(c, r0, 3, lane))
        acc = mma_m16n8k16(acc, a, b, kind)
        _store_d(d, r0, lane, acc)

    return kernel


def run_fragment_mma(rng, kind, warps=2):
    a = random_bits(rng, (16 * warps, 16), kind)
    b = random_bits(rng, (warps, 16, 8), kind)
    c = rng.standard_normal((16 * warps, 8)).astype(np.float32)
    d = np.full((16 * warps, 8), np.nan, np.float32)
    fragment_mma_kernel(kind)[1, 32 * warps](a, b, c, d)
    a64, b64 = from_bits(a, kind), from_bits(b, kind)
    for w in range(warps):
        rows = slice(16 * w, 16 * w + 16)
        check_product(d[rows], a64[rows], b64[w], c[rows].astype(np.float64), 16)
    return d


@functools.lru_cache(maxsize=None)
def fragment_f16acc_kernel():
    """``kernel[1, 32 * warps](a_bits, b_bits (w, 16, 8), c_bits (16 w, 8) uint16, d_bits (16 w, 8) uint16)``:
    float16 operands and accumulators."""

    @cuda.jit
    def kernel(a_bits, b_bits, c_bits, d_bits):
        cuda.syncthreads()  # (SIM_START)
        lane = cuda.threadIdx.x % 32
        w = cuda.threadIdx.x // 32
        r0 = 16 * w
        a = (_a_reg(a_bits, r0, 0, lane), _a_reg(a_bits, r0, 1, lane), _a_reg(a_bits, r0, 2, lane),
             _a_reg(a_bits, r0, 3, lane))
        bw = b_bits[w]
        b = (_b_reg(bw, 0, lane), _b_reg(bw, 1, lane))
        acc = (_c16_reg(c_bits, r0, 0, lane), _c16_reg(c_bits, r0, 1, lane))
        acc = mma_m16n8k16_f16acc(acc, a, b)
        for reg in range(2):
            word = acc[0] if reg == 0 else acc[1]
            r, c = mma_c_row_col(2 * reg, lane)
            d_bits[r0 + r, c] = np.uint16(word & np.uint32(0xFFFF))
            r, c = mma_c_row_col(2 * reg + 1, lane)
            d_bits[r0 + r, c] = np.uint16(word >> np.uint32(16))

    return kernel


def run_fragment_f16acc(rng, warps=2):
    a = random_bits(rng, (16 * warps, 16), "f16")
    b = random_bits(rng, (warps, 16, 8), "f16")
    c = random_bits(rng, (16 * warps, 8), "f16")
    d = np.full((16 * warps, 8), POISON16, np.uint16)
    fragment_f16acc_kernel()[1, 32 * warps](a, b, c, d)
    a64, b64, c64 = from_bits(a, "f16"), from_bits(b, "f16"), from_bits(c, "f16")
    got = from_bits(d, "f16")
    for w in range(warps):
        rows = slice(16 * w, 16 * w + 16)
        check_product(got[rows], a64[rows], b64[w], c64[rows], 16, acc="f16")
    return d


# -- ldmatrix-fed GEMM tile ---------------------------------------------------------------------------------------
def _b_loader(b_layout, k):
    if b_layout == "nk":  # B stored (8, k): rows are n; x2 without .trans gives B's fragment
        @cuda.jit(device=True, inline="always")
        def load_b(sb, k0, lane):
            return ldmatrix(sb, (lane % 8) * k + k0 + 8 * ((lane // 8) % 2), 2, False)
    elif b_layout == "kn":  # B stored (k, 8): rows are k; x2 .trans
        @cuda.jit(device=True, inline="always")
        def load_b(sb, k0, lane):
            return ldmatrix(sb, (k0 + lane % 16) * 8, 2, True)
    else:  # "kn-x1": two x1 .trans, rows k0.. and k0 + 8..
        @cuda.jit(device=True, inline="always")
        def load_b(sb, k0, lane):
            lo = ldmatrix(sb, (k0 + lane % 8) * 8, 1, True)
            hi = ldmatrix(sb, (k0 + 8 + lane % 8) * 8, 1, True)
            return (lo[0], hi[0])
    return load_b


@functools.lru_cache(maxsize=None)
def gemm_kernel(kind, b_layout, k):
    """``kernel[1, 64](a_bits (32, k), b_bits ((k, 8) or (8, k)), c (32, 8) f32, d (32, 8) f32)``."""
    b_shape = (8, k) if b_layout == "nk" else (k, 8)
    b_cols = b_shape[1]
    load_b = _b_loader(b_layout, k)

    @cuda.jit
    def kernel(a_bits, b_bits, c, d):
        sa = cuda.shared.array((32, k), np.uint16, alignment=16)
        sb = cuda.shared.array(b_shape, np.uint16, alignment=16)
        tid = cuda.threadIdx.x
        for i in range(tid, 32 * k, 64):
            sa[i // k, i % k] = a_bits[i // k, i % k]
        for i in range(tid, 8 * k, 64):
            sb[i // b_cols, i % b_cols] = b_bits[i // b_cols, i % b_cols]
        cuda.syncthreads()
        lane = tid % 32
        r0 = 16 * (tid // 32)
        acc = (_c_val(c, r0, 0, lane), _c_val(c, r0, 1, lane), _c_val(c, r0, 2, lane), _c_val(c, r0, 3, lane))
        for k0 in range(0, k, 16):
            # matrices: rows 0-7 / 8-15 of columns k0.., then of columns k0 + 8..: A's registers 0..3
            a = ldmatrix(sa, (r0 + lane % 16) * k + k0 + 8 * (lane // 16), 4, False)
            acc = mma_m16n8k16(acc, a, load_b(sb, k0, lane), kind)
        _store_d(d, r0, lane, acc)

    return kernel


def run_gemm(rng, kind, b_layout, k):
    a = random_bits(rng, (32, k), kind)
    b_kn = random_bits(rng, (k, 8), kind)
    b = np.ascontiguousarray(b_kn.T) if b_layout == "nk" else b_kn
    c = rng.standard_normal((32, 8)).astype(np.float32)
    d = np.full((32, 8), np.nan, np.float32)
    gemm_kernel(kind, b_layout, k)[1, 64](a, b, c, d)
    check_product(d, from_bits(a, kind), from_bits(b_kn, kind), c.astype(np.float64), k)
    return d


# -- ldmatrix / stmatrix round trip -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def roundtrip_kernel(count, ld_trans, st_trans):
    """``kernel[1, 32](src (8 count, 16) uint16, ld_off (32,), st_off (32,), frags (32, count) uint32,
    dst (8 count, 16) uint16)``: the tile holds 2 * 8 count row slots of 8 elements; lane ``l`` addresses
    element ``ld_off[l]`` (``st_off[l]``) of it."""
    rows = 8 * count

    @cuda.jit
    def kernel(src, ld_off, st_off, frags, dst):
        t_in = cuda.shared.array((rows, 16), np.uint16, alignment=16)
        t_out = cuda.shared.array((rows, 16), np.uint16, alignment=16)
        lane = cuda.threadIdx.x
        for i in range(lane, rows * 16, 32):
            t_in[i // 16, i % 16] = src[i // 16, i % 16]
            t_out[i // 16, i % 16] = np.uint16(0x7FFF)
        cuda.syncthreads()  # (the block is one warp; SIM_START)
        regs = ldmatrix(t_in, ld_off[lane], count, ld_trans)
        for i in range(count):
            frags[lane, i] = regs[i]
        stmatrix(t_out, st_off[lane], regs, st_trans)
        cuda.syncwarp()
        for i in range(lane, rows * 16, 32):
            dst[i // 16, i % 16] = t_out[i // 16, i % 16]

    return kernel


def row_offsets(rng, count):
    """Element offsets of the 32 lanes' rows in a (8 count, 16) tile: distinct shuffled 8-element slots for the
    lanes that supply addresses; the others point at random (valid) slots - their addresses are not used."""
    slots = 2 * 8 * count
    used = rng.permutation(slots)[:8 * count]
    rest = rng.integers(0, slots, 32 - 8 * count)
    return (np.concatenate([used, rest]) * 8).astype(np.int32)


def ldmatrix_reference(src, ld_off, count, trans):
    """(32, count) uint32: what each lane's registers hold, from the PTX ISA's ldmatrix description."""
    flat = src.reshape(-1)
    out = np.zeros((32, count), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(count):
            m = np.stack([flat[ld_off[8 * i + j]:ld_off[8 * i + j] + 8] for j in range(8)])  # row j: lane 8i+j
            if trans:
                lo, hi = m[2 * t, g], m[2 * t + 1, g]
            else:
                lo, hi = m[g, 2 * t], m[g, 2 * t + 1]
            out[lane, i] = int(lo) | int(hi) << 16
    return out


def stmatrix_reference(frags, st_off, count, trans, shape):
    """The tile after stmatrix of the registers ``frags`` (32, count) into a poisoned tile of ``shape``."""
    flat = np.full(int(np.prod(shape)), POISON16, np.uint16)
    for i in range(count):
        m = np.zeros((8, 8), np.uint16)
        for lane in range(32):
            g, t = lane // 4, lane % 4
            m[g, 2 * t] = frags[lane, i] & 0xFFFF
            m[g, 2 * t + 1] = frags[lane, i] >> 16
        if trans:
            m = m.T
        for j in range(8):
            o = st_off[8 * i + j]
            flat[o:o + 8] = m[j]
    return flat.reshape(shape)


def run_roundtrip(rng, count, ld_trans, st_trans):
    rows = 8 * count
    src = rng.integers(0, 0x7FFF, (rows, 16), dtype=np.uint16)  # (never the poison)
    ld_off, st_off = row_offsets(rng, count), row_offsets(rng, count)
    frags = np.full((32, count), 0xDEADBEEF, np.uint32)
    dst = np.zeros((rows, 16), np.uint16)
    roundtrip_kernel(count, ld_trans, st_trans)[1, 32](src, ld_off, st_off, frags, dst)
    want_frags = ldmatrix_reference(src, ld_off, count, ld_trans)
    np.testing.assert_array_equal(frags, want_frags)
    want = stmatrix_reference(want_frags, st_off, count, st_trans, (rows, 16))
    np.testing.assert_array_equal(dst, want)
    # and the composition in words: the matrices come back, transposed when exactly one side transposes
    flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
    for i in range(count):
        m = np.stack([flat_src[ld_off[8 * i + j]:ld_off[8 * i + j] + 8] for j in range(8)])
        back = np.stack([flat_dst[st_off[8 * i + j]:st_off[8 * i + j] + 8] for j in range(8)])
        np.testing.assert_array_equal(back, m.T if ld_trans != st_trans else m)
    return frags, dst


# -- pack / unpack ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def pack_kernel(kind):
    """``kernel[blocks, 128](lo, hi (n,) f32, packed (n,) uint32, words (n,) uint32, out_lo, out_hi (n,) f32)``."""
    pack = pack_bf16x2 if kind == "bf16" else pack_f16x2
    unpack = unpack_bf16x2 if kind == "bf16" else unpack_f16x2

    @cuda.jit
    def kernel(lo, hi, packed, words, out_lo, out_hi):
        i = cuda.grid(1)
        if i < lo.size:
            packed[i] = pack(lo[i], hi[i])
            x, y = unpack(words[i])
            out_lo[i] = x
            out_hi[i] = y

    return kernel


def pack_inputs(rng, kind, n=4096):
    """float32 values that exercise rounding: random magnitudes over the format's range, exact ties (half an ulp
    of the 16-bit format away from a representable value, both parities), subnormals, overflow, +-0, +-inf, NaN."""
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    base = to_bits(rng.standard_normal(n // 4).astype(np.float32), kind)
    ties = ((from_bits(base, kind) + from_bits(base + 1, kind)) / 2).astype(np.float32)  # exact halfway points
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, -3e-39, 6e-8, 3e-5, 65504.0, 65520.0, 1e5, 3.4e38,
                         np.nan, -np.nan], np.float32)
    x = np.concatenate([x, ties, specials])
    return x, rng.permutation(x)


def run_pack(rng, kind):
    lo, hi = pack_inputs(rng, kind)
    n = lo.size
    words = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    packed = np.full(n, 0xDEADBEEF, np.uint32)
    out_lo = np.full(n, np.nan, np.float32)
    out_hi = np.full(n, np.nan, np.float32)
    pack_kernel(kind)[(n + 127) // 128, 128](lo, hi, packed, words, out_lo, out_hi)
    want = to_bits(lo, kind).astype(np.uint32) | to_bits(hi, kind).astype(np.uint32) << 16
    np.testing.assert_array_equal(packed, want)
    for got, half in ((out_lo, words & 0xFFFF), (out_hi, words >> 16)):
        with np.errstate(invalid="ignore"):
            ref = from_bits(half.astype(np.uint16), kind).astype(np.float32)
        nan = np.isnan(ref)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    return packed
