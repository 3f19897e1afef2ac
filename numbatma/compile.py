"""Offline compilation: kernel -> PTX (NVVM) -> cubin (nvJitLink) -> SASS (cuobjdump), no GPU needed.

The machine's ``ptxas`` may be older than the PTX NVVM emits, so linking always goes through nvJitLink
from pip (``cuda.core.Linker``).

Two routes to a cubin:

* ``link_cubin(compile_ptx(...))``: PTX assembled as a separately compiled unit. ptxas then drops
  ``setmaxnreg`` ("ignored to maintain compatibility across compilation units").
* ``compile_cubin(...)``: LTO-IR linked with link-time optimisation, which is what numba-cuda does on a
  GPU machine when nvJitLink is present. ptxas sees the whole program and keeps ``setmaxnreg`` when the
  kernel has a register cap (``max_registers``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from .targets import TARGETS, compute_capability

ARCHS = TARGETS  # (the name tests and scripts use)
_CC = {t: compute_capability(t) for t in TARGETS}


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


def compile_cubin(pyfunc, argtypes, arch="sm_90a", max_registers=None, **kwargs):
    """Cubin of ``pyfunc`` built like numba-cuda builds it on a GPU: NVVM to LTO-IR, then nvJitLink with
    link-time optimisation and the register cap ``max_registers`` (``cuda.jit(max_registers=...)``)."""
    from cuda.core import Linker, LinkerOptions, ObjectCode
    from numba import cuda
    from numba.cuda.typing.typeof import typeof

    from numbatma._numba_internals import offline_target

    if arch not in _CC:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    sig = tuple(a if _is_numba_type(a) else typeof(a) for a in argtypes)
    with offline_target(_CC[arch]):
        ltoir, _ = cuda.compile(pyfunc, sig, device=False, abi="numba", cc=_CC[arch], output="ltoir", **kwargs)
    options = LinkerOptions(arch=arch, link_time_optimization=True, max_register_count=max_registers)
    return Linker(ObjectCode.from_ltoir(ltoir), options=options).link("cubin").code


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


def enable_disk_cache(kernel, key):
    """Turn on Numba's on-disk cache (what ``cuda.jit(cache=True)`` does) for ``kernel``, a ``@cuda.jit`` kernel
    (not a device function), with ``key`` - a string naming everything the kernel's code depends on besides its
    own bytecode (the factory and arguments that made a closure, the source of the device functions it calls) -
    in place of Numba's hash of the closure's cells, which changes from process to process when the cells hold
    other kernels or device functions. Where the files go: as for ``cache=True`` (``NUMBA_CACHE_DIR``, else
    ``__pycache__`` beside the source, else Numba's user-wide cache directory). Returns ``kernel``.
    ``numbatma.kernels`` uses it for its ready-made kernels (see docs/kernels.md)."""
    from . import _numba_internals

    return _numba_internals.enable_disk_cache(kernel, key)


def disk_cache_key(kernel):
    """The key :func:`enable_disk_cache` gave ``kernel``, or None when its on-disk cache is not numbatma's."""
    from . import _numba_internals

    return _numba_internals.disk_cache_key(kernel)
