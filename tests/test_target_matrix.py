"""CPU: the whole architecture matrix. Every PTX instruction numbatma can emit (``all_ptx()``) is assembled and
linked through nvJitLink, on its own, for every target numbatma supports; it must link exactly where its
``Ptx.targets`` says it exists. Where it does not, compiling a kernel that uses it raises UnsupportedTarget
(checked here with each restricted instruction's marker)."""
import re

import pytest

from numbatma import compile as nbc
from numbatma.intrinsics import all_ptx
from numbatma.intrinsics._asm import _REG, TARGETS, UnsupportedTarget, check_targets

# Immediates that must be in a range for ptxas (everything else gets 0: ordinals, group counts).
IMMEDIATES = {"regs": 232, "nbytes": 16, "n": 0, "scale_a": 1, "scale_b": 1}
_REGNAME = {"b16": "h", "b32": "r", "b64": "l", "f32": "f", "f64": "d"}


def _standalone_ptx(ptx, target):
    """A kernel whose body is the instruction with registers for its operands."""
    imm = {n: IMMEDIATES.get(n, 0) for n in ptx.imm}
    order = ptx.registers()
    text = ptx.render(**imm)
    for i in reversed(range(len(order))):  # $10 before $1
        name, reg, _ = order[i]
        text = re.sub(rf"\${i}(?!\d)", f"%{_REGNAME[reg]}{i}", text)
    decls = "\n".join(f"  .reg .{'b' + reg[1:] if reg.startswith('b') else reg} %{_REGNAME[reg]}<{len(order) + 1}>;"
                      for reg in _REG)
    return (f".version 9.0\n.target {target}\n.address_size 64\n\n.visible .entry numbatma_matrix()\n{{\n{decls}\n"
            f"  {text}\n  ret;\n}}\n")


CASES = sorted(all_ptx().items())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name, ptx", CASES, ids=[c[0] for c in CASES])
def test_instruction_links_exactly_where_declared(name, ptx, target):
    source = _standalone_ptx(ptx, target)
    allowed = ptx.targets is None or target in ptx.targets
    try:
        nbc.link_cubin(source, arch=target)
        linked, error = True, ""
    except Exception as exc:  # noqa: BLE001 - nvJitLink's error carries ptxas's message
        linked, error = False, str(exc)
    assert linked == allowed, (
        f"{name} on {target}: {'links' if linked else 'does not link'} but Ptx.targets={ptx.targets}\n"
        f"{source}\n{error[-1500:]}"
    )
    if not allowed:
        with pytest.raises(UnsupportedTarget, match=rf"{re.escape(name)} .*not available when compiling for {target}"):
            check_targets(ptx.render(**{n: IMMEDIATES.get(n, 0) for n in ptx.imm}), target.replace("sm", "compute"),
                          {name: ptx})


def test_matrix_is_not_empty():
    assert len(CASES) > 40


def test_compiling_a_restricted_instruction_for_another_target_raises(monkeypatch):
    """The compile hook (numbatma/_numba_internals.py) raises UnsupportedTarget, naming the operation, when a
    kernel uses an instruction its target lacks - shown with a synthetic sm_100a-only instruction."""
    from numba import types

    import numbatma.intrinsics as intrinsics
    from numbatma.intrinsics._asm import Ptx
    from numbatma.intrinsics._define import device_op, emit_only

    only_100 = Ptx("nanosleep.u32 7;", targets=("sm_100a",))

    @device_op()
    def only_on_100(typingctx):
        return types.void(), emit_only(only_100)

    table = intrinsics.all_ptx()
    monkeypatch.setattr(intrinsics, "all_ptx", lambda: {**table, "only_on_100": only_100})

    def kernel(a):
        only_on_100()

    ptx = nbc.compile_ptx(kernel, (types.float32[::1],), arch="sm_100a")
    assert "nanosleep.u32 7; // numbatma:" in (ptx if isinstance(ptx, str) else ptx[0])
    with pytest.raises(UnsupportedTarget, match=r"only_on_100 .*not available when compiling for sm_90a; PTX has it "
                                                r"on sm_100a only"):
        nbc.compile_ptx(kernel, (types.float32[::1],), arch="sm_90a")
