"""Warpgroup matrix multiply-accumulate on Hopper tensor cores: ``wgmma.mma_async`` (sm_90a only).

A *warpgroup* (4 consecutive warps whose first warp index is a multiple of 4: 128 threads) computes
``D = A @ B + D`` for a 64 x N tile of D (N = 8, 16, ..., 256). B, and usually A, are read from shared memory
through 64-bit *matrix descriptors*; A may also come from registers. The result stays in registers: each
thread holds a fragment of D, an **accumulator** value (``wgmma_zeros(N)``), N/2 float32 registers (f32
accumulators) or N/4 registers of two packed float16 (f16 accumulators).

::

    acc = wgmma_zeros(256)                                  # m64n256, float32: 128 registers per thread
    acc = wgmma_fence(acc)                                  # before the first wgmma that reads acc
    for kk in range(BK // 16):                              # (a constant trip count: unrolled)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", 64 * wg, 16 * kk),
                         wgmma_desc(b_tile, b_map, "K", 0, 16 * kk), 1)
    wgmma_commit_group()
    acc = wgmma_wait_group(0, acc)                          # the results are in acc from here on

Operand kinds (the element type of A and B): ``bf16`` and ``f16`` (K = 16 per instruction), ``tf32`` (K = 8;
float32 data), ``e4m3`` / ``e5m2`` (K = 32; float8 data, mixed pairs allowed). Accumulators are float32 for
every kind, or float16 for ``f16`` and the float8 kinds (``wgmma_zeros_f16(N)``).

**Matrix descriptors** come from ``wgmma_desc(tile, tmap, major, mn, k)``: ``tile`` is the shared tile that
the TensorMap ``tmap`` fills (one box: shape ``tmap.shared_shape``; boxes stacked along the rows, e.g. two
halves of a B tile that two CTAs of a cluster load; or boxes side by side: a 3-D tile ``(groups, rows,
row_elements)``), ``major`` says which axis is contiguous in shared memory:

* ``"K"``: the tile's rows run along M (or N), its contiguous elements along K - A given as (M, K) row-major,
  B given as (N, K) (i.e. Bᵀ row-major). Several boxes stack along K.
* ``"MN"``: the tile's rows run along K, its contiguous elements along M/N - B given as (K, N) row-major.
  Several boxes stack along N (``bf16``/``f16`` only: PTX transposes only 16-bit operands).

``mn`` and ``k`` (elements) select the operand's sub-matrix: the warpgroup's 64 rows of A, a k-step. The
swizzle mode, the leading/stride byte offsets and the k-step advance all follow from the compile-time facts of
the TensorMap type; a tile/descriptor combination wgmma cannot read is a typing error. The tile must start
on the swizzle repeat (``alignment=tmap.shared_alignment``: 1024 bytes for 128B swizzle).

**Ordering** (what the caller guarantees; PTX makes it undefined otherwise): all 128 threads of the warpgroup
execute every ``wgmma*`` call together with the same descriptors; ``wgmma_fence(acc)`` before the first
``wgmma`` that reads accumulators written by other instructions (zeros, scaling, a previous tile) and after
shared memory it reads was written by ordinary stores (plus ``fence_proxy_async_shared_cta``); the shared
memory stays unchanged until the ``wgmma_wait_group`` that covers the group; the accumulators are read only
after that wait. ``wgmma_fence`` / ``wgmma_wait_group`` take and return the accumulators through tied
operands, so the compiler cannot move a use of them across the fence or the wait.

**Float8** operands come from a TensorMap of a 1-byte array built with ``element="e4m3"`` or ``"e5m2"``
(uint8/int8 holding the bits, or a float8 array whose type implies it): TMA moves the bytes, the element is part
of the kernel type, and ``wgmma_desc`` reads the tile as float8 (K = 32 per instruction, K-major only).

**A from registers** (``wgmma(acc, a, b_desc, scale_d)`` with ``a`` four uint32 per thread): for bf16/f16 each
register holds two elements (low half: the lower column); thread ``t`` of the warpgroup (warp ``w = t // 32``,
``g = lane // 4``, ``q = lane % 4``) holds register ``j``: row ``16 w + g + 8 (j % 2)``, columns
``2 q + 8 (j // 2)`` and ``+1`` of the 64 x 16 A tile - the accumulator's own layout, so the columns
``16 k .. 16 k + 15`` of a float32 accumulator, packed, are A's k-step ``k`` (:func:`wgmma_a_fragments`: P @ V of
attention without shared memory). tf32: register ``j`` is row ``16 w + g + 8 (j % 2)``, column ``q + 4 (j // 2)``
of the 64 x 8 tile. The kind of a register A is B's kind (the registers carry no type): pass bf16 fragments
with a bf16 B. Fence (``wgmma_fence``) between writing A registers and the wgmma that reads them; the fence
also takes the fragments (``acc, frags = wgmma_fence((acc, frags))``) to pin them in order.

**Accumulator helpers** (all in registers, after the covering wait): ``acc[i]`` (register ``i``; which element:
:func:`wgmma_row_col`), :func:`wgmma_scale` (alpha), :func:`wgmma_add_bias` (a per-column bias vector),
:func:`wgmma_add_tile` (beta * C from a shared tile), :func:`wgmma_a_fragments` (bf16/f16 A fragments),
:func:`wgmma_store` (into a shared tile, swizzled, ready for a TMA store; ``stmatrix`` for 16-bit tiles) and
:func:`wgmma_store_global` (straight to a 2-D global array, bounds-checked per element: any M, N).

Under the CUDA simulator the same calls decode the descriptors, un-swizzle the tiles and multiply with NumPy
(float32 accumulation); A from registers is gathered from the 128 threads' fragments. Reading accumulators
before the covering wait, a wgmma on accumulators that were not fenced, register A fragments written after the
last fence, bf16 fragments fed with an f16 B (or the reverse), a tile that does not start on its swizzle repeat
and tiles still being filled by TMA are reported.

Targets: sm_90a only. Compiling a kernel that uses wgmma for sm_100a / sm_120a raises ``UnsupportedTarget``;
there, use ``mma_m16n8k16`` (:mod:`numbatma.intrinsics.mma`). (The accumulator helpers without wgmma compile
everywhere; ``stmatrix`` needs sm_90+.) See docs/tensor_cores.md.
"""
from __future__ import annotations

import functools

import numpy as np

from ._asm import Ptx
from ._define import SIMULATING, device_op, fail, require_int, require_literal_int, sim
from .wgmma_operands import FP8, KINDS, SimOperand, SimOperandRange, element_values, operand_matrix, \
    record_operand_read

__all__ = [
    "wgmma",
    "wgmma_commit_group",
    "wgmma_fence",
    "wgmma_row_col",
    "wgmma_scale",
    "wgmma_wait_group",
    "wgmma_zeros",
    "wgmma_zeros_f16",
]

NS = tuple(range(8, 257, 8))
ONLY_90A = ("sm_90a",)
INSTEAD = "use mma_m16n8k16 (numbatma.intrinsics.mma), which every target has"


def _combinations():
    """(A kind, B kind, accumulator type) triples PTX defines."""
    out = [("bf16", "bf16", "f32"), ("f16", "f16", "f32"), ("f16", "f16", "f16"), ("tf32", "tf32", "f32")]
    out += [(a, b, d) for a in FP8 for b in FP8 for d in ("f32", "f16")]
    return out


def accumulator_registers(n, dtype):
    """(registers per thread, PTX register class) of an m64nN accumulator of ``dtype`` ("f32" or "f16")."""
    return (n // 2, "f32") if dtype == "f32" else (n // 4, "b32")


def _mma_ptx(n, dtype, akind, bkind, a_source):
    k = KINDS[akind][0]
    count, reg = accumulator_registers(n, dtype)
    head = f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{dtype}.{akind}.{bkind}"
    if a_source == "smem":
        a_text, a_ins = "$a_desc", (("a_desc", "b64"),)
    else:
        a_text, a_ins = "$a", (("a", "b32", 4),)
    imm = ("scale_a", "scale_b")
    tail = "$scale_a, $scale_b"
    if akind in ("bf16", "f16"):  # PTX transposes 16-bit operands only, and A only from shared memory
        imm += ("trans_a", "trans_b") if a_source == "smem" else ("trans_b",)
        tail += ", $trans_a, $trans_b" if a_source == "smem" else ", $trans_b"
    text = ("{ .reg .pred p; setp.ne.b32 p, $scale_d, 0; "
            f"{head} $d, {a_text}, $b_desc, p, {tail}; }}")
    return Ptx(text, ins=a_ins + (("b_desc", "b64"), ("scale_d", "b32")), inout=("d", reg, count), imm=imm,
               targets=ONLY_90A, instead=INSTEAD)


# -- the PTX: one description per (N, accumulator, A kind, B kind, A source) ------------------------------------
MMA = {
    (n, d, a, b, src): _mma_ptx(n, d, a, b, src)
    for n in NS
    for a, b, d in _combinations()
    for src in ("smem", "reg")
}


@functools.lru_cache(maxsize=None)
def fence_ptx(reg, count):
    """``wgmma.fence`` carrying ``count`` accumulator registers of class ``reg`` (tied in and out)."""
    return Ptx("wgmma.fence.sync.aligned;", inout=("d", reg, count), targets=ONLY_90A, instead=INSTEAD)


@functools.lru_cache(maxsize=None)
def wait_ptx(reg, count):
    """``wgmma.wait_group N`` carrying ``count`` accumulator registers (tied in and out)."""
    return Ptx("wgmma.wait_group.sync.aligned $n;", imm=("n",), inout=("d", reg, count), targets=ONLY_90A,
               instead=INSTEAD)


COMMIT = Ptx("wgmma.commit_group.sync.aligned;", targets=ONLY_90A, instead=INSTEAD)
_ACC_SHAPES = sorted({accumulator_registers(n, d)[::-1] for n in NS for d in ("f32", "f16")})


# =============================================================================================================
# Numba types, typing and lowering (GPU)
# =============================================================================================================
if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.datamodel import models
    from numba.cuda.extending import infer, lower_builtin, register_model
    from numba.cuda.typing.templates import AbstractTemplate, signature

    from .wgmma_operands import WgmmaOperandRangeType, WgmmaOperandType

    I32, I64 = ir.IntType(32), ir.IntType(64)

    class WgmmaAccumulatorType(types.Type):
        """An m64nN accumulator fragment: ``count`` registers of one thread (float32, or uint32 holding two
        float16) as one SSA value."""

        def __init__(self, n, dtype):
            self.n, self.dtype = n, dtype
            self.count, self.reg = accumulator_registers(n, dtype)
            super().__init__(name=f"wgmma_accumulator(m64n{n}, {dtype})")

        @property
        def key(self):
            return (self.n, self.dtype)

        @property
        def element(self):
            return types.float32 if self.dtype == "f32" else types.uint32

        def llvm_type(self):
            return ir.ArrayType(ir.FloatType() if self.dtype == "f32" else I32, self.count)

    @register_model(WgmmaAccumulatorType)
    class _AccumulatorModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, fe_type.llvm_type())


    @infer
    class _AccumulatorStaticGetItem(AbstractTemplate):
        key = "static_getitem"

        def generic(self, args, kws):
            acc, index = args
            if isinstance(acc, WgmmaAccumulatorType) and isinstance(index, int):
                if not -acc.count <= index < acc.count:
                    fail("accumulator[i]", f"index {index} is out of range for {acc} ({acc.count} registers)")
                return signature(acc.element, acc, types.literal(index))

    @lower_builtin("static_getitem", WgmmaAccumulatorType, types.IntegerLiteral)
    def _lower_acc_getitem(context, builder, sig, args):
        return builder.extract_value(args[0], sig.args[1].literal_value % sig.args[0].count)

    def _as_array(builder, struct, ty):
        """The literal struct an asm statement returns -> the LLVM array value of the accumulator type ``ty``."""
        out = ir.Constant(ty.llvm_type(), None)
        for i in range(ty.count):
            out = builder.insert_value(out, builder.extract_value(struct, i), i)
        return out

    def _is_fragment(ty):
        """A register A fragment: four 32-bit integers (uint32 holding packed bf16/f16 pairs, or tf32 bits)."""
        return isinstance(ty, types.UniTuple) and ty.count == 4 and isinstance(ty.dtype, types.Integer) \
            and ty.dtype.bitwidth == 32

    def _register_classes(op, ty):
        """PTX register class of every register of ``ty`` - an accumulator, a register A fragment or a (nested)
        tuple of them - in order."""
        if isinstance(ty, WgmmaAccumulatorType):
            return [ty.reg] * ty.count
        if _is_fragment(ty):
            return ["b32"] * 4
        if isinstance(ty, types.BaseTuple) and len(ty):
            return [r for t in ty for r in _register_classes(op, t)]
        fail(op, f"expected a wgmma accumulator (from wgmma_zeros), a register A fragment (four uint32) or a tuple "
                 f"of them, got {ty}")

    def _accumulator_group(op, accs):
        """(register class, count) of the registers ``accs`` carries: one class, or "b32" for a mix (float32
        registers travel bit-cast)."""
        regs = _register_classes(op, accs)
        return (regs[0] if len(set(regs)) == 1 else "b32"), len(regs)

    def _registers(builder, accs, values):
        """Flat list of the registers of ``values`` (of type ``accs``: an accumulator, a fragment, a tuple)."""
        if isinstance(accs, types.Integer):
            return [values]
        if isinstance(accs, WgmmaAccumulatorType):
            return [builder.extract_value(values, i) for i in range(accs.count)]
        out = []
        for i, ty in enumerate(accs):
            out += _registers(builder, ty, builder.extract_value(values, i))
        return out

    def _rebuild(builder, accs, struct, old, start=0):
        """``old`` (of type ``accs``) with its registers replaced by registers ``start..`` of an asm result
        (bit-cast back where the asm carried float32 registers as b32). Returns (value, next start)."""
        if isinstance(accs, types.Integer):
            return bitcast_to(builder, builder.extract_value(struct, start), old.type), start + 1
        out = old
        if isinstance(accs, WgmmaAccumulatorType):
            for i in range(accs.count):
                reg = bitcast_to(builder, builder.extract_value(struct, start + i), old.type.element)
                out = builder.insert_value(out, reg, i)
            return out, start + accs.count
        for i, ty in enumerate(accs):
            item, start = _rebuild(builder, ty, struct, builder.extract_value(old, i), start)
            out = builder.insert_value(out, item, i)
        return out, start

    def bitcast_to(builder, value, ty):
        """``value`` as LLVM type ``ty`` (a bit-cast between float and i32 of the fence's register class)."""
        return value if value.type == ty else builder.bitcast(value, ty)


# -- accumulators ---------------------------------------------------------------------------------------------
def _zeros(op, n, dtype):
    value = require_literal_int(op, "N", n, 8, 256)
    if value % 8:
        fail(op, f"N must be a multiple of 8 in 8..256 (the wgmma shapes m64n8..m64n256), got {value}")
    ty = WgmmaAccumulatorType(value, dtype)

    def codegen(context, builder, sig, args):
        return ir.Constant(ty.llvm_type(), None)

    return ty(n), codegen


@device_op(prefer_literal=True, simulate=lambda n: _sim_zeros(n, "f32"))
def wgmma_zeros(typingctx, n):
    """A zero m64nN float32 accumulator (N a constant in 8..256, multiple of 8): N/2 float32 registers per
    thread, no instruction (a constant). ``acc[i]`` reads register ``i`` (a constant index) once the
    covering ``wgmma_wait_group`` has returned it; :func:`wgmma_row_col` says which element of D it is."""
    return _zeros("wgmma_zeros", n, "f32")


@device_op(prefer_literal=True, simulate=lambda n: _sim_zeros(n, "f16"))
def wgmma_zeros_f16(typingctx, n):
    """A zero m64nN float16 accumulator: N/4 registers per thread, each two float16 (low half: the even
    column). For ``f16`` and float8 operands."""
    return _zeros("wgmma_zeros_f16", n, "f16")


@device_op(prefer_literal=True, simulate=lambda acc, alpha: _sim_scale(acc, alpha))
def wgmma_scale(typingctx, acc, alpha):
    """Every float32 register of ``acc`` times ``alpha`` (FMULs, in registers). Call it after the wait that
    covers ``acc``; fence again (``wgmma_fence``) before a later wgmma accumulates into the result."""
    op = "wgmma_scale"
    if not isinstance(acc, WgmmaAccumulatorType) or acc.dtype != "f32":
        fail(op, f"expected a float32 wgmma accumulator, got {acc}")
    if not isinstance(alpha, (types.Float, types.Integer)):
        fail(op, f"alpha must be a number, got {alpha}")

    def codegen(context, builder, sig, args):
        a = context.cast(builder, args[1], sig.args[1], types.float32)
        out = args[0]
        for i in range(acc.count):
            out = builder.insert_value(out, builder.fmul(builder.extract_value(out, i), a), i)
        return out

    return acc(acc, alpha), codegen


def require_f32_accumulator(op, acc):
    if not isinstance(acc, WgmmaAccumulatorType) or acc.dtype != "f32":
        fail(op, f"expected a float32 wgmma accumulator (wgmma_zeros), got {acc}")


# -- the multiply-accumulate ------------------------------------------------------------------------------------
def _check_operands(op, acc, a, b):
    if not isinstance(acc, WgmmaAccumulatorType):
        fail(op, f"the accumulator must come from wgmma_zeros / wgmma_zeros_f16 (or a previous wgmma), got {acc}")
    if not isinstance(b, WgmmaOperandType):
        fail(op, f"B must be a shared-memory operand from wgmma_desc(tile, tmap, major, mn, k), got {b}")
    lb = b.layout
    if isinstance(a, WgmmaOperandType):
        la = a.layout
        a_source, akind = "smem", la.kind
    elif _is_fragment(a):
        la, a_source, akind = None, "reg", lb.kind if lb.kind not in FP8 else None
        if akind is None:
            fail(op, "A from registers with a float8 B: four uint32 registers do not say whether A is e4m3 or "
                     "e5m2, so numbatma reads float8 A from shared memory only (wgmma_desc)")
    else:
        fail(op, f"A must be a shared-memory operand (wgmma_desc) or a register fragment (a tuple of four "
                 f"uint32), got {a}")
    bkind = lb.kind
    if (akind in FP8) != (bkind in FP8) or (akind not in FP8 and akind != bkind):
        fail(op, f"A is {akind} but B is {bkind}; both must be the same kind (float8: e4m3/e5m2 in any pair)")
    if acc.dtype == "f16" and akind not in ("f16",) + FP8:
        fail(op, f"float16 accumulators take f16 or float8 operands, not {akind}; use wgmma_zeros(N)")
    kstep = KINDS[akind][0]
    if la is not None:
        if la.mn_extent - (a.mn or 0) < 64:
            fail(op, f"A ({la!r}{'' if a.mn is None else f', from row {a.mn}'}) has fewer than the 64 rows an "
                     f"m64 wgmma reads")
        if la.k_extent - (a.k or 0) < kstep:
            fail(op, f"A has fewer than {kstep} elements along K from k={a.k}")
    if lb.mn_extent - (b.mn or 0) < acc.n:
        fail(op, f"the accumulator is m64n{acc.n} but B ({lb!r}) has only {lb.mn_extent - (b.mn or 0)} columns "
                 f"along N{'' if b.mn is None else f' from {b.mn}'}")
    if lb.k_extent - (b.k or 0) < kstep:
        fail(op, f"B has fewer than {kstep} elements along K from k={b.k}")
    return a_source, akind, bkind, la, lb


@device_op(simulate=lambda acc, a, b, scale_d: _sim_mma(acc, a, b, scale_d))
def wgmma(typingctx, acc, a, b, scale_d):
    """``acc = A @ B + (acc if scale_d else 0)`` for the warpgroup's m64nN tile, issued asynchronously.

    Emits ``wgmma.mma_async`` m64nNkK of the accumulator's type (f32 or f16) and the A and B kinds - A from a
    descriptor or registers, B from a descriptor, scale-a and scale-b 1 (PTX below) - with
    ``p = (scale_d != 0)`` (a predicate set from the run-time value: pass 0 on the first k-step of a tile to
    overwrite instead of accumulating) and, for 16-bit kinds, the transposes (A's only from shared memory)
    from the operands' majors (MN-major = 1). ``acc`` is tied in and out; N comes from the accumulator's type,
    the kinds from the operands'. ``a``: a :func:`wgmma_desc` operand, or a register fragment (four uint32:
    8 bf16/f16 or 4 tf32 values per thread, the A fragment layout of the PTX ISA). ``b``: a :func:`wgmma_desc`
    operand with at least N columns. The returned accumulator must not be read before :func:`wgmma_wait_group`
    returns it.

    **Ranges**: with ``b`` a range of k-steps (``wgmma_desc(..., k=(k0, k1))``) and ``a`` a range of as many
    steps or a tuple of as many register fragments (``wgmma_a_fragments``), one call issues every step back to
    back - ``scale_d`` applies to the first, the others accumulate - with descriptors advanced by constants."""
    op = "wgmma"
    steps = _range_steps(op, a, b)
    if steps is None:
        a_source, akind, bkind, la, lb = _check_operands(op, acc, a, b)
    else:
        for i in range(steps):  # every step: the same instruction, each on its own k-slice
            a_i = a.step(i) if isinstance(a, WgmmaOperandRangeType) else a.dtype
            a_source, akind, bkind, la, lb = _check_operands(op, acc, a_i, b.step(i))
    if not isinstance(scale_d, types.Boolean):
        require_int(op, "scale_d", scale_d)
    ptx = MMA[(acc.n, acc.dtype, akind, bkind, a_source)]
    imm = {"scale_a": 1, "scale_b": 1}
    if akind in ("bf16", "f16"):
        imm["trans_b"] = int(lb.major == "MN")
        if a_source == "smem":
            imm["trans_a"] = int(la.major == "MN")

    def codegen(context, builder, sig, args):
        scale = context.cast(builder, args[3], sig.args[3], types.int32)
        d = args[0]
        for i in range(steps or 1):
            if steps is None:
                a_i, b_i = args[1], args[2]
            else:  # step i: the first step's descriptors advanced by constants; register A: fragment i
                b_i = builder.add(args[2], ir.Constant(I64, b.advance(i)))
                a_i = (builder.add(args[1], ir.Constant(I64, a.advance(i))) if a_source == "smem"
                       else builder.extract_value(args[1], i))
            operands = dict(d=d, b_desc=b_i, scale_d=scale if i == 0 else ir.Constant(I32, 1), **imm)
            operands["a_desc" if a_source == "smem" else "a"] = a_i
            d = _as_array(builder, ptx.emit(builder, **operands), acc)
        return d

    return acc(acc, a, b, scale_d), codegen


def _range_steps(op, a, b):
    """None for single operands; else the number of k-steps of a range call (B a ``k=(k0, k1)`` range; A a
    range of the same length or a tuple of as many register fragments)."""
    a_frags = isinstance(a, types.UniTuple) and _is_fragment(a.dtype)
    if not isinstance(b, WgmmaOperandRangeType):
        if isinstance(a, WgmmaOperandRangeType) or a_frags:
            fail(op, f"A covers several k-steps ({a}) but B is a single k-step ({b}): give B as a range too "
                     f"(wgmma_desc(..., k=(k0, k1)))")
        return None
    if isinstance(a, WgmmaOperandRangeType):
        count = a.count
    elif a_frags:
        count = a.count
    else:
        fail(op, f"B covers {b.count} k-steps ({b}); A must be a range of as many (wgmma_desc(..., k=(k0, k1))) or a "
                 f"tuple of {b.count} register fragments (wgmma_a_fragments), got {a}")
    if count != b.count:
        fail(op, f"A covers {count} k-steps but B {b.count}: one wgmma call multiplies matching k-slices")
    return count


@device_op(simulate=lambda acc: _sim_fence(acc))
def wgmma_fence(typingctx, acc):
    """``wgmma.fence.sync.aligned;`` with ``acc`` tied through it: returns ``acc``. ``acc``: an accumulator, a
    register A fragment (four uint32), or a (nested) tuple of them - e.g. ``acc, frags = wgmma_fence((acc,
    frags))``. Required before the first wgmma of a sequence that reads accumulators written otherwise
    (``wgmma_zeros``, ``wgmma_scale``, a finished tile), between writing register A fragments and the wgmma
    that reads them, and between ordinary writes to shared memory it reads (with
    ``fence_proxy_async_shared_cta``) and the wgmma. The instruction orders every register of the warpgroup;
    the tied values keep the compiler from moving their writes across it."""
    reg, count = _accumulator_group("wgmma_fence", acc)
    ptx = fence_ptx(reg, count)

    def codegen(context, builder, sig, args):
        return _rebuild(builder, acc, ptx.emit(builder, d=_registers(builder, acc, args[0])), args[0])[0]

    return acc(acc), codegen


@device_op(simulate=lambda: _sim_commit())
def wgmma_commit_group(typingctx):
    """``wgmma.commit_group.sync.aligned;`` - the wgmma operations this warpgroup issued since the last commit
    form one group (waited for with :func:`wgmma_wait_group`)."""

    def codegen(context, builder, sig, args):
        COMMIT.emit(builder)
        return context.get_dummy_value()

    return types.void(), codegen


@device_op(prefer_literal=True, simulate=lambda n, acc: _sim_wait(n, acc))
def wgmma_wait_group(typingctx, n, acc):
    """``wgmma.wait_group.sync.aligned N;`` with ``acc`` tied through (returned): waits until at most ``N``
    (a constant 0..7) of this warpgroup's committed groups are pending. Read accumulators only from the
    value returned by the wait that covers the wgmma that wrote them. ``acc`` may also hold register A fragments
    (as :func:`wgmma_fence` takes them): tied through the wait, their registers stay untouched until the wgmma
    reading them has completed."""
    value = require_literal_int("wgmma_wait_group", "N", n, 0, 7)
    reg, count = _accumulator_group("wgmma_wait_group", acc)
    ptx = wait_ptx(reg, count)

    def codegen(context, builder, sig, args):
        return _rebuild(builder, acc, ptx.emit(builder, d=_registers(builder, acc, args[1]), n=value), args[1])[0]

    return acc(n, acc), codegen


# -- the fragment layout and the epilogue ------------------------------------------------------------------------
def wgmma_row_col(i, thread):
    """(row, column) in the m64nN tile of register ``i`` of a float32 accumulator held by ``thread`` (the
    thread's index in its warpgroup, 0..127). Warp ``w = thread // 32`` holds rows ``16 w .. 16 w + 15``;
    lane ``l``: row ``16 w + l // 4 + 8 * ((i // 2) % 2)``, column ``8 * (i // 4) + 2 * (l % 4) + i % 2``.
    (For float16 accumulators register ``i`` holds columns ``c, c + 1`` of that row for ``i' = 2 i``.)
    A plain function: use it in kernels (it inlines to integer arithmetic) and in host code."""
    w = thread // 32
    lane = thread % 32
    return 16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


if not SIMULATING:
    from numba.cuda.extending import register_jitable

    register_jitable(inline="always")(wgmma_row_col)  # callable in kernels; the name stays the plain function

PTX = {
    **{f"wgmma(m64n{n}, {d}, {a}x{b}, A from {src})": p for (n, d, a, b, src), p in MMA.items()},
    **{f"wgmma_fence({count} {reg})": fence_ptx(reg, count) for reg, count in _ACC_SHAPES},
    **{f"wgmma_wait_group({count} {reg})": wait_ptx(reg, count) for reg, count in _ACC_SHAPES},
    "wgmma_commit_group": COMMIT,
}


# =============================================================================================================
# Simulator semantics (NUMBA_ENABLE_CUDASIM=1): the accumulators, the multiply with NumPy, fences and groups
# =============================================================================================================
class SimAccumulator:
    """A thread's accumulator under the simulator: its registers (float32; or uint32 pairs of float16), and
    what the GPU's ordering rules say about them: ``fenced`` (no other write since the last wgmma_fence /
    wgmma), ``group`` (the wgmma group that last wrote it; None when no wgmma is pending) and ``site``."""

    def __init__(self, n, dtype, values, fenced, group=None, site=None):
        self.n, self.dtype, self.values = n, dtype, values
        self.fenced, self.group, self.site = fenced, group, site

    def copy(self, **changes):
        out = SimAccumulator(self.n, self.dtype, self.values, self.fenced, self.group, self.site)
        out.__dict__.update(changes)
        return out

    def _ready(self, what):
        if self.group is not None:
            raise sim().SimulatedMisuse(
                f"{what} an accumulator that the wgmma at {self.site[0]}:{self.site[1]} is still writing: read it "
                f"only from the value returned by the wgmma_wait_group that covers that wgmma's commit group")

    def __getitem__(self, i):
        self._ready(f"accumulator[{i}] reads")
        return self.values[int(i)]

    def __len__(self):
        return len(self.values)


def sim_thread():
    """(thread object, index of the thread in its warpgroup)."""
    s = sim()
    return s.current_thread(), s.thread_index() % 128


def _sim_zeros(n, dtype):
    n = int(n)
    if not 8 <= n <= 256 or n % 8:
        raise sim().SimulatedMisuse(f"wgmma_zeros: N must be a multiple of 8 in 8..256, got {n}")
    count, _ = accumulator_registers(n, dtype)
    values = np.zeros(count, np.float32 if dtype == "f32" else np.uint32)
    return SimAccumulator(n, dtype, values, fenced=False)


def _sim_scale(acc, alpha):
    if not isinstance(acc, SimAccumulator) or acc.dtype != "f32":
        raise sim().SimulatedMisuse("wgmma_scale: expected a float32 wgmma accumulator")
    acc._ready("wgmma_scale reads")
    return acc.copy(values=(acc.values * np.float32(alpha)).astype(np.float32), fenced=False)


class SimFragment(tuple):
    """Register A fragment under the simulator (four np.uint32) made by :func:`wgmma_a_fragments` (or four integers
    of the kernel's own passed through :func:`wgmma_fence`): ``kind`` (what its halves hold; None: not known),
    ``epoch`` (the thread's wgmma_fence count when it was written), ``site`` and ``fenced`` (it went through a
    wgmma_fence since it was written: only then may a wgmma read it)."""

    def __new__(cls, values, kind, epoch, site, fenced=False):
        out = super().__new__(cls, values)
        out.kind, out.epoch, out.site, out.fenced = kind, epoch, site, fenced
        return out


def fence_count(me):
    return me.__dict__.get("_numbatma_wgmma_fences", 0)


def _sim_fence(acc):
    sim().group_exchange("wgmma_fence", 128, None)
    me, _ = sim_thread()
    me._numbatma_wgmma_fences = fence_count(me) + 1  # (orders every register written before it)
    return _fenced(acc)


def _fenced(acc):
    """What ``wgmma_fence`` returns for its operand: accumulators and register A fragments marked fenced (a wgmma may
    read them); a tuple of four integers (the kernel's own register A fragment) becomes a fenced SimFragment."""
    if isinstance(acc, SimAccumulator):
        return acc.copy(fenced=True)
    if isinstance(acc, SimFragment):
        return SimFragment(tuple(acc), acc.kind, acc.epoch, acc.site, fenced=True)
    if isinstance(acc, tuple):
        if len(acc) == 4 and all(isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))
                                 for a in acc):
            me, _ = sim_thread()
            return SimFragment(acc, None, fence_count(me), sim().caller_site(), fenced=True)
        return tuple(_fenced(a) for a in acc)
    return acc  # plain values


def _is_fragment_value(a):
    return isinstance(a, (tuple, list, np.ndarray)) and not isinstance(a, SimOperand) and len(a) == 4


def _register_a_matrix(contributions, kind):
    """The 64 x K A tile (float64 values) from the 128 threads' register fragments (PTX ISA, "WGMMA .m64nNk16 /
    .m64nNk8 register fragment layout for matrix A"): thread t (warp w = t // 32, g = lane // 4, q = lane % 4)
    holds in register j row 16 w + g + 8 (j % 2); columns 2 q + 8 (j // 2) and +1 (bf16/f16: low half
    first), or column q + 4 (j // 2) (tf32)."""
    regs = np.array([[int(x) & 0xFFFFFFFF for x in c] for c in contributions], dtype=np.uint64).astype(np.uint32)
    t = np.arange(128)
    w, lane = t // 32, t % 32
    g, q = lane // 4, lane % 4
    k = KINDS[kind][0]
    out = np.zeros((64, k))
    for j in range(4):
        row = 16 * w + g + 8 * (j % 2)
        if kind == "tf32":
            out[row, q + 4 * (j // 2)] = element_values(regs[:, j], kind)
        else:
            col = 2 * q + 8 * (j // 2)
            out[row, col] = element_values(regs[:, j] & 0xFFFF, kind)
            out[row, col + 1] = element_values(regs[:, j] >> 16, kind)
    return out


def _operand_key(operand):
    """What identifies a shared-memory operand's values: where its tile lies, its layout and its origin."""
    tile = np.asarray(operand.tile)
    lay = operand.layout
    return (tile.__array_interface__["data"][0], tile.shape, tile.strides, lay.kind, lay.major, lay.swizzle,
            lay.groups, lay.rows, lay.width, operand.mn, operand.k)


def _sim_mma(acc, a, b, scale_d):
    if isinstance(b, SimOperandRange) or isinstance(a, SimOperandRange):
        return _sim_mma_range(acc, a, b, scale_d)
    s = sim()
    me, t = sim_thread()
    site = s.caller_site()
    register_a = _is_fragment_value(a)
    # The async proxy reads the shared operands from the issue until the wait that retires the group: recorded by
    # every thread before the issue completes, so no thread can write them unseen (checked by the engine)
    group = me.__dict__.get("_numbatma_wgmma_commits", 0)
    for which, operand, rows in (("A", a, 64), ("B", b, getattr(acc, "n", 0))):
        if isinstance(operand, SimOperand):
            record_operand_read(operand, rows, which, group, site)
    # .sync.aligned: the warpgroup issues it together (and register A is the warpgroup's 128 fragments)
    contributions = s.group_exchange("wgmma", 128, tuple(a) if register_a else None)
    if not isinstance(acc, SimAccumulator):
        raise s.SimulatedMisuse(f"wgmma: the accumulator must come from wgmma_zeros (got {type(acc).__name__})")
    if not isinstance(b, SimOperand):
        raise s.SimulatedMisuse("wgmma: B must be a shared-memory operand from wgmma_desc")
    if scale_d and not acc.fenced:
        raise s.SimulatedMisuse(
            f"wgmma at {site[0]}:{site[1]} accumulates into registers that other instructions wrote (wgmma_zeros, "
            f"wgmma_scale, ...) with no wgmma_fence(acc) in between: on the GPU the tensor cores may read the old "
            f"values. Pass acc through wgmma_fence first")
    bkind = b.layout.kind
    if register_a:
        if any(c is None for c in contributions):
            raise s.SimulatedMisuse(f"wgmma at {site[0]}:{site[1]}: some threads of the warpgroup pass A from "
                                    f"registers, others a descriptor; all 128 must pass the same form")
        if bkind in FP8:
            raise s.SimulatedMisuse("wgmma: A from registers with a float8 B: four uint32 registers do not say "
                                    "whether A is e4m3 or e5m2, so numbatma reads float8 A from shared memory only "
                                    "(wgmma_desc)")
        if not isinstance(a, SimFragment) or not a.fenced:
            written = (f"A fragments written at {a.site[0]}:{a.site[1]}" if isinstance(a, SimFragment) else
                       "A fragments (registers of the kernel's own)")
            raise s.SimulatedMisuse(
                f"wgmma at {site[0]}:{site[1]} reads {written} with no wgmma_fence after them (or one that was not "
                f"given them: they must pass through wgmma_fence since they were written): on the GPU the tensor cores "
                f"may read the registers before the conversion lands. Pass them through the fence, e.g. acc, frags = "
                f"wgmma_fence((acc, frags)), before the wgmma")
        if a.kind is not None and a.kind != bkind:
            raise s.SimulatedMisuse(
                f"wgmma at {site[0]}:{site[1]}: the A fragments hold {a.kind} values (wgmma_a_fragments at "
                f"{a.site[0]}:{a.site[1]}) but B is {bkind}: the registers would be read as {bkind}")
        akind = bkind
        a_key = ("registers", akind)

        def a_matrix():
            return _register_a_matrix(contributions, akind)
    else:
        if not isinstance(a, SimOperand):
            raise s.SimulatedMisuse(f"wgmma: A must be a wgmma_desc operand or a register fragment (four uint32), "
                                    f"got {type(a).__name__}")
        akind = a.layout.kind
        if a.layout.mn_extent - a.mn < 64:
            raise s.SimulatedMisuse(f"wgmma: the operands are smaller than m64n{acc.n}")
        a_key = _operand_key(a)

        def a_matrix():
            return operand_matrix(a, 64, site)
    if (akind in FP8) != (bkind in FP8) or (akind not in FP8 and akind != bkind):
        raise s.SimulatedMisuse(f"wgmma: A is {akind} but B is {bkind}")
    if acc.dtype == "f16" and akind not in ("f16",) + FP8:
        raise s.SimulatedMisuse(f"wgmma: float16 accumulators take f16 or float8 operands, not {akind}")
    if b.layout.mn_extent - b.mn < acc.n:
        raise s.SimulatedMisuse(f"wgmma: the operands are smaller than m64n{acc.n}")
    # (64, N), float64: computed by the first thread of the warpgroup, shared with the other 127 (the operands are
    # the same for all: keyed by them, so that threads passing different ones - a bug - still get their own)
    product = contributions.once((a_key, _operand_key(b), acc.n),
                                 lambda: a_matrix() @ operand_matrix(b, acc.n, site).T)
    count, _ = accumulator_registers(acc.n, acc.dtype)
    i = np.arange(count)
    if acc.dtype == "f32":
        rows, cols = wgmma_row_col(i, t)
        add = product[rows, cols].astype(np.float32)
        values = (acc.values if scale_d else np.float32(0)) + add
    else:
        rows, cols = wgmma_row_col(2 * i, t)
        old = acc.values.astype(np.uint32)
        lo_old = (old & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
        hi_old = (old >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
        lo = (lo_old if scale_d else 0) + product[rows, cols]
        hi = (hi_old if scale_d else 0) + product[rows, cols + 1]
        with np.errstate(over="ignore"):
            values = lo.astype(np.float16).view(np.uint16).astype(np.uint32) | \
                (hi.astype(np.float16).view(np.uint16).astype(np.uint32) << 16)
    return acc.copy(values=np.asarray(values, acc.values.dtype), fenced=True, group=group, site=site)


def _sim_mma_range(acc, a, b, scale_d):
    """The steps of a range call in order: the first with ``scale_d``, the others accumulating."""
    s = sim()
    if not isinstance(b, SimOperandRange):
        raise s.SimulatedMisuse("wgmma: A covers several k-steps but B is a single k-step: give B as a range too "
                                "(wgmma_desc(..., k=(k0, k1)))")
    if isinstance(a, SimOperandRange):
        a_steps = a.steps
    elif isinstance(a, tuple) and a and all(_is_fragment_value(f) for f in a):
        a_steps = list(a)
    else:
        raise s.SimulatedMisuse(f"wgmma: B covers {len(b)} k-steps; A must be a range of as many "
                                f"(wgmma_desc(..., k=(k0, k1))) or a tuple of {len(b)} register fragments")
    if len(a_steps) != len(b):
        raise s.SimulatedMisuse(f"wgmma: A covers {len(a_steps)} k-steps but B {len(b)}")
    for i, (a_i, b_i) in enumerate(zip(a_steps, b.steps)):
        acc = _sim_mma(acc, a_i, b_i, scale_d if i == 0 else 1)
    return acc


def _sim_commit():
    sim().group_exchange("wgmma_commit_group", 128, None)
    me, _ = sim_thread()
    me._numbatma_wgmma_commits = me.__dict__.get("_numbatma_wgmma_commits", 0) + 1


def _sim_wait(n, acc):
    sim().group_exchange("wgmma_wait_group", 128, None)  # (the warpgroup's reads of the group are done)
    me, _ = sim_thread()
    done = me.__dict__.get("_numbatma_wgmma_commits", 0) - int(n)  # groups 0 .. done-1 are complete
    if done > 0:  # their shared operands are read no more (as far as this thread and whom it releases to know)
        sim().retire_operand_reads(("wgmma", sim().thread_index() // 128), done)
    return _completed(acc, done)


def _completed(acc, done):
    if isinstance(acc, SimFragment) or isinstance(acc, (int, np.integer)):  # (a register A fragment: kept live)
        return acc
    if isinstance(acc, tuple):
        return tuple(_completed(a, done) for a in acc)
    if acc.group is not None and acc.group < done:
        return acc.copy(group=None)
    return acc
