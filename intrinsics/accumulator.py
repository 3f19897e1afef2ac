"""Element-wise maps and row reductions over wgmma accumulators, in registers: the softmax of attention, masks,
per-row rescaling - any arithmetic on the fragment a thread holds, written as a plain device function.

A float32 m64nN accumulator (``wgmma_zeros(N)``) gives thread ``t`` of the warpgroup (warp ``w = t // 32``,
lane ``l``, ``g = l // 4``, ``q = l % 4``) two rows of the tile: row ``16 w + g`` (its *row half* 0) and row
``16 w + g + 8`` (row half 1), ``N / 4`` columns each; register ``i`` is row half ``(i // 2) % 2``, column
``8 (i // 4) + 2 q + i % 2`` (:func:`numbatma.intrinsics.wgmma_row_col`). The four threads of a quad
(``q = 0..3``) hold the whole of their two rows.

* ``wgmma_map(acc, fn, extra)``: a new accumulator whose register ``i`` is ``fn(acc[i], half, col, extra)`` -
  ``half`` the register's row half (a constant after inlining: ``m0 if half == 0 else m1`` costs nothing),
  ``col`` its column in the tile, ``extra`` whatever the kernel passes (a number, a tuple). ``fn`` is a
  ``cuda.jit(device=True)`` function (inlined: no call); its result is converted to float32.
* ``wgmma_map2(a, b, fn, extra)``: the same over two accumulators of one shape (register ``i`` from
  ``fn(a[i], b[i], half, col, extra)``): an element-wise product or difference of two tiles - attention
  backward's ``dS = P (dP - delta)``.
* ``wgmma_row_reduce(acc, fn, init)``: ``(row_half_0, row_half_1)``: ``fn`` folded over the thread's registers
  of each row half starting from ``init``, then over the quad (two ``shfl.sync.bfly`` steps), so every thread
  gets the reduction over its whole rows of the tile. ``fn(a, b)`` must be associative and commutative
  (``max``, ``+``): :func:`row_max`, :func:`row_min` and :func:`row_sum` are the usual ones.

Online softmax in a few lines (``scale_log2 = scale * log2(e)``)::

    @cuda.jit(device=True, inline="always")
    def exp2_shifted(s, half, col, st):          # st = (scale_log2, m0, m1)
        return exp2(s * st[0] - (st[1] if half == 0 else st[2]))

    r0, r1 = wgmma_row_reduce(s_acc, row_max, -inf)
    m0, m1 = max(m0, r0 * scale_log2), max(m1, r1 * scale_log2)
    p = wgmma_map(s_acc, exp2_shifted, (scale_log2, m0, m1))

What the caller guarantees: the accumulator has been returned by the wait that covers its wgmma (the
simulator reports a read before it); every thread of the warp calls ``wgmma_row_reduce`` together (its
shuffles are ``.sync`` with a full mask); 1-D blocks (the lane is ``%laneid``). Emits only the arithmetic
``fn`` compiles to, plus a butterfly warp shuffle (``shfl.sync.bfly``; reduce) and a read of ``%laneid`` (map),
on every target (their PTX: the end of ``help(wgmma_row_reduce)`` / ``help(wgmma_map)``).

Under the CUDA simulator both run ``fn`` in Python on the thread's registers (float32 results) and exchange
the quad's values through the simulator's warp shuffle.
"""
from __future__ import annotations

import types as _pytypes

import numpy as np

from numba import cuda

from ._asm import Ptx
from ._define import SIMULATING, device_op, fail, sim
from .wgmma import wgmma_row_col  # (the layout the docstring describes; the simulator's column of a register)

__all__ = ["wgmma_map", "wgmma_map2", "wgmma_row_reduce", "row_max", "row_min", "row_sum"]

_LANE = Ptx("mov.u32 $lane, %laneid;", out=("lane", "b32"), memory=False, min_sm=20)
_SHFL_BFLY = Ptx("shfl.sync.bfly.b32 $out, $value, $lanemask, 0x1f, 0xffffffff;", ins=(("value", "b32"),),
                 imm=("lanemask",), out=("out", "b32"), memory=False, min_sm=70)

PTX = {"wgmma_map": _LANE, "wgmma_map2": _LANE, "wgmma_row_reduce": _SHFL_BFLY}


def _half(i):
    """Row half (0: row g, 1: row g + 8) of register ``i`` of a float32 accumulator."""
    return (i // 2) % 2


if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types

    from .wgmma import require_f32_accumulator

    I32 = ir.IntType(32)
    F32 = ir.FloatType()

    def _resolve(op, typingctx, fn, argtypes, what):
        """The signature of the device function ``fn`` for ``argtypes`` (a typing error naming ``what``)."""
        if not isinstance(fn, (types.Dispatcher, types.Function)):
            fail(op, f"fn must be a cuda.jit(device=True) function {what}, got {fn}")
        try:
            sig = typingctx.resolve_function_type(fn, argtypes, {})
        except Exception as exc:  # noqa: BLE001 - the device function's own typing error, summarised
            fail(op, f"fn {what} does not compile for arguments {argtypes}: {str(exc).splitlines()[0]}")
        if sig is None:
            fail(op, f"fn {what} cannot be called with arguments {argtypes}")
        if not isinstance(sig.return_type, (types.Float, types.Integer, types.Boolean)):
            fail(op, f"fn {what} must return a number, returns {sig.return_type}")
        return sig

    def _call(context, builder, fn, sig, args):
        impl = context.get_function(fn, sig)
        return context.cast(builder, impl(builder, args), sig.return_type, types.float32)

    def _map_registers(context, builder, fn, sig_fn, count, accs, extra):
        """wgmma_map's and wgmma_map2's loop: register ``i`` of a new accumulator (the first's type) is
        ``fn(accs[0][i], ..., half, col, extra)``, the column from ``%laneid``."""
        lane = _LANE.emit(builder)
        base = builder.shl(builder.and_(lane, ir.Constant(I32, 3)), ir.Constant(I32, 1))  # 2 q
        out = accs[0]
        for i in range(count):
            col = builder.add(base, ir.Constant(I32, 8 * (i // 4) + i % 2))
            values = tuple(builder.extract_value(x, i) for x in accs)
            value = _call(context, builder, fn, sig_fn, values + (ir.Constant(I32, _half(i)), col, extra))
            out = builder.insert_value(out, value, i)
        return out


@device_op(simulate=lambda acc, fn, extra: _sim_map(acc, fn, extra))
def wgmma_map(typingctx, acc, fn, extra):
    """A new float32 accumulator: register ``i`` becomes ``fn(acc[i], half, col, extra)`` (see the module
    docstring: ``half`` is the register's row half, 0 or 1, ``col`` its column in the m64nN tile). ``fn`` is a
    ``cuda.jit(device=True)`` function, inlined per register. Call after the covering wait; fence
    (``wgmma_fence``) before a wgmma accumulates into the result."""
    op = "wgmma_map"
    require_f32_accumulator(op, acc)
    sig_fn = _resolve(op, typingctx, fn, (types.float32, types.int32, types.int32, extra),
                      "taking (value, half, col, extra)")

    def codegen(context, builder, sig, args):
        return _map_registers(context, builder, fn, sig_fn, acc.count, args[:1], args[2])

    return acc(acc, fn, extra), codegen


@device_op(simulate=lambda a, b, fn, extra: _sim_map2(a, b, fn, extra))
def wgmma_map2(typingctx, a, b, fn, extra):
    """A new float32 accumulator: register ``i`` becomes ``fn(a[i], b[i], half, col, extra)`` - :func:`wgmma_map`
    over two float32 accumulators of the same shape (m64nN), register by register. Call after the waits that
    cover both."""
    op = "wgmma_map2"
    require_f32_accumulator(op, a)
    require_f32_accumulator(op, b)
    if a != b:
        fail(op, f"a and b must be accumulators of one shape, got {a} and {b}")
    sig_fn = _resolve(op, typingctx, fn, (types.float32, types.float32, types.int32, types.int32, extra),
                      "taking (a, b, half, col, extra)")

    def codegen(context, builder, sig, args):
        return _map_registers(context, builder, fn, sig_fn, a.count, args[:2], args[3])

    return a(a, b, fn, extra), codegen


@device_op(simulate=lambda acc, fn, init: _sim_row_reduce(acc, fn, init))
def wgmma_row_reduce(typingctx, acc, fn, init):
    """``(r0, r1)``, float32: ``fn`` folded from ``init`` over the thread's registers of row half 0 and of row
    half 1, then across the four threads of the quad (``shfl.sync.bfly.b32`` with lane masks 1 and 2), so that
    every thread holds the reduction over its two whole rows of the m64nN tile. ``fn(a, b)``: a
    ``cuda.jit(device=True)`` function, associative and commutative. All 32 lanes of the warp call it together."""
    op = "wgmma_row_reduce"
    require_f32_accumulator(op, acc)
    if not isinstance(init, (types.Float, types.Integer)):
        fail(op, f"init must be a number, got {init}")
    sig_fn = _resolve(op, typingctx, fn, (types.float32, types.float32), "taking (a, b)")
    result = types.UniTuple(types.float32, 2)

    def codegen(context, builder, sig, args):
        start = context.cast(builder, args[2], sig.args[2], types.float32)
        rows = [start, start]
        for i in range(acc.count):
            h = _half(i)
            rows[h] = _call(context, builder, fn, sig_fn, (rows[h], builder.extract_value(args[0], i)))
        for mask in (1, 2):
            for h in (0, 1):
                other = _SHFL_BFLY.emit(builder, value=builder.bitcast(rows[h], I32), lanemask=mask)
                rows[h] = _call(context, builder, fn, sig_fn, (rows[h], builder.bitcast(other, F32)))
        return context.make_tuple(builder, result, rows)

    return result(acc, fn, init), codegen


# -- simulator semantics ---------------------------------------------------------------------------------------
def _sim_accumulator(op, acc):
    from .wgmma import SimAccumulator

    if not isinstance(acc, SimAccumulator) or acc.dtype != "f32":
        raise sim().SimulatedMisuse(f"{op}: expected a float32 wgmma accumulator (from wgmma_zeros)")
    acc._ready(f"{op} reads")


def _sim_device_function(op, fn):
    """The GPU refuses a plain Python function where a device function goes (numba cannot type it: hook 9 of
    numbatma/_numba_internals.py); the simulator says the same at the kernel's line."""
    if isinstance(fn, _pytypes.FunctionType):
        s = sim()
        site = s.caller_site()
        raise s.SimulatedTypingError(
            f"{site[0]}:{site[1]}: {op}: '{fn.__name__}' is a plain Python function, which a kernel can neither call "
            f"nor pass on (to wgmma_map, wgmma_row_reduce, ...): make it a device function with "
            f"@cuda.jit(device=True) (inline=\"always\" for a small one)")


def _sim_map(acc, fn, extra):
    _sim_device_function("wgmma_map", fn)
    _sim_accumulator("wgmma_map", acc)
    return _sim_map_registers(fn, (acc,), extra)


def _sim_map2(a, b, fn, extra):
    _sim_device_function("wgmma_map2", fn)
    _sim_accumulator("wgmma_map2", a)
    _sim_accumulator("wgmma_map2", b)
    if a.values.shape != b.values.shape:
        raise sim().SimulatedMisuse(f"wgmma_map2: a and b must be accumulators of one shape, got m64n{a.n} and "
                                    f"m64n{b.n}")
    return _sim_map_registers(fn, (a, b), extra)


def _sim_map_registers(fn, accs, extra):
    """The simulator's side of :func:`_map_registers`: ``fn`` on this thread's registers, float32 results."""
    thread = sim().thread_index() % 128
    values = accs[0].values.copy()
    for i in range(values.size):
        values[i] = np.float32(fn(*(np.float32(x.values[i]) for x in accs), _half(i), wgmma_row_col(i, thread)[1],
                                  extra))
    return accs[0].copy(values=values, fenced=False)


def _sim_row_reduce(acc, fn, init):
    _sim_device_function("wgmma_row_reduce", fn)
    s = sim()
    _sim_accumulator("wgmma_row_reduce", acc)
    rows = [np.float32(init), np.float32(init)]
    for i in range(acc.values.size):
        h = _half(i)
        rows[h] = np.float32(fn(rows[h], np.float32(acc.values[i])))
    for mask in (1, 2):
        for h in (0, 1):
            rows[h] = np.float32(fn(rows[h], np.float32(s.shfl_xor(0xFFFFFFFF, rows[h], mask))))
    return rows[0], rows[1]


# -- the usual reductions (``fn`` of wgmma_row_reduce; plain device functions, inlined: no PTX of their own) ------
@cuda.jit(device=True, inline="always")
def row_max(a, b):
    """``max(a, b)``: ``wgmma_row_reduce(acc, row_max, -inf)`` gives the rows' maxima (one ``max.f32`` a register)."""
    return max(a, b)


@cuda.jit(device=True, inline="always")
def row_min(a, b):
    """``min(a, b)``: ``wgmma_row_reduce(acc, row_min, inf)`` gives the rows' minima."""
    return min(a, b)


@cuda.jit(device=True, inline="always")
def row_sum(a, b):
    """``a + b``: ``wgmma_row_reduce(acc, row_sum, 0)`` gives the rows' sums."""
    return a + b
