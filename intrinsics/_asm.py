"""The one place numbatma builds inline PTX.

A :class:`Ptx` is a declarative description of one instruction variant: its PTX text with named
operands (``$name``), the PTX register class of each operand, and the oldest target that has it.
``Ptx.emit(builder, name=value, ...)`` turns it into an LLVM ``asm sideeffect`` call. Immediates
(``imm=``) are spelled into the text, so one description covers e.g. every ``wait_group N``.

Every PTX family module (``mbarrier.py``, ``tma.py``, ``fence.py``) lists its instructions as ``Ptx``
objects at the top, so the PTX of any intrinsic is one search away.
"""
from __future__ import annotations

import hashlib
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

TARGETS = ("sm_90a", "sm_100a", "sm_120a")  # what numbatma compiles for (and CI links for)


class UnsupportedTarget(RuntimeError):
    """A kernel uses an operation whose PTX the compile target does not have."""


def target_of(arch):
    """``compute_90a`` / ``sm_90a`` / ``(9, 0, 'a')`` -> ``sm_90a`` (None when not recognisable)."""
    if isinstance(arch, tuple):
        arch = "sm_" + "".join(str(x) for x in arch)
    digits = "".join(ch for ch in str(arch) if ch.isdigit())
    if not digits:
        return None
    return f"sm_{digits}" + ("a" if str(arch).endswith("a") else "")


def _capability(target):
    digits = "".join(ch for ch in target if ch.isdigit())
    return f"{digits[:-1]}.{digits[-1]}"


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
                f"(a GPU of compute capability {_capability(ptx.targets[0])}) or do without {name}."
            )


@dataclass(frozen=True)
class Ptx:
    """One PTX instruction variant.

    * ``text``: PTX with ``$name`` placeholders for operands and immediates.
    * ``ins``: ``(name, regclass)`` of each register input, regclass one of b16/b32/b64/f32/f64.
    * ``out``: ``(name, regclass)`` of the single register output, or ``None``.
    * ``imm``: names of immediates, substituted as integers into the text.
    * ``min_sm``: oldest compute capability (major*10+minor) with the instruction.
    * ``targets``: the targets (of ``TARGETS``) whose PTX has the instruction, or ``None`` for all of them.
      A restricted instruction carries a marker comment (``// numbatma:<key>``) in its asm text, so that
      compiling a kernel that uses it for another target raises :class:`UnsupportedTarget` naming the
      operation, the target and where it is available (``check_targets``), instead of a ptxas error.
    """

    text: str
    ins: tuple = ()
    out: tuple | None = None
    imm: tuple = ()
    min_sm: int = 90
    memory: bool = True  # the instruction reads or writes memory the compiler must not cache around
    targets: tuple | None = None
    names: tuple = field(init=False, default=())

    def __post_init__(self):
        used = set(_OPERAND.findall(self.text))
        declared = {n for n, _ in self.ins} | set(self.imm) | ({self.out[0]} if self.out else set())
        if used != declared:
            raise ValueError(f"Ptx {self.text!r}: operands used {sorted(used)} != declared {sorted(declared)}")
        if self.targets is not None and not set(self.targets) <= set(TARGETS):
            raise ValueError(f"Ptx {self.text!r}: targets {self.targets} not among {TARGETS}")

    @property
    def marker(self):
        """``numbatma:<key>`` (a hash of the text) for instructions limited to some targets, else ''."""
        if self.targets is None:
            return ""
        return "numbatma:" + hashlib.sha1(self.text.encode()).hexdigest()[:10]

    def render(self, **imm):
        """The PTX text with immediates spelled in and operands numbered as LLVM expects."""
        order = ([self.out[0]] if self.out else []) + [n for n, _ in self.ins]

        def sub(m):
            name = m.group(1)
            if name in self.imm:
                return str(int(imm[name]))
            return "$" + str(order.index(name))

        text = _OPERAND.sub(sub, self.text)
        return text + (f" // {self.marker}" if self.targets is not None else "")

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
