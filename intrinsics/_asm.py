"""The one place numbatma builds inline PTX.

A :class:`Ptx` is a declarative description of one instruction variant: its PTX text with named
operands (``$name``), the PTX register class of each operand, and the oldest target that has it.
``Ptx.emit(builder, name=value, ...)`` turns it into an LLVM ``asm sideeffect`` call. Immediates
(``imm=``) are spelled into the text, so one description covers e.g. every ``wait_group N``.

Every PTX family module (``mbarrier.py``, ``tma.py``, ``fence.py``) lists its instructions as ``Ptx``
objects at the top, so the PTX of any intrinsic is one search away.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from llvmlite import ir

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


@dataclass(frozen=True)
class Ptx:
    """One PTX instruction variant.

    * ``text``: PTX with ``$name`` placeholders for operands and immediates.
    * ``ins``: ``(name, regclass)`` of each register input, regclass one of b16/b32/b64/f32/f64.
    * ``out``: ``(name, regclass)`` of the single register output, or ``None``.
    * ``imm``: names of immediates, substituted as integers into the text.
    * ``min_sm``: oldest compute capability (major*10+minor) with the instruction.
    """

    text: str
    ins: tuple = ()
    out: tuple | None = None
    imm: tuple = ()
    min_sm: int = 90
    memory: bool = True  # the instruction reads or writes memory the compiler must not cache around
    names: tuple = field(init=False, default=())

    def __post_init__(self):
        used = set(_OPERAND.findall(self.text))
        declared = {n for n, _ in self.ins} | set(self.imm) | ({self.out[0]} if self.out else set())
        if used != declared:
            raise ValueError(f"Ptx {self.text!r}: operands used {sorted(used)} != declared {sorted(declared)}")

    def render(self, **imm):
        """The PTX text with immediates spelled in and operands numbered as LLVM expects."""
        order = ([self.out[0]] if self.out else []) + [n for n, _ in self.ins]

        def sub(m):
            name = m.group(1)
            if name in self.imm:
                return str(int(imm[name]))
            return "$" + str(order.index(name))

        return _OPERAND.sub(sub, self.text)

    def emit(self, builder, **operands):
        """Emit the instruction; ``operands`` maps each input name to an LLVM value (converted to the
        operand's width) and each immediate name to a Python int. Returns the output value or None."""
        imm = {n: operands.pop(n) for n in self.imm}
        args = []
        constraints = []
        if self.out:
            ty, letter = _REG[self.out[1]]
            constraints.append("=" + letter)
            ret_ty = ty
        else:
            ret_ty = ir.VoidType()
        for name, reg in self.ins:
            ty, letter = _REG[reg]
            args.append(_convert(builder, operands.pop(name), ty))
            constraints.append(letter)
        if operands:
            raise TypeError(f"unexpected operands {sorted(operands)} for {self.text!r}")
        if self.memory:
            constraints.append("~{memory}")
        fnty = ir.FunctionType(ret_ty, [a.type for a in args])
        asm = ir.InlineAsm(fnty, self.render(**imm), ",".join(constraints), side_effect=True)
        return builder.call(asm, args)


def _convert(builder, value, ty):
    """Zero-extend, truncate or pass through an integer to the operand width."""
    if value.type == ty:
        return value
    if isinstance(value.type, ir.IntType) and isinstance(ty, ir.IntType):
        if value.type.width > ty.width:
            return builder.trunc(value, ty)
        return builder.zext(value, ty)
    raise TypeError(f"cannot pass {value.type} as {ty}")
