"""Offline compilation: kernel -> PTX (NVVM) -> cubin (nvJitLink) -> SASS (cuobjdump), no GPU needed.

The machine's ``ptxas`` may be older than the PTX NVVM emits, so linking always goes through nvJitLink
from pip (``cuda.core.Linker``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

ARCHS = ("sm_90a", "sm_100a", "sm_120a")
_CC = {"sm_90a": (9, 0, "a"), "sm_100a": (10, 0, "a"), "sm_120a": (12, 0, "a")}


def compile_ptx(pyfunc, argtypes, arch="sm_90a", **kwargs):
    """PTX of ``pyfunc`` compiled as a kernel for ``arch`` (``sm_90a``, ``sm_100a`` or ``sm_120a``).

    ``argtypes`` may hold Numba types or example values (a :class:`numbatma.TensorMap` stands for its
    kernel type)."""
    from numba import cuda
    from numba.cuda.typing.typeof import typeof

    if arch not in _CC:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    sig = tuple(a if _is_numba_type(a) else typeof(a) for a in argtypes)
    from numbatma._numba_internals import offline_target

    with offline_target(_CC[arch]):
        ptx, _ = cuda.compile_ptx(pyfunc, sig, cc=_CC[arch], **kwargs)
    return ptx


def _is_numba_type(x):
    from numba.cuda import types

    return isinstance(x, types.Type)


def link_cubin(ptx, arch="sm_90a", max_registers=None):
    """Assemble and link PTX to a cubin for ``arch`` through nvJitLink (offline). ``max_registers`` is the
    per-thread register cap (what ``cuda.jit(max_registers=...)`` gives ptxas); ``setmaxnreg`` needs one."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    if isinstance(ptx, str):
        ptx = ptx.encode()
    options = LinkerOptions(arch=arch, max_register_count=max_registers)
    linker = Linker(ObjectCode.from_ptx(ptx), options=options)
    return linker.link("cubin").code


def _tool(name):
    path = shutil.which(name)
    if path:
        return path
    try:
        import nvidia.cu13 as cu13  # nvidia-cuda-cuobjdump / -nvdisasm wheels

        candidate = os.path.join(list(cu13.__path__)[0], "bin", name)
        if os.path.exists(candidate):
            return candidate
    except ImportError:
        pass
    raise FileNotFoundError(f"{name} not found: pip install nvidia-cuda-cuobjdump (numbatma[test])")


def sass(cubin: bytes) -> str:
    """SASS text of a cubin (``cuobjdump -sass``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        return subprocess.run([_tool("cuobjdump"), "-sass", path], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
