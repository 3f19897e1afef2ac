"""Exact stores for the ready-made kernels: never a byte outside the destination view.

A TMA tile store writes whole 16-byte units of each row, so a box reaching the end of a row whose byte length
is not a multiple of 16 also writes the bytes after it (a neighbour's data in a view of a larger array). The
kernels therefore split every destination row in two:

* the **aligned part**, columns ``[0, aligned)`` with ``aligned = numbatma.aligned_columns(n, itemsize)``:
  TMA stores through a descriptor of just those columns (clipped exactly there);
* the **tail**, the last ``n - aligned`` columns (fewer than 16 bytes): ordinary stores, written by the
  kernel's storing thread(s) from the same shared tile the TMA store reads.

Host: :class:`ExactStore` builds both. Device: :func:`tail_store_2d` / :func:`tail_store_nd` make the device
functions that write a box's share of the tail from its shared tile (swizzle-aware).
"""
from __future__ import annotations

from numba import cuda

from numbatma import TensorMap, aligned_columns, array_layout, kernel_view, launch_argument, layout_view

__all__ = ["ExactStore", "tail_store_2d", "tail_store_nd"]


class ExactStore:
    """How a kernel writes the destination ``array`` (any rank; the innermost axis is the one split).

    * ``map``: the TensorMap for the TMA stores (box ``box``, options as for :class:`numbatma.TensorMap`),
      describing columns ``[0, aligned)``; when no row holds a whole 16-byte unit (``aligned == 0``) it
      describes the whole array and ``tma`` is False: the kernel must not TMA-store at all.
    * ``tail``: a kernel argument viewing columns ``[aligned, n)`` (a view of one element, never written,
      when ``has_tail`` is False); ``launch_tail`` is the same as a numba device array.
    * ``aligned``: the first tail column (a kernel argument: shapes do not cause recompilation).
    """

    def __init__(self, array, box, **tensormap_options):
        layout = array_layout(array)
        n = layout.shape[-1]
        self.aligned = aligned_columns(n, layout.dtype.itemsize)
        self.tail_cols = n - self.aligned
        self.has_tail = self.tail_cols > 0
        self.tma = self.aligned > 0
        if not self.has_tail:
            self.map = TensorMap(array, box, **tensormap_options)
        elif self.tma:
            self.map = TensorMap(layout_view(layout.columns(0, self.aligned), array), box, **tensormap_options)
        else:  # never used to store (tma is False): typing only needs a descriptor of the right kind
            self.map = TensorMap(array, box, allow_store_overhang=True, **tensormap_options)
        if self.has_tail:
            self.tail = kernel_view(layout.columns(self.aligned, n), array)
        else:
            first = layout.columns(0, 1)
            self.tail = kernel_view(type(layout)(first.ptr, (1,) * len(layout.shape), layout.strides,
                                                 layout.dtype), array)

    @property
    def launch_tail(self):
        """``tail`` as a launch passes it: a numba device array, made once on first use (``tail`` itself, a
        :class:`numbatma.DeviceView`, works too but is converted at every launch); the NumPy view under the
        simulator."""
        return launch_argument(self.tail)


def _swizzled_column(span, itemsize):
    """Device function ``(r, c) -> c'``: where element ``(r, c)`` of a tile whose rows are ``span`` bytes
    apart sits in its row after TMA's ``span``-byte swizzle (the 16-byte chunk index XOR bits 7.. of the
    byte offset; the tile is aligned to the swizzle repeat). Identity without swizzle."""
    if not span:
        return cuda.jit(device=True, inline="always")(lambda r, c: c)
    mask = span // 16 - 1

    def column(r, c):
        x = ((r * span) >> 7) & mask
        return ((c * itemsize) ^ (x << 4)) // itemsize

    return cuda.jit(device=True, inline="always")(column)


def tail_store_2d(box, itemsize, swizzle=0):
    """A device function ``store(tile, tail, r0, c0, aligned, first, step)`` that writes the tail part of the
    box ``box = (rows, cols)`` whose first element is at ``(r0, c0)`` of a 2-D destination: element
    ``(r0 + r, c)`` for every column ``c >= aligned`` the box covers goes to ``tail[r0 + r, c - aligned]``
    from ``tile[r, c - c0]`` (2-D shared tile, rows ``span`` bytes apart when ``swizzle``). Rows and columns
    past the destination are skipped. Threads ``first, first + step, ...`` share the work."""
    box_r, box_c = box
    column = _swizzled_column(int(swizzle), itemsize)

    def store(tile, tail, r0, c0, aligned, first, step):
        nrows = min(box_r, tail.shape[0] - r0)
        lo = max(c0, aligned)
        w = min(c0 + box_c, aligned + tail.shape[1]) - lo
        if nrows > 0 and w > 0:
            for q in range(first, nrows * w, step):
                r = q // w
                c = lo + (q - r * w)
                tail[r0 + r, c - aligned] = tile[r, column(r, c - c0)]

    return cuda.jit(device=True, inline="always")(store)


def tail_store_nd(rank, box, itemsize, swizzle=0):
    """``tail_store_2d`` for a rank-``rank`` destination and tile (a box of shape ``box`` at ``coords``, a
    tuple): ``store(tile2d, tail, coords, aligned)``, one thread, where ``tile2d`` is the tile viewed as
    ``(rows, span_or_cols)`` (its leading axes folded). Generated per rank: a coordinate tuple has a fixed
    length in Numba."""
    if rank == 2:
        inner = tail_store_2d(box, itemsize, swizzle)

        def store2(tile2d, tail, coords, aligned):
            inner(tile2d, tail, coords[0], coords[1], aligned, 0, 1)

        return cuda.jit(device=True, inline="always")(store2)
    lead = box[:-1]
    box_c = box[-1]
    lines = ["def store(tile2d, tail, coords, aligned):",
             f"    c0 = coords[{rank - 1}]",
             "    lo = max(c0, aligned)",
             f"    hi = min(c0 + {box_c}, aligned + tail.shape[{rank - 1}])",
             "    if hi <= lo:",
             "        return"]
    indent = "    "
    row = "0"
    for axis, extent in enumerate(lead):
        lines.append(f"{indent}for q{axis} in range({extent}):")
        indent += "    "
        lines.append(f"{indent}i{axis} = coords[{axis}] + q{axis}")
        lines.append(f"{indent}if i{axis} < tail.shape[{axis}]:")
        indent += "    "
        row = f"({row}) * {extent} + q{axis}" if axis else f"q{axis}"
    index = ", ".join(f"i{a}" for a in range(rank - 1))
    lines.append(f"{indent}row = {row}")
    lines.append(f"{indent}for c in range(lo, hi):")
    lines.append(f"{indent}    tail[{index}{', ' if index else ''}c - aligned] = tile2d[row, column(row, c - c0)]")
    scope = {"column": _swizzled_column(int(swizzle), itemsize)}
    exec("\n".join(lines), scope)  # noqa: S102 - generated from integers only
    return cuda.jit(device=True, inline="always")(scope["store"])

