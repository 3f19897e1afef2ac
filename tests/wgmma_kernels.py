"""Kernels, runners and NumPy references shared by the wgmma tests: tests/test_wgmma_cpu.py (compile checks),
tests/sim/test_sim_wgmma.py (simulator) and tests/test_gpu_wgmma.py (GPU).

One kernel factory, ``gemm_kernel(case)``: ``case.groups`` warpgroups (128 threads each) compute
``D = A (64 g x K) @ B (K x N)``, one 64-row slab per warpgroup, from one TMA load of everything into shared
memory (A as K-major boxes side by side along K; B K-major - given as (N, K) - or MN-major - given as (K, N),
boxes side by side along N, the last one partly out of bounds when the swizzle width does not divide N):

* A from shared memory (``wgmma_desc``) or from registers (fragments gathered from global memory by each thread
  through the PTX ISA's register-fragment layout, fenced together with the accumulator);
* every operand kind (bf16, f16, tf32, e4m3, e5m2 and mixed float8 pairs), float32 or float16 accumulators;
* ``scale0``: the accumulator starts as NaN (``wgmma_add_bias`` of a NaN vector) and the first k-step passes
  ``scale_d = 0``; ``alpha`` (``wgmma_scale``), ``bias`` (``wgmma_add_bias`` from global or shared memory, a
  vector shorter than N read from an offset);
* ``chain``: ``P = A @ B`` (also stored, for an exact reference), ``O = P @ V`` with P as register A fragments
  (``wgmma_a_fragments``) and V from shared memory;
* out: ``"rowcol"`` (``acc[i]`` placed with ``wgmma_row_col``; float16 accumulators as raw words),
  ``"global"`` (``wgmma_store_global`` into a strided view of a sentinel-filled parent, the tile's origin
  partly outside the view) or ``"tile"`` (``wgmma_store`` into a swizzled shared tile - one box, or boxes side by
  side - then TMA stores).

Inputs are fresh random data (values exact in their format); outputs are poisoned or sentinel-filled. The
references are NumPy in float64, from the operands' values (decoded here, independently of numbatma's simulator;
ml_dtypes only names the bfloat16 type of BFLOAT16 TensorMaps - the GPU image has it). Tolerances scale with the
number of k-steps (``bound``).
"""
import functools
import math
from typing import NamedTuple

import numpy as np
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    shared_view,
    tma_load,
    tma_store,
    wgmma,
    wgmma_a_fragments,
    wgmma_add_bias,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_row_col,
    wgmma_scale,
    wgmma_store,
    wgmma_store_global,
    wgmma_wait_group,
    wgmma_zeros,
    wgmma_zeros_f16,
)
from numbatma.tensormap import ArrayLayout, array_layout, layout_view

KSTEP = {"bf16": 16, "f16": 16, "tf32": 8, "e4m3": 32, "e5m2": 32}
ITEMSIZE = {"bf16": 2, "f16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1}
TILE_DTYPE = {"bf16": np.uint16, "f16": np.float16, "tf32": np.float32, "e4m3": np.uint8, "e5m2": np.uint8}
OUT_DTYPES = {"float32": np.float32, "float16": np.float16, "bf16": np.uint16}
SENTINEL = {"float32": 7.0, "float16": 7.0, "bf16": 0x40E0}  # 7.0 in bfloat16: 0x40E0
STATIC_SMEM = 48 * 1024


class Case(NamedTuple):
    n: int = 64
    a: str = "bf16"  # A kind
    b: str = None  # B kind (None: A's)
    acc: str = "f32"
    a_src: str = "smem"  # or "reg"
    a_swizzle: int = 128
    b_major: str = "K"
    b_swizzle: int = 128
    k: int = 64
    groups: int = 1  # warpgroups: M = 64 * groups
    out: str = "global"  # "rowcol", "global", "tile"
    out_dtype: str = "float32"  # global / tile: "float32", "float16", "bf16"
    c_swizzle: int = 128  # tile: the C TensorMap's swizzle
    c_groups: int = 1  # tile: boxes side by side in the C tile
    alpha: bool = False
    bias: str = None  # None, "global", "shared"
    scale0: bool = False
    chain: tuple = None  # (Nv, V major, V swizzle): O = bf16/f16(P) @ V
    tf32_map: bool = False  # tf32: TensorMap(..., tf32=True) instead of a FLOAT32 map

    @property
    def bkind(self):
        return self.b or self.a

    @property
    def name(self):
        parts = [f"n{self.n}", self.a if self.b in (None, self.a) else f"{self.a}x{self.b}", f"acc{self.acc}",
                 f"A{self.a_src}" + (f"{self.a_swizzle}" if self.a_src == "smem" else ""),
                 f"B{self.b_major}{self.b_swizzle}", f"k{self.k}"]
        if self.groups > 1:
            parts.append(f"wg{self.groups}")
        parts.append(self.out + ("" if self.out == "rowcol" else f"-{self.out_dtype}"))
        if self.out == "tile":
            parts.append(f"C{self.c_swizzle}x{self.c_groups}")
        parts += [x for x, on in (("alpha", self.alpha), ("scale0", self.scale0), ("tf32map", self.tf32_map)) if on]
        if self.bias:
            parts.append(f"bias-{self.bias}")
        if self.chain:
            parts.append("chain-n{}-{}{}".format(*self.chain))
        return "-".join(parts)


def width(kind, swizzle):
    """Elements per box row: the swizzle span, or one 16-byte core-matrix column without swizzle."""
    return (swizzle or 16) // ITEMSIZE[kind]


def geometry(case):
    """Compile-time facts of a case: per operand (rows, width, groups) of its shared tile, load coordinates,
    shared bytes. Raises ValueError for a case the hardware cannot run."""
    g = {}
    m = 64 * case.groups
    ak, bk = case.a, case.bkind
    if case.k % KSTEP[ak]:
        raise ValueError("K must be a multiple of the k-step")
    if case.a_src == "smem":
        wa = width(ak, case.a_swizzle)
        if case.k % wa:
            raise ValueError("K must be a multiple of A's box width")
        g["a"] = (m, wa, case.k // wa)
    else:
        g["a"] = (1, 1, 1)
    wb = width(bk, case.b_swizzle)
    if case.b_major == "K":
        if case.k % wb:
            raise ValueError("K must be a multiple of B's box width")
        g["b"] = (case.n, wb, case.k // wb)
    else:
        g["b"] = (case.k, wb, -(-case.n // wb))
    if case.chain:
        nv, v_major, v_swizzle = case.chain
        wv = width(case.a, v_swizzle)
        g["v"] = (nv, wv, case.n // wv) if v_major == "K" else (case.n, wv, -(-nv // wv))
    else:
        g["v"] = (1, 1, 1)
    if case.out == "tile":
        itemsize = np.dtype(OUT_DTYPES[case.out_dtype]).itemsize
        wc = (case.c_swizzle or 16) // itemsize
        if (case.chain[0] if case.chain else case.n) % (wc * case.c_groups):
            raise ValueError("N must be a multiple of the C tile width")
        g["c"] = (64, wc, case.c_groups)
    else:
        g["c"] = (1, 1, 1)
    sizes = {"a": ITEMSIZE[ak], "b": ITEMSIZE[bk], "v": ITEMSIZE[case.a],
             "c": np.dtype(OUT_DTYPES[case.out_dtype]).itemsize}
    total = sum(-(-math.prod(g[x]) * sizes[x] // 1024) * 1024 for x in g) + 1024
    if total > STATIC_SMEM:
        raise ValueError(f"{total} bytes of static shared memory")
    return g


# -- element formats in NumPy (no ml_dtypes: the GPU image may not have it) ---------------------------------------
def to_bits(x, kind):
    """float values -> uint16 bits of bfloat16 / float16, rounded to nearest even; NaN -> 0x7FFF."""
    x = np.asarray(x, np.float32)
    if kind == "f16":
        with np.errstate(over="ignore", invalid="ignore"):
            out = x.astype(np.float16).view(np.uint16)
    else:
        b = x.view(np.uint32).astype(np.uint64)
        out = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FFF), out)


def from_bits(bits, kind):
    bits = np.asarray(bits, np.uint16)
    with np.errstate(invalid="ignore"):
        if kind == "f16":
            return bits.view(np.float16).astype(np.float64)
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@functools.lru_cache(maxsize=None)
def fp8_table(kind):
    """The value of each of the 256 float8 codes (NaN / inf where special): OCP FP8 e4m3fn / e5m2."""
    codes = np.arange(256)
    sign = np.where(codes >> 7, -1.0, 1.0)
    if kind == "e4m3":
        e, m, bias, mbits = (codes >> 3) & 0xF, codes & 7, 7, 3
    else:
        e, m, bias, mbits = (codes >> 2) & 0x1F, codes & 3, 15, 2
    value = np.where(e == 0, m / 2.0 ** mbits * 2.0 ** (1 - bias), (1 + m / 2.0 ** mbits) * 2.0 ** (e - bias))
    value = sign * value
    if kind == "e4m3":
        value[(codes & 0x7F) == 0x7F] = np.nan
    else:
        special = e == 31
        value[special & (m == 0)] = sign[special & (m == 0)] * np.inf
        value[special & (m != 0)] = np.nan
    return value


def random_operand(rng, shape, kind, scale=1.0):
    """(stored data, float64 values): bf16 as uint16 bits, f16 as float16, tf32 as float32 with the low 13 bits
    clear (exact in tf32), float8 as uint8 codes of the values 0, +-0.5, +-1, +-1.5, +-2, +-3: every product is a
    multiple of 1/4 below 10, so every partial sum of up to 256 k is exact in 14 bits - the float8 tensor cores
    of Hopper accumulate with fewer bits than float32 (seen on an H100: errors of about 2^-10 of the sum of
    magnitudes with arbitrary e4m3 data), and this keeps the float8 checks exact instead of loose."""
    if kind in ("e4m3", "e5m2"):
        table = fp8_table(kind)
        codes = np.nonzero(np.isin(table, [0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0, 3.0, -3.0]))[0]
        data = rng.choice(codes, size=shape).astype(np.uint8)
        return data, table[data]
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    if kind == "bf16":
        bits = to_bits(x, "bf16")
        return bits, from_bits(bits, "bf16")
    if kind == "f16":
        h = x.astype(np.float16)
        return h, h.astype(np.float64)
    t = (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return t, t.astype(np.float64)


# -- device-side pieces --------------------------------------------------------------------------------------------
@cuda.jit(device=True, inline="always")
def _pair(lo, hi):
    return np.uint32(np.uint32(lo) | (np.uint32(hi) << np.uint32(16)))


@cuda.jit(device=True, inline="always")
def fragment16(a_bits, row0, k0, t):
    """The thread's register A fragment of rows ``row0 ..`` columns ``k0 .. k0 + 15`` (uint16 bits of bf16/f16):
    register j = row 16 w + g + 8 (j % 2), columns 2 q + 8 (j // 2) and + 1 (PTX ISA, WGMMA .m64nNk16 register
    fragment layout for matrix A)."""
    lane = t % 32
    r = row0 + 16 * (t // 32) + lane // 4
    c = k0 + 2 * (lane % 4)
    return (_pair(a_bits[r, c], a_bits[r, c + 1]), _pair(a_bits[r + 8, c], a_bits[r + 8, c + 1]),
            _pair(a_bits[r, c + 8], a_bits[r, c + 9]), _pair(a_bits[r + 8, c + 8], a_bits[r + 8, c + 9]))


@cuda.jit(device=True, inline="always")
def fragment32(a_bits, row0, k0, t):
    """tf32 (the float32 bits): register j = row 16 w + g + 8 (j % 2), column q + 4 (j // 2) (.m64nNk8)."""
    lane = t % 32
    r = row0 + 16 * (t // 32) + lane // 4
    c = k0 + lane % 4
    return (np.uint32(a_bits[r, c]), np.uint32(a_bits[r + 8, c]), np.uint32(a_bits[r, c + 4]),
            np.uint32(a_bits[r + 8, c + 4]))


@functools.lru_cache(maxsize=None)
def rowcol_store(n, acc):
    """A device function ``(acc, out, row0, t)`` writing every register with a constant index ``acc[i]`` to
    ``out[row0 + r, c]`` (``r, c = wgmma_row_col(i, t)``); float16 accumulators write their raw words to
    ``out[row0 + r, c // 2]`` (uint32), with ``r, c = wgmma_row_col(2 i, t)``. (Generated: the index must be a
    constant.)"""
    count = n // 2 if acc == "f32" else n // 4
    lines = ["def store(acc, out, row0, t):"]
    for i in range(count):
        if acc == "f32":
            lines += [f"    r, c = wgmma_row_col({i}, t)", f"    out[row0 + r, c] = acc[{i}]"]
        else:
            lines += [f"    r, c = wgmma_row_col({2 * i}, t)", f"    out[row0 + r, c // 2] = acc[{i}]"]
    scope = {"wgmma_row_col": wgmma_row_col}
    exec(compile("\n".join(lines), f"<rowcol_store n{n} {acc}>", "exec"), scope)  # noqa: S102
    return cuda.jit(device=True, inline="always")(scope["store"])


@functools.lru_cache(maxsize=None)
def gemm_kernel(case):
    """``kernel[1, 128 * groups](a_map, a_bits, b_map, v_map, out, out_map, bias, junk, alpha, row_origin,
    col_origin, bias_col0, p_out)`` for ``case`` (every option a compile-time constant of the closure)."""
    geo = geometry(case)
    n, groups = case.n, case.groups
    ak, bk = case.a, case.bkind
    kstep = KSTEP[ak]
    ksteps = case.k // kstep
    a_np, b_np, v_np = TILE_DTYPE[ak], TILE_DTYPE[bk], TILE_DTYPE[ak]
    c_np = OUT_DTYPES[case.out_dtype]
    a_rows, a_w, a_groups = geo["a"]
    b_rows, b_w, b_groups = geo["b"]
    v_rows, v_w, v_groups = geo["v"]
    c_rows, c_w, c_groups = geo["c"]
    a_shape, b_shape, v_shape = (a_groups, a_rows, a_w), (b_groups, b_rows, b_w), (v_groups, v_rows, v_w)
    a_box, b_box, v_box = a_rows * a_w, b_rows * b_w, v_rows * v_w
    c_tile_elems = c_rows * c_w * c_groups
    tx = (a_groups * a_box * ITEMSIZE[ak] * (case.a_src == "smem") + b_groups * b_box * ITEMSIZE[bk]
          + (v_groups * v_box * ITEMSIZE[ak] if case.chain else 0))
    b_major = case.b_major
    scale0 = case.scale0
    has_chain = bool(case.chain)
    smem_a = case.a_src == "smem"
    if case.chain:
        nv, v_major, _ = case.chain
    f32acc = case.acc == "f32"
    out_n = case.chain[0] if case.chain else n
    c_shape = (c_groups, c_rows, c_w) if c_groups > 1 else (c_rows, c_w)
    chunk = c_w * c_groups

    @cuda.jit(device=True, inline="always")
    def load_all(abuf, bbuf, vbuf, a_map, b_map, v_map, bar):
        if smem_a:
            for g in range(a_groups):
                tma_load(shared_view(abuf, g * a_box, (a_rows, a_w)), a_map, (0, g * a_w), bar)
        for g in range(b_groups):
            tma_load(shared_view(bbuf, g * b_box, (b_rows, b_w)), b_map, (0, g * b_w), bar)
        if has_chain:
            for g in range(v_groups):
                tma_load(shared_view(vbuf, g * v_box, (v_rows, v_w)), v_map, (0, g * v_w), bar)

    if f32acc and scale0:
        @cuda.jit(device=True, inline="always")
        def start(junk):
            return wgmma_add_bias(wgmma_zeros(n), junk, 0)  # NaN everywhere: scale_d = 0 must drop it
    elif f32acc:
        @cuda.jit(device=True, inline="always")
        def start(junk):
            return wgmma_zeros(n)
    else:
        @cuda.jit(device=True, inline="always")
        def start(junk):
            return wgmma_zeros_f16(n)

    if smem_a:
        @cuda.jit(device=True, inline="always")
        def step(acc, abuf, a_map, a_bits, b_operand, wg, t, kk, scale):
            acc = wgmma_fence(acc)
            a = wgmma_desc(shared_view(abuf, 0, a_shape), a_map, "K", 64 * wg, kk * kstep)
            return wgmma(acc, a, b_operand, scale)
    else:
        fragment = fragment32 if ak == "tf32" else fragment16

        @cuda.jit(device=True, inline="always")
        def step(acc, abuf, a_map, a_bits, b_operand, wg, t, kk, scale):
            a = fragment(a_bits, 64 * wg, kk * kstep, t)
            acc, a = wgmma_fence((acc, a))  # orders the fragment's writes before the wgmma that reads them
            return wgmma(acc, a, b_operand, scale)

    @cuda.jit(device=True, inline="always")
    def mainloop(acc, abuf, bbuf, a_map, b_map, a_bits, wg, t):
        for kk in range(ksteps):
            scale = 1
            if scale0 and kk == 0:
                scale = 0
            b_operand = wgmma_desc(shared_view(bbuf, 0, b_shape), b_map, b_major, 0, kk * kstep)
            acc = step(acc, abuf, a_map, a_bits, b_operand, wg, t, kk, scale)
        wgmma_commit_group()
        return wgmma_wait_group(0, acc)

    if case.alpha:
        @cuda.jit(device=True, inline="always")
        def scaled(acc, alpha):
            return wgmma_scale(acc, alpha)
    else:
        @cuda.jit(device=True, inline="always")
        def scaled(acc, alpha):
            return acc

    if case.bias == "global":
        @cuda.jit(device=True, inline="always")
        def biased(acc, bias, col0, sbias):
            return wgmma_add_bias(acc, bias, col0)
    elif case.bias == "shared":
        @cuda.jit(device=True, inline="always")
        def biased(acc, bias, col0, sbias):
            return wgmma_add_bias(acc, sbias, col0)
    else:
        @cuda.jit(device=True, inline="always")
        def biased(acc, bias, col0, sbias):
            return acc

    if case.chain:
        pk = ak

        @cuda.jit(device=True, inline="always")
        def chained(acc, vbuf, v_map, p_out, wg):
            wgmma_store_global(acc, p_out, 64 * wg, 0)  # P as the kernel has it (the reference's input)
            frags = wgmma_a_fragments(acc, pk)
            o = wgmma_zeros(nv)
            o, frags = wgmma_fence((o, frags))
            for kk in range(n // 16):
                o = wgmma(o, frags[kk], wgmma_desc(shared_view(vbuf, 0, v_shape), v_map, v_major, 0, 16 * kk), 1)
            wgmma_commit_group()
            return wgmma_wait_group(0, o)
    else:
        @cuda.jit(device=True, inline="always")
        def chained(acc, vbuf, v_map, p_out, wg):
            return acc

    if case.out == "rowcol":
        store_rc = rowcol_store(out_n, case.acc)

        @cuda.jit(device=True, inline="always")
        def output(acc, out, out_map, cbuf, row_origin, col_origin, wg, t):
            store_rc(acc, out, 64 * wg, t)
    elif case.out == "global":
        @cuda.jit(device=True, inline="always")
        def output(acc, out, out_map, cbuf, row_origin, col_origin, wg, t):
            wgmma_store_global(acc, out, row_origin + 64 * wg, col_origin)
    else:
        @cuda.jit(device=True, inline="always")
        def output(acc, out, out_map, cbuf, row_origin, col_origin, wg, t):
            tile = shared_view(cbuf, wg * c_tile_elems, c_shape)
            for j in range(out_n // chunk):
                wgmma_store(acc, tile, out_map, 0, j * chunk)
                fence_proxy_async_shared_cta()
                cuda.syncthreads()
                if t == 0:
                    for g in range(c_groups):
                        tma_store(out_map, (64 * wg, j * chunk + g * c_w),
                                  shared_view(cbuf, wg * c_tile_elems + g * c_rows * c_w, (c_rows, c_w)))
                    bulk_commit_group()
                    bulk_wait_group_read(0)
                cuda.syncthreads()
            if t == 0:
                bulk_wait_group(0)

    a_elems, b_elems = max(1, math.prod(a_shape)), math.prod(b_shape)
    v_elems = max(1, math.prod(v_shape))
    c_elems = max(1, c_tile_elems * groups)
    bias_len = 1 if case.bias != "shared" else BIAS_LEN

    @cuda.jit
    def kernel(a_map, a_bits, b_map, v_map, out, out_map, bias, junk, alpha, row_origin, col_origin, bias_col0,
               p_out):
        abuf = cuda.shared.array(a_elems, a_np, alignment=1024)
        bbuf = cuda.shared.array(b_elems, b_np, alignment=1024)
        vbuf = cuda.shared.array(v_elems, v_np, alignment=1024)
        cbuf = cuda.shared.array(c_elems, c_np, alignment=1024)
        sbias = cuda.shared.array(bias_len, np.float32)
        bar = cuda.shared.array(1, np.uint64)
        tid = cuda.threadIdx.x
        cuda.syncthreads()  # (every simulated thread exists before the first collective)
        if tid == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, tx)
            load_all(abuf, bbuf, vbuf, a_map, b_map, v_map, bar)
        for i in range(tid, bias_len, cuda.blockDim.x):
            if i < bias.shape[0]:
                sbias[i] = bias[i]
        cuda.syncthreads()
        mbarrier_wait_parity(bar, 0)
        wg = tid // 128
        t = tid % 128
        acc = mainloop(start(junk), abuf, bbuf, a_map, b_map, a_bits, wg, t)
        acc = biased(scaled(acc, alpha), bias, bias_col0, sbias)
        acc = chained(acc, vbuf, v_map, p_out, wg)
        output(acc, out, out_map, cbuf, row_origin, col_origin, wg, t)

    return kernel


BIAS_LEN = 40  # shorter than most N: columns past it add nothing


# -- host side -----------------------------------------------------------------------------------------------------
def _host(d):
    return d.copy_to_host() if hasattr(d, "copy_to_host") else np.asarray(d)


def _bf16_view(dev):
    """A bfloat16 view of a uint16 device array (what a BFLOAT16 TensorMap is built on)."""
    import ml_dtypes

    lay = array_layout(dev)
    return layout_view(ArrayLayout(lay.ptr, lay.shape, lay.strides, np.dtype(ml_dtypes.bfloat16)), dev)


def tensormap(dev, kind, box, swizzle, tf32=False):
    if kind == "bf16":
        return numbatma.TensorMap(_bf16_view(dev), box, swizzle=swizzle)
    if kind in ("e4m3", "e5m2"):
        return numbatma.TensorMap(dev, box, swizzle=swizzle, element=kind)
    return numbatma.TensorMap(dev, box, swizzle=swizzle, tf32=tf32)


def _operand_maps(case, a_dev, b_dev, v_dev):
    geo = geometry(case)
    a_rows, a_w, _ = geo["a"]
    b_rows, b_w, _ = geo["b"]
    b_map = tensormap(b_dev, case.bkind, (b_rows, b_w), case.b_swizzle, case.tf32_map)
    a_map = tensormap(a_dev, case.a, (a_rows, a_w), case.a_swizzle, case.tf32_map) if case.a_src == "smem" \
        else b_map
    v_map = b_map
    if case.chain:
        v_rows, v_w, _ = geo["v"]
        v_map = tensormap(v_dev, case.a, (v_rows, v_w), case.chain[2])
    return a_map, b_map, v_map


def bound(case, mag, ref, ksteps):
    """How far the kernel may be from the float64 reference: ``ksteps + 2`` units of the accumulator's
    precision on the sum of magnitudes (float32 accumulators: 2^-22; float16 accumulators: 2^-11), plus the
    output conversion's rounding. (float8 data are exact in the tensor cores' accumulation: random_operand.)"""
    eps = 2.0 ** -11 if case.acc == "f16" else 2.0 ** -22
    out_eps = {"float32": 0.0, "float16": 2.0 ** -11, "bf16": 2.0 ** -8}[case.out_dtype] \
        if case.out != "rowcol" else 0.0
    return (ksteps + 2) * eps * mag + out_eps * np.abs(ref) + 1e-30


def assert_close(got, ref, limit, what):
    got = np.asarray(got, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert not np.isnan(got).any(), f"{what}: {int(np.isnan(got).sum())} of {got.size} outputs NaN (never written, " \
                                    f"or NaN carried through)"
    bad = np.abs(got - ref) > limit
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} outside tolerance; first at {first}: got "
                             f"{got[first]}, want {ref[first]} (limit {limit[first]:.3g})")


def run_case(rng, case, row_origin=None, col_origin=None, around=False):
    """Run ``case`` on fresh random data and check every output against NumPy."""
    geo = geometry(case)
    m, n, k = 64 * case.groups, case.n, case.k
    a_data, a64 = random_operand(rng, (m, k), case.a)
    if case.b_major == "K":
        b_data, b64t = random_operand(rng, (n, k), case.bkind)
        b64 = b64t.T
    else:
        b_data, b64 = random_operand(rng, (k, n), case.bkind)
    a_dev, b_dev = cuda.to_device(a_data), cuda.to_device(b_data)
    a_bits = cuda.to_device(a_data.view(np.uint32) if case.a == "tf32" else a_data.view(np.uint16)
                            if ITEMSIZE[case.a] == 2 else a_data)
    v_dev = v64 = None
    if case.chain:
        nv, v_major, _ = case.chain
        v_data, v64 = random_operand(rng, (n, nv) if v_major == "MN" else (nv, n), case.a)
        if v_major == "K":
            v64 = v64.T
        v_dev = cuda.to_device(v_data)
    a_map, b_map, v_map = _operand_maps(case, a_dev, b_dev, v_dev)
    alpha = np.float32(rng.uniform(0.5, 2.0)) if case.alpha else np.float32(1.0)
    bias = rng.standard_normal(BIAS_LEN).astype(np.float32)
    bias_col0 = int(rng.integers(-8, 8)) if case.bias else 0
    junk = np.full(256, np.nan, np.float32)

    # the reference (float64)
    ref = a64 @ b64
    mag = np.abs(a64) @ np.abs(b64)
    ref, mag = ref * float(alpha), mag * float(alpha)
    if case.bias:
        cols = bias_col0 + np.arange(n)
        inside = (cols >= 0) & (cols < BIAS_LEN)
        add = np.zeros(n)
        add[inside] = bias[cols[inside]]
        ref, mag = ref + add, mag + np.abs(add)
    ksteps = k // KSTEP[case.a]
    p_out = cuda.to_device(np.full((m, n), np.nan, np.float32))
    out_n = case.chain[0] if case.chain else n

    # the output
    out_np = OUT_DTYPES[case.out_dtype]
    parent = index = None
    if case.out == "rowcol":
        host = np.full((m, out_n), np.nan, np.float32) if case.acc == "f32" else \
            np.full((m, out_n // 2), 0xFFFFFFFF, np.uint32)
        out = cuda.to_device(host)
        out_map = b_map
        row_origin = col_origin = 0
    elif case.out == "global":
        rows_v, cols_v = m - 3, out_n - 5 if out_n > 8 else out_n + 3  # (a view smaller, or larger, than the tile)
        if around:  # (a view around the tile, rows of an even number of elements: wgmma_store_global's pairs)
            rows_v, cols_v = m + 5, out_n + 6
        row_origin = -2 if row_origin is None else row_origin
        col_origin = (3 if out_n <= 8 else -1) if col_origin is None else col_origin
        parent = np.full((rows_v + 4, cols_v + 6), SENTINEL[case.out_dtype], out_np)
        index = (slice(1, 1 + rows_v), slice(2, 2 + cols_v))
        d_parent = cuda.to_device(parent)
        out = d_parent[index]
        out_map = b_map
    else:
        out = cuda.to_device(np.full((m, out_n), np.nan if out_np != np.uint16 else 0x7FFF, out_np))
        c_rows, c_w, _ = geo["c"]
        out_map = numbatma.TensorMap(_bf16_view(out) if case.out_dtype == "bf16" else out, (c_rows, c_w),
                                     swizzle=case.c_swizzle)
        row_origin = col_origin = 0
    kernel = gemm_kernel(case)
    kernel[1, 128 * case.groups](a_map, a_bits, b_map, v_map, out, out_map, cuda.to_device(bias),
                                 cuda.to_device(junk), alpha, row_origin, col_origin, bias_col0, p_out)
    if case.chain:
        p = _host(p_out).astype(np.float64)
        assert_close(p, ref, bound(case._replace(out="rowcol"), mag, ref, ksteps), f"{case.name}: P")
        p_round = from_bits(to_bits(p, case.a), case.a)
        ref = p_round @ v64
        mag = np.abs(p_round) @ np.abs(v64)
        ksteps = n // 16
    got_dev = d_parent if case.out == "global" else out
    got = _host(got_dev)
    what = case.name
    if case.out == "rowcol" and case.acc == "f16":
        words = got.astype(np.uint32)
        got = np.empty((m, out_n))
        got[:, 0::2] = (words & 0xFFFF).astype(np.uint16).view(np.float16)
        got[:, 1::2] = (words >> 16).astype(np.uint16).view(np.float16)
    elif case.out_dtype == "bf16" and case.out != "rowcol":
        got = from_bits(got, "bf16")
    limit = bound(case, mag, ref, ksteps)
    if case.out != "global":
        assert_close(got, ref, limit, what)
        return
    # the view: tile element (r, c) lands at (r + row_origin, c + col_origin) when inside; the rest untouched
    expect = np.full(parent.shape, np.nan)
    tol = np.zeros(parent.shape)
    view_e, view_t = expect[index], tol[index]
    rows = np.arange(m) + row_origin
    cols = np.arange(out_n) + col_origin
    rin = (rows >= 0) & (rows < view_e.shape[0])
    cin = (cols >= 0) & (cols < view_e.shape[1])
    view_e[np.ix_(rows[rin], cols[cin])] = ref[np.ix_(rin, cin)]
    view_t[np.ix_(rows[rin], cols[cin])] = limit[np.ix_(rin, cin)]
    written = ~np.isnan(expect)
    got64 = np.asarray(got, np.float64) if case.out_dtype != "bf16" else got
    sentinel = float(from_bits(SENTINEL["bf16"], "bf16")) if case.out_dtype == "bf16" else SENTINEL[case.out_dtype]
    untouched = got64[~written]
    assert (untouched == sentinel).all(), f"{what}: {int((untouched != sentinel).sum())} element(s) outside the " \
                                          f"tile's in-bounds part were written"
    assert_close(got64[written], expect[written], tol[written], what)


def compile_args(case):
    """Argument types of ``gemm_kernel(case)`` for offline compilation (TensorMaps of fake device arrays)."""
    from numba.cuda import types
    from numba.cuda.np.numpy_support import from_dtype

    from fakes import FakeCudaArray

    geo = geometry(case)
    m, n, k = 64 * case.groups, case.n, case.k
    ptr = iter(range(1 << 20, 1 << 40, 1 << 28))

    def fake(shape, kind):
        import ml_dtypes

        dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "tf32": np.float32, "e4m3": np.uint8,
                 "e5m2": np.uint8}[kind]
        return FakeCudaArray(shape, dtype, ptr=next(ptr))

    def tmap(shape, kind, box, swizzle, tf32=False):
        extra = {"element": kind} if kind in ("e4m3", "e5m2") else {"tf32": tf32}
        return numbatma.TensorMap(fake(shape, kind), box, swizzle=swizzle, **extra)

    b_rows, b_w, _ = geo["b"]
    b_map = tmap((n, k) if case.b_major == "K" else (k, n), case.bkind, (b_rows, b_w), case.b_swizzle, case.tf32_map)
    a_map = b_map
    if case.a_src == "smem":
        a_rows, a_w, _ = geo["a"]
        a_map = tmap((m, k), case.a, (a_rows, a_w), case.a_swizzle, case.tf32_map)
    v_map = b_map
    if case.chain:
        nv, v_major, v_swizzle = case.chain
        v_rows, v_w, _ = geo["v"]
        v_map = tmap((n, nv) if v_major == "MN" else (nv, n), case.a, (v_rows, v_w), v_swizzle)
    bits = {1: types.uint8, 2: types.uint16, 4: types.uint32}[ITEMSIZE[case.a]]
    out_n = case.chain[0] if case.chain else n
    out_np = OUT_DTYPES[case.out_dtype]
    out_map = b_map
    if case.out == "rowcol":
        out = types.float32[:, ::1] if case.acc == "f32" else types.uint32[:, ::1]
    elif case.out == "global":
        out = types.Array(from_dtype(np.dtype(out_np)), 2, "A")
    else:
        out = types.Array(from_dtype(np.dtype(out_np)), 2, "C")
        c_rows, c_w, _ = geo["c"]
        out_kind = {"float32": "tf32", "float16": "f16", "bf16": "bf16"}[case.out_dtype]
        out_map = tmap((m, out_n), out_kind, (c_rows, c_w), case.c_swizzle)
    f1 = types.float32[::1]
    return (a_map, bits[:, ::1], b_map, v_map, out, out_map, f1, f1, types.float32, types.int64, types.int64,
            types.int64, types.float32[:, ::1])


def make(k_steps=None, **options):
    """A Case whose K is the smallest multiple of every box width and k-step (times ``k_steps`` k-steps when
    given, at least)."""
    case = Case(**options)
    if "k" not in options:
        unit = math.lcm(KSTEP[case.a], width(case.a, case.a_swizzle) if case.a_src == "smem" else 1,
                        width(case.bkind, case.b_swizzle) if case.b_major == "K" else 1)
        k = unit
        while k_steps and k < k_steps * KSTEP[case.a]:
            k += unit
        case = case._replace(k=k)
    geometry(case)  # (raises for a case the hardware cannot run)
    return case


def _cases_gpu():
    out = []
    # every N of the brief (and an odd multiple of 8), bf16, B K-major 128B swizzle
    for n in (8, 16, 24, 64, 120, 128, 256):
        out.append(make(n=n, k_steps=4))
    # every kind (and the mixed float8 pairs), both B forms where legal, a FLOAT32 and a TFLOAT32 map
    for a, b in (("f16", None), ("tf32", None), ("e4m3", None), ("e5m2", None), ("e4m3", "e5m2"), ("e5m2", "e4m3")):
        out.append(make(n=128, a=a, b=b, k_steps=4))
    out.append(make(n=64, a="tf32", tf32_map=True, k_steps=4))
    # float16 accumulators (f16 and float8 operands), out through the raw words and wgmma_store_global
    out += [make(n=64, a="f16", acc="f16", out="rowcol", k_steps=4),
            make(n=96, a="e4m3", acc="f16", out="global", out_dtype="float16", a_swizzle=64, b_swizzle=64),
            make(n=256, a="f16", acc="f16", out="global", out_dtype="float32", a_swizzle=32, b_swizzle=32)]
    # every swizzle of A and of B (K-major), per element size
    for kind in ("bf16", "tf32", "e4m3"):
        for sw in (0, 32, 64, 128):
            out.append(make(n=64, a=kind, a_swizzle=sw, b_swizzle={0: 32, 32: 64, 64: 128, 128: 0}[sw], k_steps=2))
    # B MN-major (16-bit only), every swizzle, N that the box width does not divide
    for a in ("bf16", "f16"):
        for sw in (0, 32, 64, 128):
            out.append(make(n=120 if sw else 40, a=a, b_major="MN", b_swizzle=sw, a_swizzle=64, k_steps=3))
    out.append(make(n=256, b_major="MN", b_swizzle=128, a_swizzle=128, k=32 + 32))
    # A from registers
    out += [make(n=64, a_src="reg", k_steps=4), make(n=256, a="f16", a_src="reg", b_major="MN", b_swizzle=64,
                                                    k_steps=2),
            make(n=120, a="tf32", a_src="reg", b_swizzle=32, k_steps=4),
            make(n=64, a="f16", acc="f16", a_src="reg", out="rowcol", b_swizzle=0, k_steps=2),
            make(n=128, a_src="reg", groups=2, out="tile", out_dtype="bf16", k_steps=2)]
    # two warpgroups; scale_d = 0 over a NaN accumulator; alpha; bias from global / shared memory
    out += [make(n=128, groups=2, scale0=True, alpha=True, bias="global", k_steps=4),
            make(n=64, groups=2, a="f16", bias="shared", scale0=True, out="rowcol", b_major="MN", b_swizzle=64),
            make(n=256, a="e4m3", scale0=True, alpha=True, bias="global", a_swizzle=64, b_swizzle=32, k_steps=2)]
    # the epilogue through wgmma_store + TMA store: every output type, swizzles, boxes side by side
    for out_dtype, sw, groups in (("bf16", 128, 1), ("float16", 64, 2), ("float32", 128, 1), ("float32", 32, 2),
                                  ("bf16", 0, 1), ("float16", 32, 1), ("bf16", 64, 4)):
        out.append(make(n=128, out="tile", out_dtype=out_dtype, c_swizzle=sw, c_groups=groups, groups=2,
                        alpha=True, a_swizzle=64, b_swizzle=64, k_steps=2))
    out.append(make(n=24, out="tile", out_dtype="bf16", c_swizzle=0, c_groups=3, a="f16", k_steps=2))
    # global stores of every type
    for out_dtype in ("float32", "float16", "bf16"):
        out.append(make(n=120, out="global", out_dtype=out_dtype, groups=2, k_steps=2))
    # P = A @ B, O = bf16/f16(P) @ V with P as register A fragments
    out += [make(n=64, chain=(64, "MN", 128), k_steps=4),
            make(n=128, a="f16", chain=(32, "K", 64), groups=2, k_steps=2),
            make(n=16, chain=(256, "MN", 32), out="tile", out_dtype="bf16", c_swizzle=128, k_steps=2),
            make(n=64, a="f16", chain=(16, "K", 0), out="rowcol", a_swizzle=0, b_swizzle=0, k_steps=2)]
    return out


def _cases_sim():
    """Small shapes (the simulator runs each thread in Python), one of each feature."""
    return [
        make(n=16, a_swizzle=64, b_swizzle=64, out="rowcol", k_steps=2),
        make(n=8, a_swizzle=0, b_swizzle=0, out="global", k_steps=2),
        make(n=24, a="f16", acc="f16", out="global", out_dtype="float16", a_swizzle=0, b_major="MN", b_swizzle=0,
             k_steps=2),
        make(n=32, a="f16", acc="f16", out="rowcol", a_swizzle=32, b_major="MN", b_swizzle=64),
        make(n=64, a="tf32", a_swizzle=128, b_swizzle=32, out="tile", out_dtype="float32", c_swizzle=128),
        make(n=16, a="tf32", a_src="reg", b_swizzle=0, out="global", tf32_map=True, k_steps=2),
        make(n=32, a="e4m3", b="e5m2", a_swizzle=64, b_swizzle=128, out="global", out_dtype="bf16"),
        make(n=40, a="e5m2", acc="f16", a_swizzle=0, b_swizzle=32, out="rowcol"),
        make(n=16, a="e4m3", a_swizzle=32, b_swizzle=0, out="rowcol"),
        make(n=64, out="tile", out_dtype="bf16", c_swizzle=64, c_groups=2, alpha=True, bias="global", scale0=True),
        make(n=120, a="f16", b_major="MN", b_swizzle=128, a_swizzle=32, out="tile", out_dtype="float16",
             c_swizzle=0, groups=2, bias="shared"),
        make(n=16, a_src="reg", b_major="MN", b_swizzle=32, k_steps=2, groups=2, out="rowcol"),
        make(n=32, a="f16", a_src="reg", acc="f16", b_swizzle=64, out="global", out_dtype="float32"),
        make(n=64, a_swizzle=64, b_swizzle=64, chain=(32, "MN", 64), out="global"),
        make(n=32, a="f16", a_swizzle=64, b_swizzle=64, chain=(16, "K", 32), out="tile", out_dtype="float16",
             c_swizzle=32),
    ]


GPU_CASES = _cases_gpu()
SIM_CASES = _cases_sim()
