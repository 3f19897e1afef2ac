"""Pure shape arithmetic: of TMA tiles, shared by the host descriptors (``tensormap``, ``im2col``) and their Numba
types (``_types``, ``_im2col_type``); of cluster launch grids, shared by ``cluster`` and the launch hook of
``_numba_internals``. A leaf module: it imports nothing of numbatma, so none of those modules needs to import
another for arithmetic (no import circle)."""
from __future__ import annotations

import math
import numbers


def tile_footprint(box, element_strides, itemsize, swizzle):
    """(shared_shape, box_bytes) of one tile load. ``box_bytes`` is what the load writes (its transaction
    count): ``ceil(box / element_strides)`` elements per axis. With a swizzle whose span is wider than the
    box's innermost row, the hardware gives every row a whole span in shared memory (observed on an H200:
    ``scripts/probe_swizzle_pad.py``; the bytes between are not written), so the tile the load occupies has
    rows of ``span / itemsize`` elements."""
    counts = tuple(-(-b // e) for b, e in zip(box, element_strides))
    delivered = math.prod(counts) * itemsize
    if swizzle and counts[-1] * itemsize < swizzle:
        counts = counts[:-1] + (swizzle // itemsize,)
    return counts, delivered


def tile_alignment(desc):
    """The shared-tile alignment (bytes) TMA needs for a descriptor (a TensorMap or its Numba type: anything with
    ``swizzle``): 128 bytes, or the swizzle repeat (8 spans: 256/512/1024 bytes for 32/64/128-byte swizzles)."""
    span = int(desc.swizzle)
    return 128 if not span else max(128, 8 * span)


def grid_shape(grid):
    """A launch grid (an int or a tuple of 1-3 ints, counted in blocks) as an ``(x, y, z)`` tuple."""
    if isinstance(grid, numbers.Integral):
        grid = (grid,)
    grid = tuple(int(g) for g in grid)
    return grid + (1,) * (3 - len(grid))


def check_grid(grid, shape):
    """Raise ValueError unless the grid (in blocks) is a whole number of clusters of ``shape`` on every axis."""
    g = grid_shape(grid)
    bad = [axis for axis, n, c in zip("xyz", g, shape) if n % c]
    if bad:
        raise ValueError(
            f"the grid {g} (in blocks) is not a whole number of clusters of shape {shape}: along "
            f"{', '.join(bad)} the grid is not a multiple of the cluster (pick a grid that is, e.g. "
            f"{tuple(-(-n // c) * c for n, c in zip(g, shape))}, and let the extra blocks return early)"
        )
