"""CPU: the 5-point Laplacian kernel compiles and links offline (sm_90a, sm_100a) with TMA loads and stores in
its SASS; its consumers' index arithmetic, run in plain Python over emulated TMA tiles, reproduces NumPy;
bad inputs raise TensorMapError with a clear message."""
import re
import types as pytypes

import numpy as np
import pytest

from numbatma import TensorMapError, compile as nbc
from numbatma.kernels import Laplacian5, laplacian5
from numbatma.kernels import stencil

from fakes import FakeCudaArray

GiB = 1 << 30


def pair(shape, dtype=np.float32, strides=None, dst_strides=None):
    return FakeCudaArray(shape, dtype, strides), FakeCudaArray(shape, dtype, dst_strides, ptr=64 * GiB)


def reference(a):
    p = np.pad(a, 1)
    return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - a.dtype.type(4) * p[1:-1, 1:-1]


# -- compile, link, SASS ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_ptx():
    out = {}
    for dt in (np.float32, np.float64):
        plan = Laplacian5(*pair((1000, 1004), dt))
        out[np.dtype(dt).name] = (plan, nbc.compile_ptx(plan.kernel.py_func, plan.args))
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ptx_has_tma_pipeline_and_named_barrier(default_ptx, dtype):
    plan, ptx = default_ptx[dtype]
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in ptx
    assert "cp.async.bulk.wait_group.read 0" in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    assert "bar.sync" in ptx
    assert "elect.sync" in ptx
    assert ".extern .shared .align 1024" in ptx
    assert "numba_attempt_nocopy_reshape" not in ptx


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_links_and_sass_has_tma_load_and_store(default_ptx, dtype, arch):
    plan, ptx = default_ptx[dtype]
    if arch != "sm_90a":
        ptx = nbc.compile_ptx(plan.kernel.py_func, plan.args, arch=arch)
    sass = nbc.sass(nbc.link_cubin(ptx, arch))
    assert "UTMALDG.2D" in sass
    assert "UTMASTG.2D" in sass
    # the consumers' named barrier: id 1, the consumer warps only
    assert re.search(rf"BAR\.SYNC\S* 0x{stencil._NAMED_BARRIER:x}, 0x{32 * plan.consumer_warps:x}\b", sass)
    # the sliding window lives in registers: no local memory
    assert "LDL" not in sass and "STL" not in sass


@pytest.mark.parametrize(
    "tile, stages, warps",
    [((8, 32), 2, 1), ((64, 120), 3, 8), ((7, 248), 1, 2), ((1, 4), 6, 4)],
)
def test_tunable_variants_compile(tile, stages, warps):
    plan = Laplacian5(*pair((300, 520)), tile=tile, stages=stages, consumer_warps=warps)
    sass = nbc.sass(nbc.link_cubin(nbc.compile_ptx(plan.kernel.py_func, plan.args)))
    assert "UTMALDG.2D" in sass and "UTMASTG.2D" in sass


# -- the algorithm, emulated on the CPU ---------------------------------------------------------------------
class _FakeLocal:
    def __init__(self, dtype):
        self.dtype = dtype

    def array(self, n, _dtype):
        return np.empty(n, self.dtype)


def python_compute(plan):
    """The kernel's consumer function (the same Python source it compiles), runnable on NumPy arrays."""
    fn = stencil._tile_compute(plan.dtype.name, *plan.tile, plan.consumer_warps)
    fake_cuda = pytypes.SimpleNamespace(local=_FakeLocal(plan.dtype))
    glb = dict(fn.__globals__, cuda=fake_cuda)
    return pytypes.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)


def emulate(plan, a, ctas=3):
    """Run the kernel's schedule: ``ctas`` persistent CTAs, each with its ring of stages and output buffers in
    one flat shared buffer (NaN-poisoned); TMA loads emulated with zero fill, stores with clipping."""
    br, bc = plan.tile
    halo = 16 // plan.dtype.itemsize
    in_stride, _, out_base, out_stride, _, nbytes = stencil.smem_layout(plan.dtype, plan.tile, plan.stages)
    assert plan.src_map.box == (br + 2, bc + 2 * halo) and plan.dst_map.box == (br, bc)
    compute = python_compute(plan)
    rows, cols = a.shape
    padded = np.zeros((rows + br + 2, cols + bc + 2 * halo), a.dtype)
    padded[1 : rows + 1, halo : cols + halo] = a
    out = np.full(a.shape, np.nan, a.dtype)
    for cta in range(ctas):
        dyn = np.full(nbytes // a.dtype.itemsize, np.nan, a.dtype)
        for k, t in enumerate(range(cta, plan.ntiles, ctas)):
            r0, c0 = (t // plan.tile_cols) * br, (t % plan.tile_cols) * bc
            s, b = k % plan.stages, k % 2
            # TMA load of the box at (r0 - 1, c0 - halo): padded is shifted by (1, halo)
            box = padded[r0 : r0 + br + 2, c0 : c0 + bc + 2 * halo]
            dyn[s * in_stride : s * in_stride + box.size] = box.ravel()
            before = dyn.copy()
            obase = out_base + b * out_stride
            for tid in range(32 * plan.consumer_warps):
                compute(dyn, s * in_stride, obase, tid)
            changed = np.flatnonzero(~((dyn == before) | (np.isnan(dyn) & np.isnan(before))))
            assert changed.size == 0 or (changed.min() >= obase and changed.max() < obase + br * bc)
            tile = dyn[obase : obase + br * bc].reshape(br, bc)
            h, w = min(br, rows - r0), min(bc, cols - c0)
            out[r0 : r0 + h, c0 : c0 + w] = tile[:h, :w]
            assert not np.isnan(tile).any(), "an output element of the tile was not written"
    return out


@pytest.mark.parametrize(
    "shape, dtype, options",
    [
        ((1, 4), np.float32, {}),
        ((37, 68), np.float32, {}),
        ((37, 68), np.float64, {}),
        ((37, 68), np.float32, dict(tile=(7, 16), consumer_warps=1, stages=2)),  # uneven row bands
        ((45, 200), np.float32, dict(tile=(20, 96), consumer_warps=1, stages=3)),  # 3 columns a thread, tail rows
        ((19, 130), np.float64, dict(tile=(5, 250), consumer_warps=2, stages=1)),
        ((64, 40), np.float32, dict(tile=(16, 8), consumer_warps=2)),  # more threads than the tile has columns
    ],
)
def test_emulated_kernel_matches_numpy(shape, dtype, options):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape).astype(dtype)
    plan = Laplacian5(*pair(shape, dtype), **options)
    got = emulate(plan, a)
    np.testing.assert_array_equal(got, reference(a))


def test_reference_matches_the_definition():
    a = np.arange(12, dtype=np.float64).reshape(3, 4) ** 2
    want = np.zeros_like(a)
    for i in range(3):
        for j in range(4):
            get = lambda r, c: a[r, c] if 0 <= r < 3 and 0 <= c < 4 else 0.0  # noqa: E731
            want[i, j] = get(i - 1, j) + get(i + 1, j) + get(i, j - 1) + get(i, j + 1) - 4 * get(i, j)
    np.testing.assert_array_equal(reference(a), want)


# -- plan facts ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_default_plan_fits_two_ctas_per_sm(dtype):
    plan = Laplacian5(*pair((4096, 4096), dtype))
    assert plan.block == 32 * (plan.consumer_warps + 1)
    assert 2 * (plan.smem_bytes + stencil._STATIC_SMEM + 1024) <= 228 * 1024
    assert plan.ntiles == plan.tile_rows * plan.tile_cols
    assert plan.src_map.box[1] * plan.dtype.itemsize % 16 == 0
    assert "Laplacian5(" in repr(plan)


def test_padded_view_with_odd_width_is_accepted():
    # 67 columns in rows of 68: the row stride is what TMA cares about
    plan = Laplacian5(*pair((37, 67), np.float32, strides=(272, 4), dst_strides=(272, 4)))
    assert plan.tile_cols == 1 and plan.src_map.shape == (37, 67)


def test_empty_arrays_are_a_no_op():
    src, dst = pair((0, 8))
    assert laplacian5(src, dst) is dst


# -- validation ---------------------------------------------------------------------------------------------
def err(match):
    return pytest.raises(TensorMapError, match=match)


def test_rank_must_be_2():
    with err("takes 2-D arrays"):
        Laplacian5(*pair((4, 4, 4)))
    with err("takes 2-D arrays"):
        Laplacian5(*pair((16,)))


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.uint8])
def test_dtype_must_be_float32_or_float64(dtype):
    with err("supported dtypes: float32, float64"):
        Laplacian5(*pair((8, 32), dtype))


def test_shapes_and_dtypes_must_match():
    with err("same shape and dtype"):
        Laplacian5(FakeCudaArray((8, 32), np.float32), FakeCudaArray((8, 36), np.float32, ptr=GiB))
    with err("same shape and dtype"):
        Laplacian5(FakeCudaArray((8, 32), np.float32), FakeCudaArray((8, 32), np.float64, ptr=GiB))


@pytest.mark.parametrize("shape, dtype, hint", [((37, 67), np.float32, "multiple of 4"), ((5, 3), np.float64,
                                                                                      "multiple of 2")])
def test_row_stride_must_be_a_multiple_of_16_bytes(shape, dtype, hint):
    with pytest.raises(TensorMapError, match="row stride") as e:
        Laplacian5(*pair(shape, dtype))
    assert hint in str(e.value) and f"padded[:, :{shape[1]}]" in str(e.value)


def test_columns_must_be_contiguous():
    with err("must be contiguous"):
        Laplacian5(*pair((8, 32), strides=(256, 8)))


def test_address_must_be_16_byte_aligned():
    with err("not a multiple of 16 bytes"):
        Laplacian5(FakeCudaArray((8, 32), np.float32, ptr=(1 << 20) + 4), FakeCudaArray((8, 32), np.float32, ptr=GiB))


def test_in_place_or_overlapping_is_rejected():
    a = FakeCudaArray((8, 32), np.float32)
    with err("overlap"):
        Laplacian5(a, a)
    with err("overlap"):
        Laplacian5(a, FakeCudaArray((8, 32), np.float32, ptr=(1 << 20) + 512))


@pytest.mark.parametrize(
    "tile, match",
    [
        ((32, 130), "multiple of 4"),
        ((32, 252), "4..248"),
        ((255, 128), "1..254 rows"),
        ((0, 128), "1..254 rows"),
        ((32,), "pair of integers"),
        ((32.0, 128), "pair of integers"),
        ("big", "pair of integers"),
    ],
)
def test_bad_tiles(tile, match):
    with err(match):
        Laplacian5(*pair((64, 256)), tile=tile)


def test_float64_tile_columns_limits():
    with err("multiple of 2"):
        Laplacian5(*pair((8, 32), np.float64), tile=(8, 33))
    Laplacian5(*pair((8, 32), np.float64), tile=(8, 252))


@pytest.mark.parametrize("name, value", [("stages", 0), ("stages", 33), ("consumer_warps", 0),
                                         ("consumer_warps", 32), ("ctas_per_sm", 0), ("stages", 2.0)])
def test_bad_counts(name, value):
    with err(name):
        Laplacian5(*pair((64, 256)), **{name: value})


def test_shared_memory_limit():
    with err("shared memory"):
        Laplacian5(*pair((512, 512)), tile=(128, 248), stages=4)


def test_host_arrays_are_rejected():
    with err("host memory"):
        Laplacian5(np.zeros((8, 32), np.float32), np.zeros((8, 32), np.float32))
