"""The function forms' plan cache: :func:`run` (what ``stream_copy(...)``, ``gemm(...)`` ... call) keeps the plans it
built in a small LRU cache and re-points a cached plan at the new arrays (:meth:`numbatma.kernels.Plan.rebind`)
instead of building it again."""
from __future__ import annotations

import collections
import threading

from numbatma import SIMULATING, array_layout

from ._launch import byte_extent as _extent
from ._rebind import is_scalar as _is_scalar

__all__ = ["run", "plan_cache_size", "clear_plan_cache", "plan_cache_info", "cache_key", "DEFAULT_PLAN_CACHE_SIZE"]

DEFAULT_PLAN_CACHE_SIZE = 32


_cache = collections.OrderedDict()  # key -> plan, least recently used first
_cache_lock = threading.Lock()
_cache_max = DEFAULT_PLAN_CACHE_SIZE
_stats = {"hits": 0, "misses": 0, "uncached": 0, "rebind_failed": 0}


def plan_cache_size(n=None):
    """The most plans the function forms keep (default ``DEFAULT_PLAN_CACHE_SIZE``, 32); with ``n``, set it
    (0 turns caching off; the least recently used plans beyond ``n`` are dropped). Returns the bound in force."""
    global _cache_max
    if n is not None:
        n = int(n)
        if n < 0:
            raise ValueError(f"plan_cache_size: n must be >= 0, got {n}")
        with _cache_lock:
            _cache_max = n
            while len(_cache) > n:
                _cache.popitem(last=False)
    return _cache_max


def clear_plan_cache():
    """Drop every cached plan (and with them the references they hold to the last arrays they ran on)."""
    with _cache_lock:
        _cache.clear()
        for k in _stats:
            _stats[k] = 0


def plan_cache_info():
    """``{"hits", "misses", "uncached", "rebind_failed", "size", "maxsize"}``: the cache's counts since the last
    clear (``rebind_failed``: cache hits whose plan could not be re-pointed, so a new one was built)."""
    with _cache_lock:
        return dict(_stats, size=len(_cache), maxsize=_cache_max)


def _device_id():
    if SIMULATING:
        return 0
    try:
        from numba import cuda

        return cuda.get_current_device().id
    except Exception:  # noqa: BLE001 - no driver (plans built offline): one device
        return None


def _option_key(value):
    """A hashable, type-aware form of an option value (raises TypeError when there is none)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(_option_key(v) for v in value)
    hash(value)
    return (type(value).__name__, value)


def cache_key(plan_class, arrays, options):
    """The cache key of ``run(plan_class, *arrays, **options)``, or None when the call cannot be cached (an
    unhashable option or scalar, an argument numbatma cannot read). See :func:`run`."""
    try:
        opts = tuple(sorted((k, _option_key(v)) for k, v in options.items()))
        parts, extents = [], []
        for a in arrays:
            if _is_scalar(a):
                parts.append(("scalar", _option_key(a)))
                continue
            lay = array_layout(a)
            lo, hi = _extent(lay)
            overlaps = tuple(j for j, (l2, h2) in extents if lo < h2 and l2 < hi or lo == l2)
            extents.append((len(parts), (lo, hi)))
            parts.append((type(a).__name__, lay.shape, lay.strides, lay.dtype, lay.ptr % 1024, overlaps))
        key = (plan_class, opts, tuple(parts), _device_id())
        hash(key)
        return key
    except Exception:  # noqa: BLE001 - unhashable options, arguments numbatma cannot read: not cached
        return None


def run(plan_class, *arrays, stream=None, **options):
    """The function form of a plan: ``plan_class(*arrays, **options).launch(stream)`` with the plan cached;
    returns the plan's output.

    The cache (LRU, :func:`plan_cache_size` plans, :func:`clear_plan_cache`) is keyed by the plan class, the
    options (by type and value; an unhashable option: no caching for that call), and for every positional
    argument: for an array its type name, shape, byte strides, dtype, ``ptr % 1024`` (plans may depend on the
    alignment) and which earlier arguments it overlaps; for a scalar its type and value; and the current device.
    On a hit the plan is re-pointed at the new arrays (:meth:`Plan.rebind`). Plan classes with ``rebindable =
    False`` and plans whose ``cacheable`` is False are built every call. A plan in use is taken out of the cache
    (a concurrent call with the same key builds its own).

    Retention: a cached plan keeps references to the arrays of its last call (descriptors, views, output), so the
    cache keeps at most ``plan_cache_size()`` plans' last arrays alive; :func:`clear_plan_cache` frees them."""
    key = cache_key(plan_class, arrays, options) if _cache_max and plan_class.rebindable else None
    if key is None:
        with _cache_lock:
            _stats["uncached"] += 1
        return plan_class(*arrays, **options).launch(stream)
    with _cache_lock:
        plan = _cache.pop(key, None)
        _stats["hits" if plan is not None else "misses"] += 1
    if plan is not None:
        try:
            plan.rebind(*arrays)
        except Exception:  # noqa: BLE001 - NotRebindable, or a re-point the driver refused: a fresh plan is always right
            with _cache_lock:
                _stats["rebind_failed"] += 1
            plan = None
    if plan is None:
        plan = plan_class(*arrays, **options)
    out = plan.launch(stream)
    if plan.cacheable:
        with _cache_lock:
            _cache[key] = plan
            while len(_cache) > _cache_max:
                _cache.popitem(last=False)
    return out
