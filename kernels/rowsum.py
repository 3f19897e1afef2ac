"""Row sums over the last axis with TMA: :class:`RowSum` (``out[i] = sum(x[i, :])``); the design shared with
:class:`numbatma.kernels.Softmax` is described in :mod:`numbatma.kernels.rows`.

*rows* mode (a stage holds whole rows, ``rows_per_stage`` of them): each group sums its rows from shared
memory and writes them; *chunked* mode (long rows): one warp per row, a stage holds ``warps`` rows x
``chunk_boxes`` column boxes, each lane accumulates in a register across the chunks, one shuffle reduction
per row at the end. Reads every element once; zero-filled out-of-bounds elements add nothing. Results are
written with ordinary stores.
"""
from __future__ import annotations

from numba import cuda, float32

from numbatma import TensorMap, TensorMapError, array_layout, launch_argument
from numbatma.streams import numba_stream
from numbatma.intrinsics import Pipeline, persistent_share, shared_view

from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync
from ._launch import ceil_div, next_pow2
from ._options import bool_option
from ._plan import run
from ._reduce import converters, ld, shuffle_reducers
from ._rows_plan import (RowsPlan, box_cols, check_common, check_tpr, fold, plan_chunked, plan_rows, rows_view,
                         smem_budget, strided_view)

__all__ = ["RowSum", "row_sum"]


@kernel_factory
def _row_sum_kernel(dtype_name, nb_dtype, warps, stages, tpr, box_r, box_c, kr, kcs, slot, chunked, fastmath):
    to_f32, from_f32 = converters(dtype_name)
    warp_sum, _ = shuffle_reducers(tpr)
    rf = 32 * warps // tpr
    br = kr * box_r
    stage_elems = kr * kcs * slot
    full = box_c // tpr
    rem = box_c - full * tpr

    @cuda.jit(fastmath=fastmath)
    def row_sum_kernel(x, out, rows, nblocks, kc_total):
        dyn = cuda.shared.array(0, nb_dtype, alignment=1024)
        pipe = Pipeline(stages, 1, warps)
        grid_dependency_sync()
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        first, step, mine = persistent_share(nblocks)
        nchunks = (kc_total + kcs - 1) // kcs
        if warp == warps:
            # producer: lane 0 loads the boxes of every (row block, chunk) into the ring
            if lane == 0:
                for i in range(mine):
                    r0 = (first + i * step) * br
                    nbr = min(kr, (rows - r0 + box_r - 1) // box_r)
                    for ch in range(nchunks):
                        c0 = ch * kcs
                        nb = min(kcs, kc_total - c0)
                        s = pipe.producer_acquire()
                        base = s * stage_elems
                        for a in range(nbr):
                            for b in range(nb):
                                pipe.load(shared_view(dyn, base + (a * kcs + b) * slot, (box_r, box_c)), x,
                                          (r0 + a * box_r, (c0 + b) * box_c))
                        pipe.producer_commit()
        else:
            grp = tid // tpr
            sub = tid % tpr
            for i in range(mine):
                r0 = (first + i * step) * br
                acc = float32(0)
                for ch in range(nchunks):
                    nb = min(kcs, kc_total - ch * kcs)
                    s = pipe.consumer_wait()
                    base = s * stage_elems
                    for r in range(grp, br, rf):
                        rb = r // box_r
                        p0 = base + rb * kcs * slot + (r - rb * box_r) * box_c + sub
                        v = float32(0)
                        for b in range(nb):
                            p = p0 + b * slot
                            for t in range(full):
                                v += to_f32(ld(dyn, p + t * tpr))
                            if rem:
                                if sub < rem:
                                    v += to_f32(ld(dyn, p + full * tpr))
                        if chunked:
                            acc += v
                        else:
                            v = warp_sum(v)
                            if sub == 0 and r0 + r < rows:
                                out[r0 + r] = from_f32(v)
                    cuda.syncwarp()
                    if lane == 0:
                        pipe.consumer_release()
                if chunked:
                    acc = warp_sum(acc)
                    if lane == 0 and r0 + warp < rows:
                        out[r0 + warp] = from_f32(acc)

    return row_sum_kernel


@kernel_factory
def _fill_zero_kernel():
    @cuda.jit
    def fill_zero(out):
        grid_dependency_sync()
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = 0

    return fill_zero


class RowSum(RowsPlan):
    """A planned ``out[i] = x[i, :].sum()`` over the last axis (see :mod:`numbatma.kernels.rows` for the design).

    ``x``: CUDA array ``(..., n)`` of float32/float16/bfloat16; ``out``: same dtype, shape
    ``x.shape[:-1]`` (or ``(rows,)``). Options: ``stages`` (4), ``warps`` (8 consumer warps),
    ``stage_bytes`` (32768), ``threads_per_row`` (auto), ``rows_per_stage`` (auto, rows mode),
    ``chunk_boxes`` (auto, chunked mode), ``mode`` ("auto", "rows", "chunked"), ``ctas_per_sm`` (1),
    ``l2_promotion`` (0), ``fastmath`` (False). Accumulation is in float32. Follows the plan contract of
    :class:`numbatma.kernels.Plan` (``launch(stream)`` returns ``out``).
    """

    def __init__(self, x, out, *, stages=4, warps=8, stage_bytes=32768, threads_per_row=None,
                 rows_per_stage=None, chunk_boxes=None, mode="auto", ctas_per_sm=1, l2_promotion=0,
                 fastmath=False):
        op = "RowSum"
        check_common(op, stages, warps, stage_bytes, ctas_per_sm, threads_per_row, rows_per_stage, chunk_boxes, mode)
        bool_option(op, "fastmath", fastmath)
        xr = rows_view(op, x)
        lo = array_layout(out)
        if lo.dtype != xr.dtype:
            raise TensorMapError(f"{op}: out is a {lo.name} but x is a {xr.layout.name}; out must be {xr.dtype.name}.")
        lead = xr.layout.shape[:-1]
        if lo.shape != lead and lo.shape != (xr.rows,):
            raise TensorMapError(
                f"{op}: out is a {lo.name}; for x of shape {xr.layout.shape} it must have shape {lead} "
                f"(or ({xr.rows},))."
            )
        if xr.rows == 0:  # (an empty out: nothing is written, so any strides do)
            ostride = None
        else:
            _, ostride = fold(op, "out", lo, keep_last=False)
        ostride = ostride or xr.dtype.itemsize
        # out as the kernel writes it: a 1-D view of (rows,) elements ostride bytes apart (bfloat16 as bits)
        self.out_view = strided_view(out, lo.ptr, (xr.rows,), (ostride,), xr.dtype)
        self._out_stride = ostride
        self.x, self.out = x, out
        self.rows, self.n, self.dtype = xr.rows, xr.n, xr.dtype
        self.nbytes = xr.rows * xr.n * xr.dtype.itemsize
        self._grid = None
        self.config = None
        if xr.rows == 0 or xr.n == 0:
            self.kernel = None
            return
        item = xr.dtype.itemsize
        consumers = 32 * warps
        box_c, kc = box_cols(xr.n, item)
        budget = smem_budget(op, ctas_per_sm, 2 * stages * 8)
        if mode not in ("auto", "rows", "chunked"):
            raise TensorMapError(f"{op}: mode must be 'auto', 'rows' or 'chunked', got {mode!r}")
        if threads_per_row is None:
            tpr = min(32, next_pow2(box_c)) if kc == 1 else 32
        else:
            tpr = threads_per_row
        check_tpr(op, tpr, consumers)
        if tpr > 32:
            raise TensorMapError(f"{op}: threads_per_row must be at most 32 for RowSum, got {tpr}")
        rows_plan = plan_rows(xr.rows, xr.n, item, warps=warps, tpr=tpr, stage_bytes=stage_bytes,
                              rows_per_stage=rows_per_stage, budget=budget, stages=stages, op=op)
        use_rows = mode == "rows" or (
            mode == "auto" and rows_plan.stages >= min(2, stages)
            and rows_plan.rows_per_stage * kc * box_c * item <= 2 * stage_bytes
        )
        if use_rows:
            plan = rows_plan
            if plan.stages < 1:
                raise TensorMapError(
                    f"{op}: a stage of {plan.rows_per_stage} rows of {xr.n} elements needs "
                    f"{plan.stage_bytes} bytes of shared memory; at most {budget} are available per CTA. "
                    f"Use mode='chunked' or fewer rows_per_stage."
                )
        else:  # one warp per row
            plan = plan_chunked(xr.n, item, warps=warps, tpr=32, stage_bytes=stage_bytes,
                                chunk_boxes=chunk_boxes, budget=budget, stages=stages, op=op)
            if plan.stages < 1:
                raise TensorMapError(
                    f"{op}: a chunk of {plan.rows_per_stage} rows x {plan.col_boxes} boxes of "
                    f"{plan.box_cols} elements needs {plan.stage_bytes} bytes of shared memory; at most "
                    f"{budget} are available per CTA. Use a smaller chunk_boxes or fewer ctas_per_sm."
                )
        chunked = not use_rows
        self.config = plan.config("chunked" if chunked else "rows", warps, xr.rows, ctas_per_sm)
        c = self.config
        self.x_map = TensorMap(xr.view, (c.box_rows, c.box_cols), l2_promotion=l2_promotion)
        self.kernel = _row_sum_kernel(
            xr.dtype.name, self.x_map.numba_type.dtype, warps, c.stages, c.threads_per_row, c.box_rows,
            c.box_cols, c.row_boxes, c.col_boxes, c.slot, chunked, bool(fastmath),
        )
        self.block = 32 * (warps + 1)

    writes = ("out",)  # (out is one sum per row: it cannot be x, and must not overlap it)

    @property
    def args(self):
        """The kernel's arguments: ``(x_map, out_view, rows, row_blocks, total_col_boxes)``."""
        c = self.config
        return (self.x_map, self.out_view, self.rows, c.row_blocks, c.total_col_boxes)

    @property
    def output(self):
        return self.out

    def argtypes(self):
        """Kernel argument types (for offline compilation with :func:`numbatma.compile.compile_ptx`)."""
        from numba.cuda import types

        layout = "C" if self._out_stride == self.dtype.itemsize else "A"
        out_t = types.Array(self.x_map.numba_type.dtype, 1, layout)
        return (self.x_map, out_t, types.int64, types.int64, types.int64)

    def launch(self, stream=None):
        """Launch on ``stream`` (asynchronously) and return ``out``; ``n == 0`` fills ``out`` with zeros."""
        if self.rows and self.kernel is None:  # n == 0: every sum is 0
            with self.on_device():
                _fill_zero_kernel()[ceil_div(self.rows, 256), 256, numba_stream(self.stream_for(stream))](
                    launch_argument(self.out_view))
            return self.out
        if self.rows == 0:
            return self.out
        return super().launch(stream)


def row_sum(x, out, **options):
    """``out[...] = x.sum(axis=-1)`` with :class:`RowSum` (options as there, plus ``stream``); returns ``out``."""
    return run(RowSum, x, out, **options)
