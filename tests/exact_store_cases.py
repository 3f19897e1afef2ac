"""Every kernel of numbatma.kernels writing into a view inside a larger, sentinel-filled array: the view must
hold the right values and every byte around it - on every side, including the bytes up to the next 16-byte
boundary after each row, which a TMA store would write - must keep the sentinel.

Shared by the simulator tests (tests/sim/test_sim_exact_store.py, small shapes) and the GPU tests
(tests/test_gpu_exact_store.py). ``run(case)`` works with numba's ``cuda`` in either mode.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from numbatma.kernels import Axpy, Laplacian5, RowSum, Softmax, StreamCopy, Transpose, tma_copy

RNG = np.random.default_rng()
SENTINEL = 1234.5  # floats; integers get 0x5A in every byte


def _bits(dtype):
    return np.dtype({2: np.uint16, 4: np.uint32, 8: np.uint64, 1: np.uint8}[np.dtype(dtype).itemsize])


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def sentinel_parent(shape, dtype):
    """A parent array with room on every side of a view of ``shape``, and the view's index: one element
    before and after along the leading axes; 16 bytes before (the view must start 16-byte aligned) and at
    least 16 bytes after the innermost extent, the parent's rows a whole number of 16-byte units."""
    dtype = np.dtype(dtype)
    per16 = max(1, 16 // dtype.itemsize)
    lead = tuple(n + 2 for n in shape[:-1])
    inner = shape[-1]
    width = per16 + inner + per16
    width += -width % per16
    parent = np.empty(lead + (width,), dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        parent[...] = SENTINEL
    else:
        parent.view(np.uint8)[...] = 0x5A
    index = tuple(slice(1, 1 + n) for n in shape[:-1]) + (slice(per16, per16 + inner),)
    return parent, index


def random(shape, dtype):
    dtype = _dtype(dtype)
    if dtype.kind in "iu":
        return RNG.integers(0, 100, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def check(parent_after, parent_before, index, expected, rtol=0.0, atol=0.0, what=""):
    """The view holds ``expected``; every other element of the parent is bit-for-bit what it was."""
    got = parent_after[index]
    outside = np.ones(parent_after.shape, bool)
    outside[index] = False
    bits = _bits(parent_after.dtype)
    changed = outside & (parent_after.view(bits) != parent_before.view(bits))
    assert not changed.any(), (
        f"{what}: {changed.sum()} element(s) outside the view were written, e.g. at {tuple(np.argwhere(changed)[0])}"
    )
    if rtol or atol:
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=what)
    else:
        np.testing.assert_array_equal(got.view(_bits(got.dtype)), expected.astype(got.dtype).view(_bits(got.dtype)),
                                      err_msg=what)


class Backend:
    """Device arrays of one library: numba (default; also the simulator), cupy or torch (bfloat16 too)."""

    def __init__(self, name="numba"):
        self.name = name

    def to_device(self, host):
        if self.name == "numba":
            return cuda.to_device(host)
        if self.name == "cupy":
            import cupy

            return cupy.asarray(host)
        import torch

        if host.dtype.name == "bfloat16":
            return torch.from_numpy(host.view(np.int16)).cuda().view(torch.bfloat16)
        return torch.from_numpy(host).cuda()

    def to_host(self, dev, dtype):
        if self.name == "numba":
            return dev.copy_to_host()
        if self.name == "cupy":
            return dev.get()
        import torch

        if dev.dtype == torch.bfloat16:
            return dev.view(torch.int16).cpu().numpy().view(dtype)
        return dev.cpu().numpy()


def _in_view(shape, dtype, backend):
    """(host parent, device parent, device view, host index) for an output view."""
    parent, index = sentinel_parent(shape, dtype)
    dev = backend.to_device(parent)
    return parent, dev, dev[index], index


def _device_input(values, backend):
    """An input that is itself a view inside a larger array (so loads see neighbours too)."""
    parent, index = sentinel_parent(values.shape, values.dtype)
    parent[index] = values
    return backend.to_device(parent)[index]


def run(case, backend="numba"):
    """Run one case (a dict: kernel, shape, dtype, options, box for tma_copy) and check it."""
    kernel, shape, dtype = case["kernel"], tuple(case["shape"]), _dtype(case.get("dtype", "float32"))
    options = dict(case.get("options", {}))
    what = f"{kernel}{shape} {dtype.name} {options} ({backend})"
    b = Backend(backend)
    inp = lambda values: _device_input(values, b)  # noqa: E731
    out = lambda shape, dtype: _in_view(shape, dtype, b)  # noqa: E731
    if kernel == "transpose":
        x = random(shape, dtype)
        before, dev, view, index = out(shape[::-1], dtype)
        Transpose(inp(x), view, **options).launch()
        cuda.synchronize()
        check(b.to_host(dev, dtype), before, index, x.T, what=what)
        return
    x = random(shape, dtype)
    if kernel == "row_sum":
        before, dev, view, index = out(shape[:-1], dtype)
        RowSum(inp(x), view, **options).launch()
        cuda.synchronize()
        want = x.astype(np.float64).sum(axis=-1)
        check(b.to_host(dev, dtype), before, index, want, rtol=1e-3 if dtype.itemsize == 2 else 1e-5, atol=1e-3,
              what=what)
        return
    before, dev, view, index = out(shape, dtype)
    if kernel == "tma_copy":
        tma_copy(inp(x), view, case["box"], swizzle=options.get("swizzle", 0))
        want, tol = x, {}
    elif kernel == "stream_copy":
        StreamCopy(inp(x), view, **options).launch()
        want, tol = x, {}
    elif kernel == "axpy":
        y = random(shape, dtype)
        Axpy(1.5, inp(x), inp(y), view, **options).launch()
        want, tol = dtype.type(1.5) * x + y, dict(rtol=1e-6, atol=1e-6)
    elif kernel == "laplacian5":
        Laplacian5(inp(x), view, **options).launch()
        p = np.pad(x, 1)
        want = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - dtype.type(4) * x
        tol = dict(rtol=1e-5, atol=1e-5)
    elif kernel == "softmax":
        Softmax(inp(x), view, **options).launch()
        f = x.astype(np.float64)
        e = np.exp(f - f.max(axis=-1, keepdims=True))
        want = e / e.sum(axis=-1, keepdims=True)
        tol = dict(rtol=1e-2, atol=1e-3) if dtype.itemsize == 2 else dict(rtol=1e-5, atol=1e-7)
    else:
        raise ValueError(kernel)
    cuda.synchronize()
    check(b.to_host(dev, dtype), before, index, want, what=what, **tol)


# Widths chosen so that the rows end 1, 2 and 3 elements (float32) short of a 16-byte unit, end on one, and
# are narrower than one unit; boxes that do not divide the shapes.
SIM_CASES = [
    dict(kernel="tma_copy", shape=(5, 37), box=(4, 16)),
    dict(kernel="tma_copy", shape=(37,), box=(16,)),
    dict(kernel="tma_copy", shape=(2, 3, 13), box=(1, 2, 8), dtype="float64"),
    dict(kernel="tma_copy", shape=(6, 30), box=(8, 32), dtype="uint16", options=dict(swizzle=64)),
    dict(kernel="tma_copy", shape=(5, 3), box=(4, 4)),  # no whole 16-byte unit in a row
    dict(kernel="stream_copy", shape=(9, 38), options=dict(tile_bytes=512, stages=2)),
    dict(kernel="stream_copy", shape=(9, 38), options=dict(tile_bytes=512, stages=2, two_roles=True)),
    dict(kernel="stream_copy", shape=(41,), options=dict(tile_bytes=128)),
    dict(kernel="stream_copy", shape=(7, 2), options=dict(tile_bytes=256)),
    dict(kernel="axpy", shape=(9, 39), options=dict(stages=2, tile_bytes=1024)),
    dict(kernel="axpy", shape=(5, 3), options=dict(stages=2, tile_bytes=1024)),
    dict(kernel="transpose", shape=(33, 37)),
    dict(kernel="transpose", shape=(35, 40), dtype="float64"),
    dict(kernel="transpose", shape=(70, 67), dtype="uint16"),
    dict(kernel="laplacian5", shape=(11, 23), options=dict(tile=(4, 8))),
    dict(kernel="laplacian5", shape=(9, 3), dtype="float64", options=dict(tile=(4, 2))),
    dict(kernel="softmax", shape=(7, 45)),
    dict(kernel="softmax", shape=(3, 301), options=dict(mode="chunked", stage_bytes=1024)),
    dict(kernel="softmax", shape=(6, 13), dtype="float16"),
    dict(kernel="row_sum", shape=(10, 45)),
]
