"""Hook 13: the IR inliner's callee copy, one scope copy per function instead of one per block.

numba-cuda inlines every ``cuda.jit(device=True, inline="always")`` call at the Numba IR level
(``numba.cuda.core.inline_closurecall.InlineWorker.inline_ir``). That method copies the callee's IR twice (a
mutable copy, and an unmutated one it returns) with ``copy.deepcopy(block)`` for each block separately. Every
``ir.Var`` deep-copies its ``ir.Scope`` (``Var.__deepcopy__``), and the scope holds every variable of the function,
so each block's copy also copies the whole scope again: the cost grows with blocks x variables. numbatma's kernels
inline large device functions (unrolled register tuples: thousands of variables, dozens of blocks), and this copy
was 60 % of the Attention kernel's Python compile time (upstream: NVIDIA/numba-cuda issue 688).

The fix keeps upstream's code and changes only what ``copy.deepcopy(block)`` does while ``inline_ir`` runs: the
blocks that share a scope share one deepcopy memo, so they come out exactly as ``copy.deepcopy`` of the whole
block dictionary would make them - one copy of the scope, its variables the same objects the copied statements
refer to (as in the original IR, where all blocks share one scope). Outside ``inline_ir``, and for anything but
an ``ir.Block``, the module's ``copy`` behaves as the standard library's.

Upstream objects relied on (checked by tests/test_numba_internals.py): ``inline_closurecall.copy`` (the module
global whose ``deepcopy`` ``inline_ir``'s ``copy_ir`` calls), ``InlineWorker.inline_ir``, ``ir.Block`` and its
``scope`` attribute.
"""
from __future__ import annotations

import copy as _copy
import functools
import threading
import types as _pytypes

from ._patching import patch as _patch


# -- hook 13: the inliner's callee copy ------------------------------------------------------------------------------
_session = threading.local()  # .memos: {id(original scope): (scope, memo)} while an inline_ir call runs


def _deepcopy(x, memo=None, _nil=[]):  # noqa: B006 (the standard library's signature)
    memos = getattr(_session, "memos", None)
    if memo is None and memos is not None and type(x) is _block_type():
        scope = x.scope
        entry = memos.get(id(scope))
        if entry is None or id(x) in entry[1]:  # a block copied again: a new copy of its function, a new memo
            entry = memos[id(scope)] = (scope, {})  # (the scope kept alive: its id stays unique meanwhile)
        return _copy.deepcopy(x, entry[1])
    return _copy.deepcopy(x, memo, _nil)


@functools.cache
def _block_type():
    from numba.cuda.core import ir

    return ir.Block


def _copy_module():
    """A stand-in for the ``copy`` module inside inline_closurecall: ``deepcopy`` as above, the rest the
    standard library's."""
    shim = _pytypes.ModuleType("copy")
    shim.__dict__.update({name: getattr(_copy, name) for name in dir(_copy) if not name.startswith("__")})
    shim.deepcopy = _deepcopy
    shim._numbatma_inline_copy = True
    return shim


def _inline_ir(original):
    def inline_ir(self, *args, **kwargs):
        outer = getattr(_session, "memos", None)
        _session.memos = {}
        try:
            return original(self, *args, **kwargs)
        finally:
            _session.memos = outer
    return inline_ir


def _inline_copy_hook_points():
    """The upstream objects hook 13 relies on (tests check they exist)."""
    from numba.cuda.core import inline_closurecall

    return {
        "inline_closurecall.copy.deepcopy": (inline_closurecall.copy, "deepcopy"),
        "InlineWorker.inline_ir": (inline_closurecall.InlineWorker, "inline_ir"),
    }


def install_inline_copy():
    """Hook 13 (idempotent)."""
    from numba.cuda.core import inline_closurecall

    if not getattr(inline_closurecall.copy, "_numbatma_inline_copy", False):
        inline_closurecall.copy = _copy_module()
    _patch(inline_closurecall.InlineWorker, "inline_ir", _inline_ir)
