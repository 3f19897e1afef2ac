"""numbatma.intrinsics: device-side operations for ``@cuda.jit`` kernels.

Each function emits inline PTX; its docstring says what it does and what the caller must guarantee. One module
per PTX family (``FAMILIES`` below); each lists its public names in ``__all__`` and its instruction descriptions
in ``PTX``. This package exports every family's ``__all__``, and ``all_ptx()`` gathers every ``PTX`` table: the
one source of the PTX text. ``docs/ptx.md`` is generated from it (``python scripts/gen_ptx_doc.py``), and so is
the "PTX" section that ends the docstring of every exported intrinsic with a table entry (``help(tma_load)``;
``_define.add_ptx_sections``, called at the end of this file).
"""
from . import (
    accumulator,
    async_copy,
    bulk,
    cache,
    cluster,
    cluster_copy,
    descriptor,
    fast_math,
    fence,
    griddep,
    im2col,
    mbarrier,
    mma,
    pipeline,
    smem,
    swizzle,
    tma,
    warp,
    warp_roles,
    wgmma_epilogue,
    wgmma_operands,
)
from . import _debug as _debug_family  # bounded waits and runtime checks of the debug build (NUMBATMA_DEBUG=1)
from . import wgmma as _wgmma_family  # (the name wgmma is the intrinsic)
from ._define import add_ptx_sections as _add_ptx_sections
from ._asm import check_targets as _asm_check_targets
from ._define import sim as _sim_engine

#: The PTX families, one module each: their ``__all__`` is this package's API, their ``PTX`` tables ``all_ptx()``.
FAMILIES = (mbarrier, tma, fence, async_copy, warp, pipeline, smem, cache, bulk, cluster, cluster_copy, descriptor,
            im2col, swizzle, mma, wgmma_operands, _wgmma_family, wgmma_epilogue, accumulator, griddep,
            warp_roles, fast_math)

__all__ = []
for _module in FAMILIES:
    for _name in _module.__all__:
        if _name in __all__:
            raise ImportError(f"numbatma.intrinsics: {_name} is exported by two families")
        globals()[_name] = getattr(_module, _name)
    __all__ += list(_module.__all__)
del _module, _name


def all_ptx():
    """Every PTX instruction description, by intrinsic name (the debug build's bounded waits included)."""
    table = {}
    for module in FAMILIES + (_debug_family,):
        for key, ptx in module.PTX.items():
            if key in table and table[key] is not ptx:
                raise KeyError(f"all_ptx: {key!r} is described by two families")
            table[key] = ptx
    return table


_add_ptx_sections({name: globals()[name] for name in __all__}, all_ptx())

# Registration with the host (numbatma/_registry.py): the host never imports this package, it is handed these.
from numbatma import _registry as _host_registry  # noqa: E402

_host_registry.register_source_dir(__path__[0])
_host_registry.register_target_checker(lambda text, arch: _asm_check_targets(text, arch, all_ptx()))
_host_registry.register_simulator(_sim_engine)  # (a loader: the engine is imported on first use, never on the GPU path)
_host_registry.register_accumulator_class(_wgmma_family.SimAccumulator)
