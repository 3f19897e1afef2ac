"""Device code of the GPU debug mode (``numbatma/debug.py``, ``NUMBATMA_DEBUG=1``): bounded waits and cheap
runtime checks that print what went wrong (device ``printf``) and ``trap;``.

Only called from codegen when :func:`enabled`; a normal build never reaches this module's emitters, so its
PTX is unchanged. Names and lines in the messages come from the statement being lowered
(``numbatma._numba_internals.lowering_site``): the kernel file:line of the call and how the kernel spells
its operands.
"""
from __future__ import annotations

import os

from llvmlite import ir

from numbatma import debug as _config
from numbatma._shapes import tile_alignment

from ._asm import Ptx

I8P = ir.IntType(8).as_pointer()
I32 = ir.IntType(32)
I64 = ir.IntType(64)


def enabled():
    return _config.ENABLED


def timeout_ns():
    return _config.timeout_ns()


def _bounded(label, try_wait, ins):
    """A ``try_wait`` loop (``try_wait`` sets predicate ``p``) that gives up after ``$timeout`` ns of
    ``%globaltimer``; ``$expired`` is 1 if it gave up, 0 if the phase completed."""
    return Ptx(
        "{ .reg .pred p; .reg .b64 t0, t1; mov.u64 t0, %globaltimer; "
        f"NBTMA_DBG_{label}: {try_wait} @p bra NBTMA_DBG_{label}_DONE; "
        "mov.u64 t1, %globaltimer; sub.u64 t1, t1, t0; setp.lt.u64 p, t1, $timeout; "
        f"@p bra NBTMA_DBG_{label}; NBTMA_DBG_{label}_DONE: selp.u32 $expired, 0, 1, p; }}",
        ins=ins,
        out=("expired", "b32"),
        imm=("timeout",),
    )


WAIT_PARITY = _bounded(
    "WAIT_PARITY", "mbarrier.try_wait.parity.shared::cta.b64 p, [$bar], $parity;",
    (("bar", "b32"), ("parity", "b32")),
)
WAIT_TOKEN = _bounded(
    "WAIT_TOKEN", "mbarrier.try_wait.shared::cta.b64 p, [$bar], $state;", (("bar", "b32"), ("state", "b64")),
)
WAIT_PARITY_CLUSTER = _bounded(
    "WAIT_PARITY_CLUSTER", "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [$bar], $parity;",
    (("bar", "b32"), ("parity", "b32")),
)
TRAP = Ptx("trap;")

PTX = {
    "debug mbarrier_wait_parity": WAIT_PARITY,
    "debug mbarrier_wait": WAIT_TOKEN,
    "debug mbarrier_wait_parity_cluster": WAIT_PARITY_CLUSTER,
    "debug trap": TRAP,
}


# -- where: the call being lowered ----------------------------------------------------------------------
def site():
    """The call being lowered (``numbatma._numba_internals.lowering_site``) or None."""
    from numbatma._numba_internals import lowering_site

    return lowering_site()


def _esc(text):
    return str(text).replace("%", "%%")


def where(at=None):
    """``kernel.py:17 (in copy_kernel)`` for the call being lowered, printf-escaped."""
    at = at if at is not None else site()
    if at is None:
        return "<unknown location>"
    return _esc(f"{os.path.basename(at.filename)}:{at.line} (in {at.function})")


def operand(at, index, fallback):
    """How the kernel spells argument ``index`` of the call being lowered (printf-escaped), or ``fallback``."""
    if at is not None and index < len(at.args) and at.args[index]:
        return _esc(at.args[index])
    return _esc(fallback)


# -- printf + trap ----------------------------------------------------------------------------------------
def _sreg(builder, name):
    from numba.cuda import cgutils

    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I32, ()), f"llvm.nvvm.read.ptx.sreg.{name}")
    return builder.call(fn, ())


def report_and_trap(context, builder, fmt, values):
    """Device ``printf("numbatma debug: " + fmt + "; block (x, y, z) thread (x, y, z)\\n", *values)`` then
    ``trap;``. ``values`` are LLVM i32 (``%d``/``%u``/``%x``), i64 (``%lld``/``%llx``) or i8* (``%s``) values."""
    from numba.cuda import cgutils

    from numbatma._numba_internals import declare_vprintf, string_constant

    values = list(values) + [_sreg(builder, f"{r}.{a}") for r in ("ctaid", "tid") for a in "xyz"]
    text = "numbatma debug: " + fmt + "; block (%u, %u, %u) thread (%u, %u, %u)\n"
    fmt_ptr = string_constant(context, builder, text)
    struct = ir.LiteralStructType([v.type for v in values])
    buf = cgutils.alloca_once(builder, struct, name="numbatma_debug_printf_args")
    for i, v in enumerate(values):
        builder.store(v, builder.gep(buf, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
    builder.call(declare_vprintf(builder.module), [fmt_ptr, builder.bitcast(buf, I8P)])
    TRAP.emit(builder)


def fail_if(context, builder, cond, fmt, values_fn):
    """If ``cond`` (an i1) holds: report (``values_fn()`` builds the printf values inside the failing branch)
    and trap."""
    from numba.cuda import cgutils

    with cgutils.if_unlikely(builder, cond):
        report_and_trap(context, builder, fmt, values_fn())


# -- bounded waits ------------------------------------------------------------------------------------------
def _ms():
    return _config.TIMEOUT_MS


def wait_parity(context, builder, op, bar, parity, cluster=False):
    """``op`` (mbarrier_wait_parity / mbarrier_wait_parity_cluster) with a timeout; ``bar`` and ``parity``
    are i32 values."""
    at = site()
    ptx = WAIT_PARITY_CLUSTER if cluster else WAIT_PARITY
    expired = ptx.emit(builder, bar=bar, parity=parity, timeout=timeout_ns())
    fmt = (f"{op} timed out after {_ms()} ms at {where(at)}: barrier `{operand(at, 0, 'bar')}` (shared address "
           f"0x%x) did not complete its phase of parity %u (parity `{operand(at, 1, 'parity')}`) - fewer "
           f"arrivals or transaction bytes than it expects reached it (an arrive or a copy missing, an "
           f"expect_tx larger than the bytes delivered, or a wait for a phase nobody completes)")
    fail_if(context, builder, builder.icmp_unsigned("!=", expired, ir.Constant(I32, 0)), fmt,
            lambda: [bar, parity])


def wait_token(context, builder, op, bar, state):
    """``mbarrier_wait`` (a state token) with a timeout; ``bar`` i32, ``state`` i64."""
    at = site()
    expired = WAIT_TOKEN.emit(builder, bar=bar, state=state, timeout=timeout_ns())
    fmt = (f"{op} timed out after {_ms()} ms at {where(at)}: barrier `{operand(at, 0, 'bar')}` (shared address "
           f"0x%x) did not complete the phase of state token `{operand(at, 1, 'state')}` = 0x%llx - fewer "
           f"arrivals or transaction bytes than it expects reached it")
    fail_if(context, builder, builder.icmp_unsigned("!=", expired, ir.Constant(I32, 0)), fmt,
            lambda: [bar, state])


def pipeline_wait(context, builder, method, kind, stage, bar, parity, origin):
    """A Pipeline wait (``producer_acquire`` on an empty barrier, ``consumer_wait`` on a full one) with a
    timeout; ``origin`` is an i8* to the text naming the pipeline and where it was created."""
    expired = WAIT_PARITY.emit(builder, bar=bar, parity=parity, timeout=timeout_ns())
    why = ("the producer did not commit that stage (producer_commit missing) or its loads delivered fewer "
           "bytes than they announced" if kind == "full" else
           "the consumers did not release that stage (consumer_release missing, or fewer releasing threads "
           "than the pipeline's consumer_arrivals)")
    fmt = (f"Pipeline.{method}() timed out after {_ms()} ms: the {kind} barrier of stage %d (shared address "
           f"0x%x, phase parity %u) of %s never completed - {why}")
    fail_if(context, builder, builder.icmp_unsigned("!=", expired, ir.Constant(I32, 0)), fmt,
            lambda: [stage, bar, parity, origin])


def pipeline_origin(context, builder):
    """An i8* to "pipeline `pipe` created at kernel.py:23 (in kern)" for the Pipeline(...) call being lowered."""
    from numbatma._numba_internals import string_constant

    at = site()
    name = f"`{at.target}`" if at is not None and at.target else "(unnamed)"
    place = f"{os.path.basename(at.filename)}:{at.line} (in {at.function})" if at is not None else "<unknown>"
    return string_constant(context, builder, f"the Pipeline {name} created at {place}")


# -- TMA checks ------------------------------------------------------------------------------------------


def check_tma(context, builder, op, desc, coords, tile=None, load=False, coords_index=None, tile_index=None):
    """Runtime checks before a TMA tile operation: every coordinate within 32 bits; for a load, the innermost
    start coordinate a whole number of 16 bytes; the shared tile (i32 address ``tile``) aligned.

    ``coords`` is ``[(numba type, LLVM value)]`` in array order; ``*_index`` are the call's argument
    positions (for naming the kernel's operands)."""
    from numba.cuda import types

    at = site()
    place = where(at)
    names = operand(at, coords_index, "coords") if coords_index is not None else "coords"
    rank = len(coords)
    as_i64 = [context.cast(builder, v, t, types.int64) if not (t.signed is False and t.bitwidth == 64)
              else v for t, v in coords]
    coord_fmt = "(" + ", ".join(["%lld"] * rank) + ")"
    for i, (t, v) in enumerate(coords):
        if t.bitwidth < 32 or (t.bitwidth == 32 and t.signed):
            continue
        if t.signed:
            value = as_i64[i]
            low = builder.icmp_signed("<", value, ir.Constant(I64, -(1 << 31)))
            high = builder.icmp_signed(">", value, ir.Constant(I64, (1 << 31) - 1))
            bad = builder.or_(low, high)
        else:  # an unsigned coordinate above 2**31 - 1 would wrap to a negative int32
            wide = context.cast(builder, v, t, types.uint64)
            bad = builder.icmp_unsigned(">", wide, ir.Constant(I64, (1 << 31) - 1))
        fmt = (f"{op} at {place}: coordinate {i} of {names} = {coord_fmt} does not fit in 32 bits (TMA "
               f"coordinates are int32; the value would be truncated)")
        fail_if(context, builder, bad, fmt, lambda: list(as_i64))
    itemsize = desc.itemsize
    if load and not desc.interleave and itemsize % 16:
        inner32 = builder.trunc(as_i64[-1], I32) if as_i64[-1].type != I32 else as_i64[-1]
        inner = builder.sext(inner32, I64)
        byte_offset = builder.mul(inner, ir.Constant(I64, itemsize))
        bad = builder.icmp_unsigned("!=", builder.and_(byte_offset, ir.Constant(I64, 15)), ir.Constant(I64, 0))
        fmt = (f"{op} at {place}: the innermost start coordinate of {names} = {coord_fmt} is %lld elements of "
               f"{itemsize} bytes = %lld bytes, not a multiple of 16 bytes; the GPU would stop the kernel with "
               f"an illegal-instruction error (CUDA_ERROR_ILLEGAL_INSTRUCTION) on this load. Start boxes at a "
               f"column that is a multiple of {16 // _gcd(16, itemsize)}")
        fail_if(context, builder, bad, fmt, lambda: list(as_i64) + [inner, byte_offset])
    if tile is not None:
        align = tile_alignment(desc)
        tile_name = operand(at, tile_index, "tile") if tile_index is not None else "tile"
        bad = builder.icmp_unsigned("!=", builder.and_(tile, ir.Constant(I32, align - 1)), ir.Constant(I32, 0))
        need = "128 bytes" if align == 128 else f"{align} bytes (the repeat of its {desc.swizzle}-byte swizzle)"
        fmt = (f"{op} at {place}: the shared tile `{tile_name}` is at shared address 0x%x, not a multiple of "
               f"{need}, which TMA needs for this descriptor (declare the buffer with alignment={align} and keep "
               f"view offsets multiples of {align} bytes)")
        fail_if(context, builder, bad, fmt, lambda: [tile])


def _gcd(a, b):
    import math

    return math.gcd(a, b)
