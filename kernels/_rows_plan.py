"""The planner of the row kernels (:mod:`numbatma.kernels.rowsum`, :mod:`numbatma.kernels.softmax`): how an
array ``(..., n)`` is seen as ``(rows, n)``, and how row blocks are cut into TMA boxes and shared-memory stages.
Host only; no GPU needed.

* :func:`rows_view`: the 2-D ``(rows, n)`` view of an array (leading dimensions folded) as a :class:`RowsView`.
* :func:`plan_rows` (*rows* mode: whole rows per stage) and :func:`plan_chunked` (*chunked* mode: a row block
  split into chunks of column boxes) return a :class:`StagePlan`; :meth:`StagePlan.config` turns the chosen
  one into the :class:`RowsConfig` a plan shows as ``plan.config``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from numbatma import ArrayLayout, TensorMapError, array_layout, kernel_view

from ._launch import (MAX_BOX, SMEM_PER_BLOCK, SMEM_PER_SM, SMEM_RESERVED_PER_CTA, ceil_div, persistent_grid,
                      round_up, slot_elems)
from ._options import int_option
from ._plan import Plan

__all__ = ["DTYPES", "RowsConfig", "RowsPlan", "RowsView", "StagePlan", "box_cols", "check_common", "check_tpr", "fold",
           "plan_chunked", "plan_rows", "register_cap", "rows_view", "smem_budget", "strided_view"]

DTYPES = ("float32", "float16", "bfloat16")


def register_cap(warps_per_sm):
    """The most registers per thread with which ``warps_per_sm`` warps are resident on one SM. The 64K
    registers of an SM sit in 4 quadrants of 16K and warps are spread over the quadrants, so the busiest
    quadrant holds ceil(warps / 4) warps (seen on an H200: 18 warps x 112 registers did not launch,
    18 x 104 neither, 18 x 83 did). Allocation is in units of 8 registers per thread."""
    per_quadrant = -(-warps_per_sm // 4)
    return min(255, 16384 // (32 * per_quadrant) // 8 * 8)


# -- host: views of the arrays ------------------------------------------------------------------------
def strided_view(base, ptr, shape, strides, dtype):
    """A strided view of the memory of ``base`` (:func:`numbatma.kernel_view`: a kernel argument and a
    TensorMap source; keeps ``base`` alive). bfloat16 travels as uint16 (TMA moves bits; the kernels convert)."""
    bits = np.dtype("<u2") if dtype.name == "bfloat16" else dtype
    return kernel_view(ArrayLayout(int(ptr), tuple(int(s) for s in shape), tuple(int(s) for s in strides), bits),
                       base)


def fold(op, what, layout, keep_last):
    """(count, stride) of the dimensions of ``layout`` folded into one (the last one kept apart when
    ``keep_last``); raises when their strides do not allow a single stride."""
    shape, strides = layout.shape, layout.strides
    dims = list(zip(shape[:-1], strides[:-1])) if keep_last else list(zip(shape, strides))
    count = math.prod(d for d, _ in dims) if dims else 1
    big = [(d, s) for d, s in dims if d != 1]
    for (d0, s0), (d1, s1) in zip(big, big[1:]):
        if s0 != s1 * d1:
            raise TensorMapError(
                f"{op}: the {what} is a {layout.name} with byte strides {layout.strides}; its leading "
                f"dimensions cannot be folded into one row index. Make it C-contiguous (e.g. .copy())."
            )
    stride = big[-1][1] if big else None
    return count, stride


@dataclass(frozen=True)
class RowsView:
    """A (rows, n) view of an array: the TMA-describable 2-D view (the array itself or a
    :func:`strided_view`) and its facts."""

    view: object
    rows: int
    n: int
    dtype: np.dtype
    layout: object


def rows_view(op, array, what="x"):
    """The :class:`RowsView` of ``array`` ``(..., n)``; raises a :class:`numbatma.TensorMapError` naming the
    rule when TMA cannot describe it (strides that do not fold, rows not 16-byte aligned, a dtype)."""
    layout = array_layout(array)
    if len(layout.shape) < 1:
        raise TensorMapError(f"{op}: the {what} is a 0-dimensional array; rows are taken along the last axis.")
    dtype = layout.dtype
    if dtype.name not in DTYPES:
        raise TensorMapError(f"{op}: the {what} is a {layout.name}; supported dtypes: {', '.join(DTYPES)}.")
    item = dtype.itemsize
    n = layout.shape[-1]
    if 0 in layout.shape:  # (an empty array: nothing is described or launched, so any strides do)
        return RowsView(array, math.prod(layout.shape[:-1]), n, dtype, layout)
    rows, row_stride = fold(op, what, layout, keep_last=True)
    if n > 1 and layout.strides[-1] != item:
        raise TensorMapError(
            f"{op}: the last axis of the {what} ({layout.name}) has a stride of {layout.strides[-1]} bytes; "
            f"it must be contiguous ({item} bytes)."
        )
    if row_stride is None:  # a single row
        row_stride = round_up(max(n, 1) * item, 16)
    if rows > 1 and (row_stride % 16 or row_stride < n * item):
        per16 = 16 // item
        raise TensorMapError(
            f"{op}: rows of the {what} ({layout.name}) are {row_stride} bytes apart; TMA needs rows to start "
            f"on 16-byte boundaries, i.e. the row length n={n} a multiple of {per16} for a contiguous "
            f"{dtype.name} array. Pad the rows to {round_up(n, per16)} elements (and slice the padding off)."
        )
    if len(layout.shape) == 2 and dtype.name != "bfloat16" and rows > 1:
        view = array  # already (rows, n): describe it directly
    else:
        view = strided_view(array, layout.ptr, (rows, n), (row_stride, item), dtype)
    return RowsView(view, rows, n, dtype, layout)


# -- boxes, stages, shared memory -----------------------------------------------------------------------
def box_cols(n, item):
    """Column boxes covering a row: (box_cols, count) with box_cols <= 256 a multiple of 16 bytes."""
    per16 = 16 // item
    count = ceil_div(n, MAX_BOX)
    return min(MAX_BOX, round_up(ceil_div(n, count), per16)), count


def smem_budget(op, ctas_per_sm, static_bytes):
    """Dynamic shared memory bytes a CTA may ask for. The dynamic buffer is 1024-byte aligned and follows
    the static variables (barriers, scratch) and a reserved 1 KiB: ptxas reports 2048 bytes of static
    shared memory for 192 bytes of static variables, so the static part is rounded up accordingly."""
    int_option(op, "ctas_per_sm", ctas_per_sm, 1, 32)
    per_cta = min(SMEM_PER_BLOCK, SMEM_PER_SM // ctas_per_sm - SMEM_RESERVED_PER_CTA)
    return per_cta - round_up(static_bytes + 1024, 1024)


def check_common(op, stages, warps, stage_bytes, ctas_per_sm=1, threads_per_row=None, rows_per_stage=None,
                 chunk_boxes=None, mode="auto"):
    """The options both row plans take, checked (:mod:`._options`; ``mode``: "auto", "rows" or "chunked")."""
    from ._options import choice_option

    int_option(op, "stages", stages, 1, 32)
    int_option(op, "warps (consumer warps)", warps, 1, 16)
    int_option(op, "stage_bytes", stage_bytes, 1024, SMEM_PER_BLOCK)
    int_option(op, "ctas_per_sm", ctas_per_sm, 1, 32)
    int_option(op, "threads_per_row", threads_per_row, 1, 512, none_ok=True)
    int_option(op, "rows_per_stage", rows_per_stage, 1, none_ok=True)
    int_option(op, "chunk_boxes", chunk_boxes, 1, none_ok=True)
    choice_option(op, "mode", mode, ("auto", "rows", "chunked"))


def check_tpr(op, tpr, consumers):
    int_option(op, "threads_per_row", tpr, 1)
    if tpr < 1 or tpr & (tpr - 1) or tpr > consumers or (tpr > 32 and tpr % 32):
        raise TensorMapError(
            f"{op}: threads_per_row must be a power of two in 1..{consumers} (the consumer threads), got {tpr}"
        )


@dataclass(frozen=True)
class RowsConfig:
    """What a plan chose. ``rows_per_stage`` = ``box_rows * row_boxes``; a stage holds
    ``row_boxes x col_boxes`` TMA boxes of ``(box_rows, box_cols)``."""

    mode: str  # "rows" or "chunked"
    warps: int
    stages: int
    threads_per_row: int
    rows_per_stage: int
    box_rows: int
    box_cols: int
    row_boxes: int
    col_boxes: int  # boxes per stage along a row (all of them in rows mode)
    total_col_boxes: int  # boxes covering a row
    slot: int  # elements between box slots
    smem_bytes: int  # dynamic shared memory per CTA
    row_blocks: int
    ctas_per_sm: int
    store_lag: int | None = None  # Softmax only

    @property
    def stage_elems(self):
        return self.row_boxes * self.col_boxes * self.slot


@dataclass(frozen=True)
class StagePlan:
    """One way to cut row blocks into stages (:func:`plan_rows` or :func:`plan_chunked`): a stage holds
    ``row_boxes x col_boxes`` boxes of ``(box_rows, box_cols)``, ``slot`` elements apart, ``stage_bytes`` in
    all; ``stages`` of them fit in the budget (0: none)."""

    threads_per_row: int
    rows_per_stage: int
    box_rows: int
    row_boxes: int
    box_cols: int
    col_boxes: int
    total_col_boxes: int
    slot: int
    stages: int
    stage_bytes: int

    def config(self, mode, warps, rows, ctas_per_sm, store_lag=None):
        """The :class:`RowsConfig` of this plan for ``rows`` rows."""
        return RowsConfig(
            mode=mode, warps=warps, stages=self.stages, threads_per_row=self.threads_per_row,
            rows_per_stage=self.rows_per_stage, box_rows=self.box_rows, box_cols=self.box_cols,
            row_boxes=self.row_boxes, col_boxes=self.col_boxes, total_col_boxes=self.total_col_boxes,
            slot=self.slot, smem_bytes=self.stages * self.stage_bytes,
            row_blocks=ceil_div(rows, self.rows_per_stage), ctas_per_sm=ctas_per_sm, store_lag=store_lag,
        )


def plan_rows(rows, n, item, *, warps, tpr, stage_bytes, rows_per_stage, budget, stages, op):
    """Rows mode: whole rows per stage, at least one row per thread group (``consumers / tpr`` rows) and
    about ``stage_bytes`` in all. ``stages`` in the result is how many such stages fit (0: none)."""
    consumers = 32 * warps
    box_c, kc = box_cols(n, item)
    rf = consumers // tpr  # rows handled at once (one per group)
    slot_row_bytes = lambda br: kc * slot_elems(br * box_c, item) * item  # noqa: E731 - bytes of br rows
    if rows_per_stage is None:
        per_row = kc * box_c * item
        want = max(rf, stage_bytes // per_row)
        want = min(want, round_up(rows, rf))  # no point loading many out-of-range rows
        br = max(rf, want // rf * rf)
    else:
        br = rows_per_stage
        if br % rf:
            raise TensorMapError(
                f"{op}: rows_per_stage={br} must be a multiple of {rf} (consumer threads / threads_per_row)"
            )
    if br > MAX_BOX:
        br = br // MAX_BOX * MAX_BOX
        box_r, kr = MAX_BOX, br // MAX_BOX
    else:
        box_r, kr = br, 1
    stage = kr * slot_row_bytes(box_r)
    fit = budget // stage
    return StagePlan(threads_per_row=tpr, rows_per_stage=br, box_rows=box_r, row_boxes=kr, box_cols=box_c,
                     col_boxes=kc, total_col_boxes=kc, slot=slot_elems(box_r * box_c, item),
                     stages=min(stages, fit), stage_bytes=stage)


def plan_chunked(n, item, *, warps, tpr, stage_bytes, chunk_boxes, budget, stages, op):
    """Chunked mode: one row per thread group, a stage holds ``col_boxes`` column boxes of each row (about
    ``stage_bytes``; two stages kept when possible), the chunks of a row block pass through the ring."""
    consumers = 32 * warps
    box_c, kc = box_cols(n, item)
    br = consumers // tpr  # one row per group
    slot = slot_elems(br * box_c, item)
    if chunk_boxes is None:
        kcs = max(1, min(kc, stage_bytes // (slot * item)))
        while kcs > 1 and kcs * slot * item * min(stages, 2) > budget:  # keep two stages when possible
            kcs //= 2
    else:
        kcs = chunk_boxes
        if kcs < 1:
            raise TensorMapError(f"{op}: chunk_boxes must be positive, got {kcs}")
    kcs = min(kcs, kc)
    stage = kcs * slot * item
    return StagePlan(threads_per_row=tpr, rows_per_stage=br, box_rows=br, row_boxes=1, box_cols=box_c,
                     col_boxes=kcs, total_col_boxes=kc, slot=slot, stages=min(stages, budget // stage),
                     stage_bytes=stage)


class RowsPlan(Plan):
    """What the row kernels' plans (RowSum, Softmax) share: a persistent grid over the row blocks of their
    ``config`` (computed on first use: it needs the GPU's SM count), its shared memory, ``threads``."""

    _grid = None

    @property
    def threads(self):
        """Threads per block (``block``; the earlier name)."""
        return self.block

    @property
    def grid(self):
        """Persistent grid: ``ctas_per_sm`` CTAs per SM, never more than there are row blocks (needs the GPU)."""
        if self._grid is None:
            self._grid = persistent_grid(self.config.row_blocks, self.config.ctas_per_sm)
        return self._grid

    @property
    def shared_mem(self):
        return self.config.smem_bytes
