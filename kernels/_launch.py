"""Host-side facts and arithmetic shared by the ready-made kernels: device limits, persistent grids, box and
slot sizes, array checks. Every kernel takes these from here (one definition of each)."""
from __future__ import annotations

import numpy as np

from numbatma import SIMULATING, TensorMapError, array_layout, byte_span
from numbatma.devices import sm_count as _device_sm_count
from numbatma.intrinsics import persistent_grid as _persistent_grid

# Shared memory on H100/H200 (and B200): per-block opt-in maximum (static + dynamic), and per SM (the
# system keeps 1 KiB of it per resident CTA).
SMEM_PER_BLOCK = 227 * 1024
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_CTA = 1024
MAX_BOX = 256  # TMA's largest box dimension (elements)
BOX_ALIGN = 128  # a TMA tile in shared memory starts on a 128-byte boundary


def sm_count(device_id=None):
    """Number of SMs of device ``device_id`` (:func:`numbatma.devices.sm_count`): by default of the current device,
    which is the plan's own while a plan is built or prepared (:class:`numbatma.kernels.Plan` makes its device current
    for that). (The kernels' one way to it: the CPU tests replace this function to fix the SM count.)"""
    return _device_sm_count(device_id)


def persistent_grid(ntiles, ctas_per_sm=1, device_id=None):
    """Blocks for a persistent kernel on device ``device_id`` (default: the current one, see :func:`sm_count`): enough
    to fill the GPU, never more than there are tiles: :func:`numbatma.intrinsics.warp_roles.persistent_grid` with
    that device's SM count. (The device side of the loop is ``numbatma.intrinsics.persistent_share``.)"""
    return _persistent_grid(int(ntiles), int(sm_count(device_id)), int(ctas_per_sm))


def ceil_div(a, b):
    """``a / b`` rounded up (integers)."""
    return -(-a // b)


def round_up(a, b):
    """``a`` rounded up to a multiple of ``b``."""
    return ceil_div(a, b) * b


def next_pow2(v):
    """The smallest power of two >= ``v`` (1 for ``v <= 1``)."""
    return 1 << max(0, int(v) - 1).bit_length()


def slot_elems(nelems, itemsize, align=BOX_ALIGN):
    """Elements between consecutive TMA tiles of ``nelems`` elements in one shared-memory buffer (ring
    stages, box slots): each tile starts ``align`` (128) bytes aligned. ``nelems`` may be a box shape."""
    if isinstance(nelems, tuple):
        n = 1
        for d in nelems:
            n *= d
        nelems = n
    return round_up(nelems * itemsize, align) // itemsize


def byte_extent(layout):
    """``[lo, hi)``: the bytes an array's elements span (``lo == hi`` for an empty array) - for overlap checks.
    ``layout``: an :class:`numbatma.ArrayLayout`, or its fields as a tuple (:func:`numbatma.layout_facts`)."""
    ptr, shape, strides, dtype = layout if isinstance(layout, tuple) else (
        layout.ptr, layout.shape, layout.strides, layout.dtype)
    lo, hi = byte_span(shape, strides, dtype.itemsize)
    return ptr + lo, ptr + hi


class _Elements:
    """A NumPy view of no memory: the addresses of an array's elements (``layout_facts``), for
    ``numpy.shares_memory``, which compares addresses and never reads them."""

    def __init__(self, facts):
        ptr, shape, strides, dtype = facts
        self.__array_interface__ = {"data": (ptr, True), "shape": tuple(shape), "strides": tuple(strides),
                                    "typestr": f"|V{dtype.itemsize}", "version": 3}


def elements_overlap(a, b, max_work=1 << 16):
    """Whether two arrays (their :func:`numbatma.layout_facts`) share a byte of an element: exact for strided views
    whose spans interleave (two column blocks of one matrix share no element although their byte spans overlap);
    True where the question is too hard to settle within ``max_work`` (NumPy's bound), so a caller refusing overlap
    stays on the safe side."""
    lo_a, hi_a = byte_extent(a)
    lo_b, hi_b = byte_extent(b)
    if not (lo_a < hi_b and lo_b < hi_a):
        return False
    try:
        return bool(np.shares_memory(np.asarray(_Elements(a)), np.asarray(_Elements(b)), max_work=max_work))
    except (np.exceptions.TooHardError, ValueError, OverflowError):
        return True


def same_layout(op, *arrays):
    """Check that arrays share shape and dtype; return the layout of the first."""
    layouts = [array_layout(a) for a in arrays]
    first = layouts[0]
    for i, lay in enumerate(layouts[1:], 1):
        if lay.shape != first.shape or lay.dtype != first.dtype:
            raise TensorMapError(
                f"{op}: argument {i} is a {lay.name} but argument 0 is a {first.name}; they must match."
            )
    return first


def require_rank(op, layout, ranks, what="array"):
    if len(layout.shape) not in ranks:
        raise TensorMapError(
            f"{op}: the {what} is a {layout.name}; this kernel takes rank {' or '.join(map(str, ranks))}."
        )


def require_dtype(op, layout, dtypes, what="array"):
    if layout.dtype.name not in dtypes:
        raise TensorMapError(f"{op}: the {what} is a {layout.name}; supported dtypes: {', '.join(dtypes)}.")


def require_int(op, name, value, lo, hi):
    """``value`` as an int in ``lo..hi``, else a TensorMapError naming the option (bools and floats are refused:
    ``stages=True`` or ``stages=2.0`` is a mistake, not a count)."""
    import numbers

    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise TensorMapError(f"{op}: {name} must be an integer in {lo}..{hi}, got {value!r}")
    return int(value)
