"""Where the statement being lowered is, and how a kernel spells an IR value: hook 10, the GPU debug mode.

A seam module (numba-cuda private names: ``numba.cuda.lowering.Lower.lower_inst``, ``numba.cuda.core.ir``, the
dispatcher's ``CUDACache._index_key``). Hook 10 is described in ``numbatma/_numba_internals.py``'s docstring, which
installs it when ``NUMBATMA_DEBUG`` is on; ``tests/test_numba_internals.py`` checks the upstream names
(:func:`_debug_hook_points`). :func:`_describe_var` also words the simulator's refusals (``_sim_hooks.py``).
"""
from __future__ import annotations

import threading
import types as _pytypes


# -- hook 10: GPU debug mode (where the statement being lowered is; cache keys) ----------------------------
_lowering = threading.local()


def _recording_lower_inst(original):
    def lower_inst(self, inst):
        stack = _lowering.__dict__.setdefault("stack", [])
        stack.append((self, inst))
        try:
            return original(self, inst)
        finally:
            stack.pop()

    lower_inst._numbatma_original = original
    return lower_inst


def _debug_hook_points():
    """The upstream objects the debug mode patches (tests check they still exist)."""
    from numba.cuda import dispatcher, lowering

    return {
        "Lower.lower_inst": (lowering.Lower, "lower_inst"),
        "CUDACache._index_key": (dispatcher.CUDACache, "_index_key"),
    }


def install_lowering_sites():
    """Record the statement each numba lowerer is lowering (what :func:`lowering_site` reads). Idempotent."""
    from numba.cuda import lowering

    current = lowering.Lower.lower_inst
    if not hasattr(current, "_numbatma_original"):
        lowering.Lower.lower_inst = _recording_lower_inst(current)


def _debug_index_key(original):
    def _index_key(self, sig, codegen):
        from . import debug

        key = original(self, sig, codegen)
        extra = debug.cache_key()
        return key if extra is None else key + (extra,)

    _index_key._numbatma_original = original
    return _index_key


def install_debug_cache_key():
    from numba.cuda import dispatcher

    current = dispatcher.CUDACache._index_key
    if not hasattr(current, "_numbatma_original"):
        dispatcher.CUDACache._index_key = _debug_index_key(current)


def _user_name(name):
    """``bar.1`` (an SSA version of ``bar``) -> ``bar``."""
    import re

    return re.sub(r"\.\d+$", "", name)


_BINOPS = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "truediv": "/", "mod": "%", "and_": "&",
           "or_": "|", "xor": "^", "lshift": "<<", "rshift": ">>"}


def _describe_var(func_ir, var, depth=0):
    """How the kernel spells the value of ``var`` (an IR variable): its own name for a user variable, else
    the expression that made the temporary (``bars[1]`` for ``mbarrier_ref(bars, 1)``); None if unknown."""
    from numba.cuda.core import ir

    if not isinstance(var, ir.var_types):
        return None
    if not var.name.startswith("$"):
        return _user_name(var.name)
    if depth > 6:
        return None
    try:
        d = func_ir.get_definition(var)
    except Exception:
        return None
    sub = lambda v: _describe_var(func_ir, v, depth + 1) or "?"  # noqa: E731
    if isinstance(d, ir.const_types):
        return repr(d.value)
    if isinstance(d, ir.global_types + ir.freevar_types):
        return d.name
    if isinstance(d, ir.var_types):
        return _describe_var(func_ir, d, depth + 1)
    if not isinstance(d, ir.expr_types):
        return None
    if d.op == "call":
        func = sub(d.func)
        args = [sub(a) for a in d.args]
        if func.split(".")[-1] == "mbarrier_ref" and len(args) == 2:
            return f"{args[0]}[{args[1]}]"
        return f"{func}({', '.join(args)})"
    if d.op == "getattr":
        return f"{sub(d.value)}.{d.attr}"
    if d.op == "static_getitem":
        index = d.index if not isinstance(d.index, slice) else (sub(d.index_var) if d.index_var else "?")
        return f"{sub(d.value)}[{index}]"
    if d.op == "getitem":
        return f"{sub(d.value)}[{sub(d.index)}]"
    if d.op in ("binop", "inplace_binop"):
        fn = getattr(d.fn, "__name__", str(d.fn))
        return f"{sub(d.lhs)} {_BINOPS.get(fn, fn)} {sub(d.rhs)}"
    if d.op == "build_tuple":
        return "(" + ", ".join(sub(v) for v in d.items) + ("," if len(d.items) == 1 else "") + ")"
    return None


def lowering_site():
    """Where the intrinsic being lowered now is called (None outside a recorded lowering): a namespace with
    ``filename``, ``line``, ``function`` (the qualified name of the kernel or device function), ``target``
    (the variable the call's result is assigned to, None for a temporary) and ``args`` (how the kernel
    spells each argument, None where unknown). Needs :func:`install_lowering_sites`."""
    from numba.cuda.core import ir

    stack = getattr(_lowering, "stack", None)
    if not stack:
        return None
    lower, inst = stack[-1]
    loc = getattr(inst, "loc", None) or getattr(lower, "loc", None)
    func_ir = getattr(lower, "func_ir", None)
    function = getattr(getattr(func_ir, "func_id", None), "func_qualname", None)
    target, args = None, ()
    if isinstance(inst, ir.assign_types):
        if not inst.target.name.startswith("$"):
            target = _user_name(inst.target.name)
        value = inst.value
        if isinstance(value, ir.expr_types) and value.op == "call" and func_ir is not None:
            args = tuple(_describe_var(func_ir, a) for a in value.args)
    return _pytypes.SimpleNamespace(
        filename=getattr(loc, "filename", None) or "<unknown>",
        line=getattr(loc, "line", None) or 0,
        function=function or "<unknown>",
        target=target,
        args=args,
    )


def install_debug_mode():
    """Hook 10: the lowering sites and the cache key of debug builds. Idempotent."""
    install_lowering_sites()
    install_debug_cache_key()
