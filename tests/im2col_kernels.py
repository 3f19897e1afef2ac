"""Kernels shared by the im2col tests (CPU compile checks, simulator, GPU): one block issues one im2col
load and copies the shared tile out."""
import numpy as np
from numba import cuda

from numbatma.intrinsics import (
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load_im2col,
)


def load_kernel(shared_shape, dtype="float32", alignment=128):
    """``kernel[1, threads](desc, coords, offsets, out)``: ``out[...] = `` the shared tile of one
    ``tma_load_im2col(tile, desc, coords, offsets, bar)`` (``out`` has ``shared_shape``)."""
    rows, cols = shared_shape

    def load_one(desc, coords, offsets, out):
        tile = cuda.shared.array(shared_shape, dtype, alignment=alignment)
        bar = cuda.shared.array(1, "uint64")
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            mbarrier_arrive_expect_tx(bar, desc.box_bytes)
            tma_load_im2col(tile, desc, coords, offsets, bar)
        mbarrier_wait_parity(bar, 0)
        for i in range(cuda.threadIdx.x, rows * cols, cuda.blockDim.x):
            out[i // cols, i % cols] = tile[i // cols, i % cols]

    return load_one


# -- the NumPy reference: columns of a convolution's im2col matrix, from explicit padding ---------------------
def conv_geometry(spatial, filt, pad, dilation=None, stride=None):
    """(lower, upper, out_spatial) of a convolution over ``spatial`` (array order) with filter extents ``filt``,
    symmetric padding ``pad``, ``dilation`` and ``stride``: the descriptor corners a TMA im2col load needs
    (``lower = -pad``, ``upper = pad - (filt - 1) * dilation``) and the output's spatial shape."""
    nsp = len(spatial)
    dilation = dilation or (1,) * nsp
    stride = stride or (1,) * nsp
    lower = tuple(-p for p in pad)
    upper = tuple(p - (f - 1) * d for p, f, d in zip(pad, filt, dilation))
    out = tuple((s + 2 * p - d * (f - 1) - 1) // st + 1 for s, p, f, d, st in zip(spatial, pad, filt, dilation, stride))
    return lower, upper, out


def column_start(x_shape, out_spatial, m0, pad, stride, c0=0):
    """Load coordinates ``(n, *spatial, c)`` of output pixel ``m0`` (row-major over ``(N, *out_spatial)``): the
    input position of the filter's first tap."""
    n, *o = np.unravel_index(m0, (x_shape[0],) + tuple(out_spatial))
    return (int(n),) + tuple(int(oi) * st - p for oi, st, p in zip(o, stride, pad)) + (int(c0),)


def expected_column(x, out_spatial, m0, pixels, tap, pad, dilation=None, stride=None, c0=0, channels=None,
                    fill=0):
    """What one im2col load must deliver: for output pixels ``m0 .. m0 + pixels - 1`` the input pixel under filter
    tap ``tap`` (zero padding -> ``fill``; output pixels past the last image -> ``fill``), channels
    ``c0 .. c0 + channels - 1`` (past the last channel -> ``fill``)."""
    nsp = x.ndim - 2
    dilation = dilation or (1,) * nsp
    stride = stride or (1,) * nsp
    channels = channels or x.shape[-1]
    total = x.shape[0] * int(np.prod(out_spatial))
    res = np.full((pixels, channels), fill, dtype=x.dtype)
    for k in range(pixels):
        m = m0 + k
        if m >= total:
            continue
        n, *o = np.unravel_index(m, (x.shape[0],) + tuple(out_spatial))
        pos = [int(o[i]) * stride[i] - pad[i] + tap[i] * dilation[i] for i in range(nsp)]
        if all(0 <= p < s for p, s in zip(pos, x.shape[1:-1])):
            cs = [c for c in range(c0, c0 + channels) if 0 <= c < x.shape[-1]]
            res[k, [c - c0 for c in cs]] = x[(n, *pos)][cs]
    return res


def taps(filt):
    """Every filter tap (array order) of a filter of extents ``filt``."""
    return [tuple(int(i) for i in t) for t in np.ndindex(*filt)]


# -- the cases every im2col test file runs (simulator: a subset of the taps) -------------------------------------
CASES = {
    # name: input shape, dtype, filter, padding, dilation, stride, pixels_per_column, channels_per_pixel, extra
    "nwc": dict(shape=(3, 20, 8), dtype="float32", filt=(3,), pad=(2,), pixels=32, channels=8),
    "nwc-dilated-f16": dict(shape=(2, 17, 16), dtype="float16", filt=(3,), pad=(2,), dilation=(2,), pixels=16,
                            channels=16),
    "nhwc": dict(shape=(2, 5, 6, 16), dtype="float32", filt=(3, 3), pad=(1, 1), pixels=16, channels=16),
    "nhwc-stride2": dict(shape=(2, 7, 9, 8), dtype="float32", filt=(3, 3), pad=(1, 1), stride=(2, 2), pixels=16,
                         channels=8),
    "nhwc-nan": dict(shape=(2, 5, 6, 16), dtype="float32", filt=(3, 3), pad=(1, 1), pixels=16, channels=16,
                     oob_fill="nan"),
    "nhwc-channel-slices": dict(shape=(1, 4, 4, 64), dtype="float32", filt=(2, 2), pad=(0, 0), pixels=8,
                                channels=16, c0s=(0, 32, 56)),
    "nhwc-u8-unpadded": dict(shape=(1, 6, 6, 32), dtype="uint8", filt=(3, 3), pad=(0, 0), pixels=16, channels=16),
    "ndhwc-f16": dict(shape=(2, 3, 4, 5, 16), dtype="float16", filt=(3, 3, 3), pad=(1, 1, 1), pixels=32,
                      channels=16),
}


def case_params(case):
    """Everything a test needs of a case: geometry, descriptor keyword arguments, the loads to issue."""
    shape = case["shape"]
    nsp = len(shape) - 2
    dilation = case.get("dilation", (1,) * nsp)
    stride = case.get("stride", (1,) * nsp)
    lower, upper, out = conv_geometry(shape[1:-1], case["filt"], case["pad"], dilation, stride)
    kwargs = dict(channels_per_pixel=case["channels"], pixels_per_column=case["pixels"],
                  pixel_box_lower_corner=lower, pixel_box_upper_corner=upper,
                  element_strides=(1,) + tuple(stride) + (1,), oob_fill=case.get("oob_fill", "zero"))
    total = shape[0] * int(np.prod(out))
    columns = list(range(0, total, case["pixels"]))
    if total > case["pixels"] + 3:
        columns.append(3)  # a column that starts inside a row
    fill = np.nan if case.get("oob_fill") == "nan" else 0
    return dict(nsp=nsp, dilation=dilation, stride=stride, out=out, kwargs=kwargs, columns=columns, fill=fill,
                c0s=case.get("c0s", (0,)))


def random_input(case, rng):
    dtype = np.dtype(case["dtype"])
    if dtype.kind in "iu":
        return rng.integers(1, 200, size=case["shape"]).astype(dtype)  # no zeros: a zero fill shows
    return (rng.standard_normal(case["shape"]) + 3.0).astype(dtype)  # no zeros either


def poison(dtype):
    return np.dtype(dtype).type(77) if np.dtype(dtype).kind in "iu" else np.dtype(dtype).type(-1234.5)


def check_case(case, rng, make_array, launch, read, tap_limit=None):
    """Issue every load of ``case`` (each column x tap x first channel) through ``launch(desc, coords, offsets,
    out)`` and compare with :func:`expected_column`. ``make_array`` turns the host input into what the
    descriptor should describe (a device array on the GPU); ``read`` turns the output back into NumPy."""
    from numbatma.im2col import Im2colTensorMap

    p = case_params(case)
    x = random_input(case, rng)
    desc = Im2colTensorMap(make_array(x), **p["kwargs"])
    assert desc.shared_shape == (case["pixels"], case["channels"])
    all_taps = taps(case["filt"])
    if tap_limit is not None and len(all_taps) > tap_limit:
        pick = sorted({0, len(all_taps) - 1} | set(range(0, len(all_taps), max(1, len(all_taps) // tap_limit))))
        all_taps = [all_taps[i] for i in pick]
    checked = 0
    for c0 in p["c0s"]:
        for m0 in p["columns"]:
            coords = column_start(x.shape, p["out"], m0, case["pad"], p["stride"], c0)
            for tap in all_taps:
                offsets = tuple(t * d for t, d in zip(tap, p["dilation"]))
                out = launch(desc, coords, offsets, np.full((case["pixels"], case["channels"]), poison(x.dtype)))
                got = read(out)
                want = expected_column(x, p["out"], m0, case["pixels"], tap, case["pad"], p["dilation"],
                                       p["stride"], c0, case["channels"], p["fill"])
                np.testing.assert_array_equal(
                    got, want, err_msg=f"column {m0}, tap {tap}, first channel {c0}: coords {coords}, offsets {offsets}")
                checked += 1
    return checked
