"""Spike: does numbatma's device mechanism carry over to numba-cuda-mlir? (docs/numba-backends.md)

Runs only where ``numba_cuda_mlir`` is importable (it is not a numbatma dependency); anywhere else it prints
why and exits 0. Needs no GPU: every case compiles to PTX offline for sm_90a and inspects the text.
Setup used for docs/numba-backends.md (a throwaway environment, never numbatma's own):

    python3 -m venv /tmp/mlirenv
    /tmp/mlirenv/bin/pip install numba-cuda-mlir==0.6.0 nvidia-cuda-nvrtc==13.5.37 nvidia-nvvm==13.5.37 \
        nvidia-nvjitlink==13.5.37 nvidia-cuda-runtime==13.5.37
    /tmp/mlirenv/bin/python scripts/spike_numba_cuda_mlir.py

Cases, in order (each prints OK / BROKE with the first line of its error, and the script's exit status is 0
either way: this is a probe, not a test):

a1. ``cuda.experimental.inline_ptx`` (the package's own inline-PTX call) emitting ``mbarrier.init``.
a2. numbatma's current form: an ``@intrinsic`` whose codegen takes ``(context, builder, sig, args)`` and
    builds a llvmlite ``ir.InlineAsm``.
a3. The same ``@intrinsic`` with an MLIR-level codegen ``(lower, target, args, kwargs)`` emitting
    ``llvm.inline_asm`` (one input, one side-effect-only instruction).
a4. An MLIR-level ``@intrinsic`` returning two tied float registers (the wgmma accumulator pattern: outputs
    ``=f``, inputs tied ``0``/``1``) as a ``UniTuple(float32, 2)``.
    (An @intrinsic made after the first compile needs ``extending.refresh_registries()``: without it typing
    fails with "Untyped global name ... Cannot determine Numba type of <class ...extending._Intrinsic>".)
b.  A kernel parameter ``types.grid_constant(types.CUTensorMap)`` (128-byte struct by value): does the PTX
    show ``.param .align 128 .b8 ..[128]``, and can inline PTX take its address (``prefetch.tensormap``)?
c.  The simulator: is there one (``NUMBA_ENABLE_CUDASIM``)?
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys

CC = "sm_90a"


def _report(name, ok, detail):
    print(f"[{name}] {'OK   ' if ok else 'BROKE'} {detail}")


def _first_line(exc):
    """The error's type and its first two non-empty lines (numba's first line is only the pipeline step)."""
    lines = [line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    return " | ".join(lines[:2])[:400]


def _offline():
    """numba-cuda-mlir 0.6.0 asks the driver for the *host* compute capability on every compile, even when a
    chip is given (``tools.resolve_gpu_target`` -> ``get_gpu_compute_capability``); without a driver that
    raises ``CudaSupportError``. The spike pre-fills its module-level cache (a private name) - the same kind of
    patch as numbatma's hook 6."""
    import numba_cuda_mlir.tools as tools

    if getattr(tools, "_cached_cc", None) is None:
        tools._cached_cc = (9, 0)


def _compile(pyfunc, sig):
    """PTX text of ``pyfunc`` compiled as a kernel for ``sig`` and sm_90a."""
    from numba_cuda_mlir import cuda

    disp = cuda.jit(chip=CC)(pyfunc)
    disp.compile(sig)
    asm = disp.inspect_asm()
    if isinstance(asm, dict):
        asm = next(iter(asm.values()))
    return asm


def case_a1():
    from numba_cuda_mlir import cuda, types

    def kernel(out):
        # the address is a kernel argument here: the spike checks the instruction's path, not its operand
        cuda.experimental.inline_ptx("mbarrier.init.shared::cta.b64 [%0], %1;", "r", out[0], "r", types.uint32(1))

    ptx = _compile(kernel, (types.uint32[::1],))
    ok = "mbarrier.init.shared::cta.b64" in ptx
    _report("a1 cuda.experimental.inline_ptx", ok, "mbarrier.init in the PTX" if ok else "instruction missing from PTX")


def case_a2():
    try:
        from llvmlite import ir as llir
    except ImportError as exc:
        _report("a2 llvmlite import", False, f"llvmlite is not even installed with "
                f"numba-cuda-mlir ({_first_line(exc)})")
        llir = None
    from numba_cuda_mlir import cuda, types
    from numba_cuda_mlir.extending import intrinsic, refresh_registries

    seen = {}

    @intrinsic
    def mbar_init(typingctx, addr, count):
        def codegen(context, builder, sig, args):
            seen["args"] = (type(context).__name__, type(builder).__name__, type(sig).__name__,
                            type(args).__name__)
            if llir is None:
                raise RuntimeError("no llvmlite")
            fnty = llir.FunctionType(llir.VoidType(), [llir.IntType(32), llir.IntType(32)])
            asm = llir.InlineAsm(fnty, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r", side_effect=True)
            builder.call(asm, args)
            return context.get_dummy_value()

        return types.void(types.uint32, types.uint32), codegen

    refresh_registries()  # an @intrinsic made after the first compile is invisible without this

    def kernel(out):
        mbar_init(types.uint32(out[0]), types.uint32(1))

    try:
        _compile(kernel, (types.uint32[::1],))
        _report("a2 @intrinsic + llvmlite ir.InlineAsm", True, "compiled")
    except Exception as exc:  # noqa: BLE001 - a probe reports whatever breaks
        _report("a2 @intrinsic + llvmlite ir.InlineAsm", False,
                f"{_first_line(exc)}; codegen called with {seen.get('args')}")


def case_a3():
    from numba_cuda_mlir import cuda, types
    from numba_cuda_mlir.extending import intrinsic, refresh_registries

    @intrinsic
    def mbar_init(typingctx, addr, count):
        def codegen(lower, target, args, kwargs):
            from numba_cuda_mlir._mlir.dialects import llvm

            a, c = lower.load_var(args[0]), lower.load_var(args[1])
            llvm.inline_asm(None, [a, c], "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r",
                            has_side_effects=True)
            lower.store_var(target, None)

        return types.void(types.uint32, types.uint32), codegen

    refresh_registries()  # an @intrinsic made after the first compile is invisible without this

    def kernel(out):
        mbar_init(types.uint32(out[0]), types.uint32(1))

    try:
        ptx = _compile(kernel, (types.uint32[::1],))
        ok = "mbarrier.init.shared::cta.b64" in ptx
        _report("a3 @intrinsic + MLIR llvm.inline_asm", ok, "mbarrier.init in the PTX" if ok else "missing")
    except Exception as exc:  # noqa: BLE001
        _report("a3 @intrinsic + MLIR llvm.inline_asm", False, _first_line(exc))


def case_a4():
    from numba_cuda_mlir import cuda, types
    from numba_cuda_mlir.extending import intrinsic, refresh_registries

    @intrinsic
    def add_pair(typingctx, acc):
        def codegen(lower, target, args, kwargs):
            from numba_cuda_mlir._mlir import ir
            from numba_cuda_mlir._mlir.dialects import llvm

            tup = lower.load_var(args[0])
            f32 = ir.F32Type.get()
            ins = list(tup) if isinstance(tup, (tuple, list)) else [llvm.extractvalue(f32, tup, [i]) for i in (0, 1)]
            st = llvm.StructType.get_literal([f32, f32])
            res = llvm.inline_asm(st, ins, "add.f32 $0, $0, 0f3F800000; add.f32 $1, $1, 0f3F800000;",
                                  "=f,=f,0,1", has_side_effects=True)
            lower.store_var(target, tuple(llvm.extractvalue(f32, res, [i]) for i in (0, 1)))

        return acc(acc), codegen

    refresh_registries()

    def kernel(out):
        acc = (out[0], out[1])
        acc = add_pair(acc)
        out[0] = acc[0]
        out[1] = acc[1]

    try:
        ptx = _compile(kernel, (types.float32[::1],))
        ok = ptx.count("add.f32") >= 2 or ptx.count("add.rn.f32") >= 2
        _report("a4 tied multi-output asm -> UniTuple", ok, "two add.f32 in the PTX" if ok else "missing")
    except Exception as exc:  # noqa: BLE001
        _report("a4 tied multi-output asm -> UniTuple", False, _first_line(exc))


def case_b():
    from numba_cuda_mlir import cuda, types

    def kernel(tmap, out):
        cuda.experimental.inline_ptx("prefetch.tensormap [%0];", "l", tmap)
        out[0] = 1

    try:
        ptx = _compile(kernel, (types.grid_constant(types.CUTensorMap), types.float32[::1]))
    except Exception as exc:  # noqa: BLE001
        _report("b grid_constant CUTensorMap", False, _first_line(exc))
        return
    param = re.search(r"\.param \.align 128 \.b8 \w+\[128\]", ptx)
    _report("b grid_constant CUTensorMap", bool(param),
            f"param: {param.group(0) if param else 'no 128-byte aligned param'}; prefetch.tensormap in PTX: "
            f"{'prefetch.tensormap' in ptx}; cvta.param: {'cvta.param' in ptx}")


def case_c():
    import numba_cuda_mlir

    root = os.path.dirname(numba_cuda_mlir.__file__)
    found = [d for d, _, files in os.walk(root) if os.path.basename(d) == "simulator"]
    if found:
        _report("c simulator", True, f"simulator package at {found}")
    else:
        _report("c simulator", False, "no simulator package in numba_cuda_mlir (NUMBA_ENABLE_CUDASIM has no "
                "effect there); numbatma's simulator would have to run on numba-cuda's")


def main():
    if importlib.util.find_spec("numba_cuda_mlir") is None:
        print("numba_cuda_mlir is not installed in this environment; nothing to probe "
              "(see this script's docstring for the setup).")
        return 0
    import numba_cuda_mlir

    print(f"numba-cuda-mlir {getattr(numba_cuda_mlir, '__version__', '?')}, target {CC}, offline")
    _offline()
    for case in (case_a1, case_a2, case_a3, case_a4, case_b, case_c):
        try:
            case()
        except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others
            _report(case.__name__, False, _first_line(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
