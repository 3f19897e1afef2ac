"""The one place numbatma builds inline PTX.

A :class:`Ptx` is a declarative description of one instruction variant: its PTX text with named
operands (``$name``), the PTX register class of each operand, and the oldest target that has it.
``Ptx.emit(builder, name=value, ...)`` turns it into an LLVM ``asm sideeffect`` call. Immediates
(``imm=``) are spelled into the text, so one description covers e.g. every ``wait_group N``.

Every PTX family module (``mbarrier.py``, ``tma.py``, ``fence.py``, ...) lists its instructions as ``Ptx``
objects in its ``PTX`` table, keyed by intrinsic (``tma_load(rank=2)``). That table is where the PTX of an
intrinsic is spelled: ``numbatma.intrinsics.all_ptx()`` gathers the tables, ``docs/ptx.md`` lists every
variant, and the docstring of each intrinsic ends with a section generated from its entries
(``help(tma_load)``); the prose of the docstrings names instructions, it does not spell them.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from llvmlite import ir

from numbatma.targets import TARGETS, capability_text, target_of  # noqa: F401  (one definition, host side)

# PTX register class -> (LLVM type, inline-asm constraint letter)
_REG = {
    "b16": (ir.IntType(16), "h"),
    "b32": (ir.IntType(32), "r"),
    "b64": (ir.IntType(64), "l"),
    "f32": (ir.FloatType(), "f"),
    "f64": (ir.DoubleType(), "d"),
}
_OPERAND = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")

I32 = ir.IntType(32)
I64 = ir.IntType(64)


class UnsupportedTarget(RuntimeError):
    """A kernel uses an operation whose PTX the compile target does not have."""


def _capability(target):
    return capability_text(target)


def check_targets(text, arch, instructions):
    """Raise UnsupportedTarget if ``text`` (LLVM IR or PTX) uses one of ``instructions`` (name -> Ptx) that
    the target ``arch`` lacks."""
    target = target_of(arch)
    if target is None or "numbatma:" not in text:
        return
    for name, ptx in instructions.items():
        if ptx.targets is not None and target not in ptx.targets and ptx.marker in text:
            raise UnsupportedTarget(
                f"numbatma: {name} ({ptx.text.split()[0].lstrip('{')}...) is not available when compiling for "
                f"{target}; PTX has it on {', '.join(ptx.targets)} only. Compile this kernel for one of those "
                f"(a GPU of compute capability {_capability(ptx.targets[0])}) or do without {name}"
                + (f": {ptx.instead}." if ptx.instead else ".")
            )


@dataclass(frozen=True)
class Ptx:
    """One PTX instruction variant.

    * ``text``: PTX with ``$name`` placeholders for operands and immediates.
    * ``ins``: the register inputs: ``(name, regclass)`` for one register (regclass one of b16/b32/b64/f32/f64)
      or ``(name, regclass, count)`` for a vector of ``count`` registers, spelled ``{r0, r1, ...}`` in the text
      (e.g. the ``a`` fragment of ``mma.sync``).
    * ``out``: the register output, ``(name, regclass)`` or a vector ``(name, regclass, count)``, or ``None``.
    * ``inout``: a vector ``(name, regclass, count)`` that is read and written in place (tied operands, e.g.
      the accumulators of ``wgmma.mma_async``): the instruction gets the input values in the same registers
      it writes, and no use of the old values can move past it. At most one of ``out`` / ``inout``. An
      ``inout`` group that the text does not mention is only carried through: the instruction becomes an
      ordering point for those registers (``wgmma.fence`` / ``wgmma.wait_group`` on the accumulators).
    * ``imm``: names of immediates, substituted as integers into the text.
    * ``min_sm``: oldest compute capability (major*10+minor) with the instruction (shown in docs/ptx.md).
    * ``targets``: the targets (of ``TARGETS``) whose PTX has the instruction, or ``None`` for all of them.
      A restricted instruction carries a marker comment (``// numbatma:<key>``) in its asm text, so that
      compiling a kernel that uses it for another target raises :class:`UnsupportedTarget` naming the
      operation, the target and where it is available (``check_targets``), instead of a ptxas error.
    * ``instead``: for a restricted instruction, what to use on the other targets (said in the error).
    """

    text: str
    ins: tuple = ()
    out: tuple | None = None
    imm: tuple = ()
    min_sm: int = 90
    memory: bool = True  # the instruction reads or writes memory the compiler must not cache around
    targets: tuple | None = None
    inout: tuple | None = None
    instead: str = ""
    pure: bool = False  # no side effect: LLVM may merge, hoist or drop it like arithmetic (``memory`` must be False)
    names: tuple = field(init=False, default=())

    def __post_init__(self):
        used = set(_OPERAND.findall(self.text))
        declared = {o[0] for o in self.ins} | set(self.imm) | {o[0] for o in (self.out, self.inout) if o}
        if self.inout and self.inout[0] not in used:
            declared.discard(self.inout[0])  # registers only carried through (an ordering point, e.g. a fence)
        if used != declared:
            raise ValueError(f"Ptx {self.text!r}: operands used {sorted(used)} != declared {sorted(declared)}")
        if self.out and self.inout:
            raise ValueError(f"Ptx {self.text!r}: give out or inout, not both")
        if self.pure and (self.memory or not self.out):
            raise ValueError(f"Ptx {self.text!r}: a pure instruction has an output and touches no memory")
        if self.targets is not None and not set(self.targets) <= set(TARGETS):
            raise ValueError(f"Ptx {self.text!r}: targets {self.targets} not among {TARGETS}")

    @property
    def marker(self):
        """``numbatma:<key>`` (a hash of the text) for instructions limited to some targets, else ''."""
        if self.targets is None:
            return ""
        return "numbatma:" + hashlib.sha1(self.text.encode()).hexdigest()[:10]

    def registers(self):
        """Every register operand in asm order, ``(name, regclass, index within its vector or None)``: the
        outputs (``out`` or ``inout``) first, then the inputs."""
        order = []
        for group in ((self.out or self.inout),) + tuple(self.ins):
            if not group:
                continue
            if len(group) == 3:
                order += [(group[0], group[1], i) for i in range(group[2])]
            else:
                order.append((group[0], group[1], None))
        return order

    def render(self, **imm):
        """The PTX text with immediates spelled in and operands numbered as LLVM expects."""
        first = {}
        for position, (name, _, index) in enumerate(self.registers()):
            first.setdefault(name, position)
        sizes = {g[0]: g[2] for g in ((self.out or self.inout),) + tuple(self.ins) if g and len(g) == 3}

        def sub(m):
            name = m.group(1)
            if name in self.imm:
                return str(int(imm[name]))
            if name in sizes:
                return "{" + ", ".join(f"${first[name] + i}" for i in range(sizes[name])) + "}"
            return "$" + str(first[name])

        text = _OPERAND.sub(sub, self.text)
        return text + (f" // {self.marker}" if self.targets is not None else "")

    def emit(self, builder, **operands):
        """Emit the instruction; ``operands`` maps each input name to an LLVM value (a vector input: a list of
        values, or an LLVM array/struct value; converted to the operand's width), each immediate name to a
        Python int, and the ``inout`` name to its current values. Returns the output (a value; for a vector
        output or ``inout``: an LLVM literal struct of the new values) or None."""
        imm = {n: operands.pop(n) for n in self.imm}
        args = []
        constraints = []
        ret_types = []
        result = self.out or self.inout
        if result:
            ty, letter = _REG[result[1]]
            count = result[2] if len(result) == 3 else None
            ret_types = [ty] * (count or 1)
            constraints += ["=" + letter] * len(ret_types)
        for group in self.ins:
            ty, letter = _REG[group[1]]
            value = operands.pop(group[0])
            values = _elements(builder, value, group[2]) if len(group) == 3 else [value]
            for v in values:
                args.append(_convert(builder, v, ty))
                constraints.append(letter)
        if self.inout:
            for i, v in enumerate(_elements(builder, operands.pop(self.inout[0]), self.inout[2])):
                args.append(_convert(builder, v, ret_types[0]))
                constraints.append(str(i))  # tied to output i
        if operands:
            raise TypeError(f"unexpected operands {sorted(operands)} for {self.text!r}")
        if self.memory:
            constraints.append("~{memory}")
        if not ret_types:
            ret_ty = ir.VoidType()
        elif len(ret_types) == 1 and not (result and len(result) == 3):
            ret_ty = ret_types[0]
        else:
            ret_ty = ir.LiteralStructType(ret_types)
        fnty = ir.FunctionType(ret_ty, [a.type for a in args])
        asm = ir.InlineAsm(fnty, self.render(**imm), ",".join(constraints), side_effect=not self.pure)
        return builder.call(asm, args)


def _elements(builder, value, count):
    """The ``count`` scalar values of a vector operand given as a list or as an LLVM aggregate value."""
    if isinstance(value, (list, tuple)):
        values = list(value)
    else:
        values = [builder.extract_value(value, i) for i in range(count)]
    if len(values) != count:
        raise TypeError(f"expected {count} values, got {len(values)}")
    return values


def _convert(builder, value, ty):
    """Zero-extend, truncate or pass through an integer to the operand width; bit-cast between a float and
    an integer of the same width (e.g. a float32 through a b32 register)."""
    if value.type == ty:
        return value
    if isinstance(value.type, ir.IntType) and isinstance(ty, ir.IntType):
        if value.type.width > ty.width:
            return builder.trunc(value, ty)
        return builder.zext(value, ty)
    widths = {ir.FloatType(): 32, ir.DoubleType(): 64, ir.HalfType(): 16}
    src = value.type.width if isinstance(value.type, ir.IntType) else widths.get(value.type)
    dst = ty.width if isinstance(ty, ir.IntType) else widths.get(ty)
    if src is not None and src == dst:
        return builder.bitcast(value, ty)
    raise TypeError(f"cannot pass {value.type} as {ty}")
