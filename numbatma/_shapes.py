"""Pure shape arithmetic of TMA tiles, shared by the host descriptors (``tensormap``, ``im2col``) and their Numba
types (``_types``, ``_im2col_type``). A leaf module: it imports nothing of numbatma, so the type modules need
no import of ``tensormap`` (no import circle)."""
from __future__ import annotations

import math


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
