"""CPU tests of the TMA transpose (kernels/transpose.py), no GPU needed.

* The kernel, planned for fake CUDA arrays, compiles to PTX and links for sm_90a / sm_100a; the SASS has the
  TMA load and store (UTMALDG / UTMASTG).
* The consumers' shared-memory index arithmetic (the very functions the kernel inlines), run in Python on a
  byte-level model of TMA's 128-byte swizzle, transposes every tile exactly and hits no bank twice.
* Host validation: wrong dst shape, dtype mismatch, rank, element size, row alignment and options are
  TensorMapErrors naming the user's values.
"""
import numpy as np
import pytest

from numbatma import Swizzle, TensorMapError, compile as nbc
from numbatma.kernels import Transpose, transpose
from numbatma.kernels.transpose import DEFAULT_TILES, UNIT_SHAPES, UNITS, Geometry

from fakes import FakeCudaArray


def plan(shape, dtype, dst_shape=None, dst_dtype=None, **options):
    src = FakeCudaArray(shape, dtype)
    dst = FakeCudaArray(dst_shape if dst_shape is not None else shape[::-1], dst_dtype or dtype, ptr=1 << 32)
    return Transpose(src, dst, **options)


# -- compiles, links, TMA in the SASS --------------------------------------------------------------------
@pytest.fixture(scope="module", params=[("float32", "sm_90a"), ("float32", "sm_100a"), ("float16", "sm_90a")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def compiled(request):
    dtype, arch = request.param
    p = plan((1000, 1008), dtype)
    ptx = nbc.compile_ptx(p.kernel.py_func, p.args, arch)
    return p, ptx, nbc.link_cubin(ptx, arch)


def test_kernel_compiles_and_links(compiled):
    p, ptx, cubin = compiled
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    assert "cp.async.bulk.wait_group.read" in ptx
    assert ".local" not in ptx  # the unit moves stay in registers
    assert len(cubin) > 0


def test_sass_has_tma_load_and_store(compiled):
    _, _, cubin = compiled
    sass = nbc.sass(cubin)
    assert "UTMALDG.2D" in sass
    assert "UTMASTG.2D" in sass
    assert "LDL" not in sass and "STL" not in sass  # no local-memory spills


def test_other_configurations_compile():
    p = plan((300, 202), "float64", tile=(96, 48), order="dst", out_stages=3, consumer_warps=2, stages=2)
    ptx = nbc.compile_ptx(p.kernel.py_func, p.args, "sm_90a")
    assert "cp.async.bulk.wait_group.read 1;" in ptx and "bar.sync" in ptx
    nbc.link_cubin(ptx, "sm_90a")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int16", "float64", "int64", "uint32"])
def test_descriptors_are_128b_swizzled_boxes_of_128_byte_rows(dtype):
    try:
        np.dtype(dtype)
    except TypeError:
        pytest.skip(f"numpy has no {dtype}")
    p = plan((512, 256), dtype)
    item = np.dtype(dtype).itemsize
    tm, tn = DEFAULT_TILES[item]
    w = 128 // item
    assert p.tile == (tm, tn)
    assert p.src_map.box == (tm, w) and p.dst_map.box == (tn, w)
    assert p.src_map.swizzle == Swizzle.B128 and p.dst_map.swizzle == Swizzle.B128
    assert p.threads == 32 * 5
    assert p.smem == (4 + 2) * tm * tn * item
    assert p.ntiles == -(-512 // tm) * -(-256 // tn)
    assert p.nbytes == 2 * 512 * 256 * item


def test_options_reach_the_plan():
    p = plan((300, 200), "float32", tile=(128, 32), stages=3, out_stages=3, consumer_warps=2, order="dst",
             ctas_per_sm=2)
    assert p.tile == (128, 32) and p.src_map.box == (128, 32) and p.dst_map.box == (32, 32)
    assert p.threads == 96 and p.smem == 6 * 128 * 32 * 4
    assert p.tiles_fast == p.tiles_m == 3 and p.tiles_n == 7
    assert p.args[3:] == (300, 300, 200, 3, 21)  # (first tail column: dst rows have no tail; shape; tiles)


def test_empty_array_plans_nothing():
    p = plan((0, 16), "float32")
    assert p.kernel is None and p.ntiles == 0
    p.launch()  # a no-op, needs no GPU


# -- the swizzled index arithmetic, executed in Python ----------------------------------------------------
def tma_swizzle_128b(offset):
    """Physical byte of logical byte ``offset`` of a 1024-byte aligned box loaded with SWIZZLE_128B: the
    16-byte chunk index (bits 4-6) XOR the row index mod 8 (bits 7-9)."""
    return offset ^ (((offset >> 7) & 7) << 4)


class LoggedWords:
    """Shared memory as words, recording every access in order (one entry per executed load/store)."""

    def __init__(self, words):
        self.words = words
        self.log = []

    def __getitem__(self, i):
        self.log.append(("ld", int(i)))
        return self.words[i]

    def __setitem__(self, i, v):
        self.log.append(("st", int(i)))
        self.words[i] = v


def max_bank_ways(addresses, word):
    """Worst number of distinct 32-bit words sharing a bank, per shared-memory wavefront: the whole warp
    for 32-bit accesses, each half-warp for 64-bit ones."""
    groups = [range(32)] if word == 4 else [range(16), range(16, 32)]
    worst = 1
    for g in groups:
        banks = {}
        for lane in g:
            for part in range(word // 4):
                w32 = addresses[lane] * (word // 4) + part
                banks.setdefault(w32 % 32, set()).add(w32)
        worst = max(worst, max(len(v) for v in banks.values()))
    return worst


TILES = [(4, (64, 64)), (4, (32, 96)), (2, (128, 128)), (2, (64, 192)), (8, (64, 32)), (8, (96, 48))]


@pytest.mark.parametrize("itemsize,tile", TILES, ids=[f"{i}B-{t[0]}x{t[1]}" for i, t in TILES])
def test_unit_moves_transpose_swizzled_tiles_without_bank_conflicts(itemsize, tile):
    rng = np.random.default_rng(itemsize * 1000 + tile[0])
    geo = Geometry(itemsize, tile, 1, 4, 2)
    tm, tn, w = geo.tm, geo.tn, geo.W
    dt = {2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
    x = rng.integers(0, np.iinfo(dt).max, size=(tm, tn), dtype=dt, endpoint=True)
    # input buffer as the TMA loads leave it: load box a = columns a*W.., swizzled, at a * tm * 128 bytes
    smem = np.zeros(2 * geo.tile_bytes, np.uint8)
    for a in range(geo.load_boxes):
        row_bytes = np.ascontiguousarray(x[:, a * w:(a + 1) * w]).view(np.uint8).ravel()
        smem[a * tm * 128 + tma_swizzle_128b(np.arange(row_bytes.size))] = row_bytes
    words = smem.view(np.uint64 if itemsize == 8 else np.uint32)
    out0 = geo.tile_words
    for u in range(geo.units):
        ur, uc = divmod(u, geo.units_n)
        src0, dst0 = geo.unit_offsets(ur, uc)
        logs = []
        for lane in range(32):
            logged = LoggedWords(words)
            UNITS[itemsize](logged, src0, out0 + dst0, lane, geo.half_stride)
            logs.append(logged.log)
        assert len({len(log) for log in logs}) == 1
        for step in zip(*logs):  # one warp-wide instruction
            assert len({kind for kind, _ in step}) == 1
            ways = max_bank_ways([addr for _, addr in step], geo.word)
            assert ways == 1, f"{ways}-way bank conflict in unit {(ur, uc)}"
    # output buffer as the TMA stores read it: store box b = source rows b*W.. = dst columns, swizzled
    out = smem[geo.tile_bytes:]
    for b in range(geo.store_boxes):
        box = out[b * tn * 128:(b + 1) * tn * 128]
        logical = box[tma_swizzle_128b(np.arange(box.size))].view(dt).reshape(tn, w)
        np.testing.assert_array_equal(logical, x[b * w:(b + 1) * w, :].T)


def test_unit_shapes_tile_the_default_tiles():
    for item, (um, un) in UNIT_SHAPES.items():
        tm, tn = DEFAULT_TILES[item]
        assert tm % um == 0 and tn % un == 0 and un == 128 // item
        assert (tm // um) * (tn // un) % 4 == 0  # the four default consumer warps share the units evenly


# -- host validation ---------------------------------------------------------------------------------------
def error(**kwargs):
    with pytest.raises(TensorMapError) as info:
        plan(**kwargs)
    return str(info.value)


def test_wrong_dst_shape():
    msg = error(shape=(64, 128), dtype="float32", dst_shape=(64, 128))
    assert "dst is a float32 array with shape (64, 128)" in msg and "(128, 64)" in msg


def test_dtype_mismatch():
    msg = error(shape=(64, 128), dtype="float32", dst_dtype="float64")
    assert "float32" in msg and "float64" in msg and "same dtype" in msg


@pytest.mark.parametrize("shape,dst_shape", [((64,), (64,)), ((4, 8, 16), (16, 8, 4))])
def test_rank(shape, dst_shape):
    msg = error(shape=shape, dtype="float32", dst_shape=dst_shape)
    assert "2-D" in msg and str(shape)[:-1] in msg


def test_one_byte_elements_are_refused():
    msg = error(shape=(64, 64), dtype="uint8")
    assert "uint8" in msg and "2-, 4- and 8-byte" in msg


@pytest.mark.parametrize("shape,bad", [((33, 65), "src"), ((1000, 1004), None), ((1003, 1000), "dst")])
def test_rows_must_start_on_16_byte_boundaries(shape, bad):
    if bad is None:
        plan(shape, "float32")  # legal: 1004 and 1000 are multiples of 4
        return
    msg = error(shape=shape, dtype="float32")
    assert f"rows of {bad}" in msg and "16-byte" in msg and "multiples of 4 float32" in msg


def test_padded_rows_are_fine():
    # a (33, 65) float32 view of a (33, 68) allocation, transposed into a (65, 33) view of (65, 36)
    src = FakeCudaArray((33, 65), "float32", strides=(68 * 4, 4))
    dst = FakeCudaArray((65, 33), "float32", strides=(36 * 4, 4), ptr=1 << 32)
    p = Transpose(src, dst)
    assert p.ntiles == 1 * 2 and p.src_map.strides == (272, 4) and p.dst_map.strides == (144, 4)


@pytest.mark.parametrize(
    "options,words",
    [
        (dict(tile=(48, 64)), ["tile (48, 64)", "multiple of 32"]),
        (dict(tile=(64, 512)), ["at most 256"]),
        (dict(tile=(256, 256), stages=4), ["shared memory", "lower stages"]),
        (dict(stages=0), ["stages must be an integer in 1..16"]),
        (dict(out_stages=1), ["out_stages must be an integer in 2..8"]),
        (dict(consumer_warps=0), ["consumer_warps"]),
        (dict(order="diagonal"), ["order must be 'src' or 'dst', got 'diagonal'"]),
        (dict(ctas_per_sm=0), ["ctas_per_sm"]),
    ],
)
def test_bad_options(options, words):
    msg = error(shape=(128, 128), dtype="float32", **options)
    for w in words:
        assert w in msg


def test_not_a_cuda_array():
    with pytest.raises(TensorMapError, match="expected a CUDA array"):
        transpose([[1.0, 2.0]], [[1.0], [2.0]])
