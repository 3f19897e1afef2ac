"""Row reductions over the last axis with TMA: :class:`RowSum` (``out[i] = sum(x[i, :])``) and
:class:`Softmax` (``out[i, :] = softmax(x[i, :])``, numerically stable).

Arrays: any CUDA arrays (numba, CuPy, PyTorch) of float32, float16 or bfloat16 (16-bit types are read,
accumulated and exponentiated in float32). ``x`` has shape ``(..., n)``: leading dimensions are folded
into rows when their strides allow it (C-contiguous over the leading dimensions; the row pitch may be
padded). Rows must start on 16-byte boundaries (TMA's rule): for a contiguous array, ``n`` a multiple of
4 (float32) or 8 (16-bit types).

Design (both kernels): a persistent grid (CTA ``b`` takes row blocks ``b, b + grid, ...``), one producer
warp whose lane 0 TMA-loads stages into a ring of ``stages`` dynamic shared-memory buffers
(:class:`numbatma.intrinsics.Pipeline`), and ``warps`` consumer warps. A row is read by a group of
``threads_per_row`` consumer threads (a power of two; <= 32: shuffles only; more: shuffles, then a
shared-memory exchange behind a named barrier per group). A stage holds ``(box_rows, box_cols)`` TMA boxes:
``box_cols <= 256`` elements cover a row with ``ceil(n / 256)`` boxes of equal width (rounded up to 16
bytes); each box slot is padded to 128 bytes in shared memory.

Files: :mod:`numbatma.kernels._rows_plan` (the planner: rows views, boxes, stages; a :class:`RowsConfig`
is what ``plan.config`` shows), :mod:`numbatma.kernels._reduce` (the warp-reduction toolbox: conversions,
shuffle and row-group reductions), :mod:`numbatma.kernels.rowsum` (:class:`RowSum`: its modes and kernel) and
:mod:`numbatma.kernels.softmax` (:class:`Softmax`: its modes, register path and kernels). This module
gathers their public names.

Limits: ``n`` is unbounded in chunked mode. Rows mode needs ``rows_per_stage * padded_row_bytes *
stages`` to fit in shared memory (227 KiB per CTA on H100/H200, shared by ``ctas_per_sm`` CTAs): about
28K float32 / 56K 16-bit elements per row with two stages; ``mode="rows"`` with longer rows raises
:class:`numbatma.TensorMapError` naming the limit. Few rows with very long rows use few CTAs (one row
block per CTA; no split of a row across CTAs).

Tuning (constructor options): ``stages``, ``warps`` (consumer warps, 1..16), ``stage_bytes`` (target
bytes per stage), ``threads_per_row``, ``rows_per_stage``, ``chunk_boxes``, ``ctas_per_sm``,
``l2_promotion``, ``fastmath``; Softmax also ``mode``, ``store_lag`` and ``registers``. ``plan.config`` shows
the chosen values. Softmax's default ``warps`` is 8 (``softmax.LONG_ROW_WARPS`` for rows mode with rows of at least 2048
elements, box-rounded); ``threads_per_row`` then aims at 32 elements per thread. Softmax rows-mode kernels
are compiled with ``max_registers`` (``plan.max_registers``) so that ``ctas_per_sm`` CTAs fit.
"""
from __future__ import annotations

from ._rows_plan import DTYPES, RowsConfig
from .rowsum import RowSum, row_sum
from .softmax import Softmax, softmax

__all__ = ["RowSum", "Softmax", "row_sum", "softmax", "RowsConfig", "DTYPES"]
