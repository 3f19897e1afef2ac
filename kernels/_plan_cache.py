"""The function forms' plan cache: :func:`run` (what ``stream_copy(...)``, ``gemm(...)`` ... call) keeps the plans it
built in a small LRU cache and re-points a cached plan at the new arrays (:meth:`numbatma.kernels.Plan.rebind`)
instead of building it again."""
from __future__ import annotations

import collections
import threading
from operator import is_ as _is

from numbatma import layout_record
from numbatma.devices import DEVICE_READERS as _device_readers
from numbatma.devices import array_device, current_device, device_reader, several_devices

from ._rebind import _scalar_types
from ._rebind import is_scalar as _is_scalar

__all__ = ["run", "plan_cache_size", "clear_plan_cache", "plan_cache_info", "cache_key", "DEFAULT_PLAN_CACHE_SIZE"]

DEFAULT_PLAN_CACHE_SIZE = 32


_cache = collections.OrderedDict()  # key -> plan, least recently used first
_cache_lock = threading.Lock()
_cache_max = DEFAULT_PLAN_CACHE_SIZE
_stats = {"hits": 0, "misses": 0, "uncached": 0, "rebind_failed": 0}
_NO_DEVICE = object()


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
        _last_call.clear()
        for k in _stats:
            _stats[k] = 0


def plan_cache_info():
    """``{"hits", "misses", "uncached", "rebind_failed", "size", "maxsize"}``: the cache's counts since the last
    clear (``rebind_failed``: cache hits whose plan could not be re-pointed, so a new one was built)."""
    with _cache_lock:
        return dict(_stats, size=len(_cache), maxsize=_cache_max)


def _option_key(value):
    """A hashable, type-aware form of an option value (raises TypeError when there is none)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(_option_key(v) for v in value)
    hash(value)
    return (type(value).__name__, value)


def cache_key(plan_class, arrays, options):
    """The cache key of ``run(plan_class, *arrays, **options)``, or None when the call cannot be cached (an
    unhashable option or scalar, an argument numbatma cannot read). See :func:`run`."""
    key = _key_and_facts(plan_class, arrays, options)[0]
    try:
        hash(key)
    except TypeError:  # (an unhashable scalar or option value)
        return None
    return key


def _key_and_facts(plan_class, arrays, options):
    """(the cache key, the arguments' layout_facts with None for a scalar, the pairs ``(j, i)``, ``j < i``, of
    arguments that overlap), or (None, None, None). Each array is read once (:func:`numbatma.layout_record`: its
    layout interned, so the key holds the layout's id, and its byte span comes with it) and its device once
    (:func:`numbatma.array_device`'s reader of its class: a torch tensor's ``get_device()``)."""
    try:
        opts = tuple(sorted((k, _option_key(v)) for k, v in options.items())) if options else ()
        parts, facts, spans, overlap = [], [], [], ()
        scalar_types, readers = _scalar_types, _device_readers
        device = devices = _NO_DEVICE
        several = several_devices()  # (one device: every array is on it; nothing to read)
        for a in arrays:
            scalar = scalar_types.get(type(a))
            if scalar is None:
                scalar = _is_scalar(a)
            if scalar:
                parts.append(("scalar", _option_key(a)))
                facts.append(None)
                continue
            ptr, record = layout_record(a)  # (shape, byte strides, dtype, id, lo, hi)
            if several:
                read = readers.get(type(a))
                if read is None:
                    read = device_reader(type(a))
                where = read(a)  # (a torch tensor: its get_device())
                if device is _NO_DEVICE:
                    device = where
                elif where != device:
                    devices = where  # (arrays of several devices: see below)
            lo, hi = ptr + record[4], ptr + record[5]
            overlaps = ()
            for j, lo2, hi2 in spans:
                if lo < hi2 and lo2 < hi or lo == lo2:
                    overlaps += (j,)
                    overlap += ((j, len(parts)),)
            spans.append((len(parts), lo, hi))
            parts.append((type(a), record[3], ptr & 1023, overlaps))
            facts.append((ptr, record[0], record[1], record[2]))
        if devices is not _NO_DEVICE:  # (several devices, peer access: each one's, and the current device's)
            device = (tuple(None if f is None else array_device(a) for a, f in zip(arrays, facts)), current_device())
        elif device is _NO_DEVICE:  # (one device, or no array)
            device = None
        return (plan_class, opts, tuple(parts), device), tuple(facts), overlap
    except Exception:  # noqa: BLE001 - unhashable options, arguments numbatma cannot read: not cached
        return None, None, None


_last_call = {}  # plan class -> (arguments, options, (key, facts, overlap)) of its last cached call


def _same_call(last, arrays, options):
    """Whether a call of ``arrays`` and ``options`` is the one ``last`` (an entry of ``_last_call``) recorded: the same
    argument objects (a scalar computed anew each call is another object: then the full key), each array read again (:func:`numbatma.layout_record`)
    at the same address with the same interned layout, options of the same values and types."""
    old, old_options, result = last
    if len(arrays) != len(old) or not all(map(_is, arrays, old)):  # (the same objects: scalars too, so equal ones)
        return False
    if options or old_options:
        if options != old_options or any(type(v) is not type(old_options[k]) for k, v in options.items()):
            return False
    for a, f in zip(arrays, result[1]):
        if f is not None:
            ptr, record = layout_record(a)
            if ptr != f[0] or record[0] is not f[1] or record[1] is not f[2] or record[2] is not f[3]:
                return False
    return True


def _call_key(plan_class, arrays, options):
    """:func:`_key_and_facts` of a call, reusing the last call's of ``plan_class`` when it had the very same argument
    objects and options, each array read again at the same address and of the same layout (:func:`_same_call`):
    then every part of the key is what it was (layout ids, alignment, overlaps, the arrays' device: an array's device
    does not change while its address does not). Not reused for arrays of several devices (peer access), whose key
    holds the current device. The usual loop over the same tensors then reads each tensor once and builds nothing;
    a call with other tensors pays a look-up and one comparison more."""
    last = _last_call.get(plan_class)
    if last is not None:
        try:
            if _same_call(last, arrays, options):
                return last[2]
        except Exception:  # noqa: BLE001 - an argument that cannot be read or compared now: the full key says why
            pass
    result = _key_and_facts(plan_class, arrays, options)
    key = result[0]
    if key is not None and type(key[3]) is not tuple:
        _last_call[plan_class] = (arrays, options, result)
    return result


def run(plan_class, *arrays, stream=None, **options):
    """The function form of a plan: ``plan_class(*arrays, **options).launch(stream)`` with the plan cached;
    returns the plan's output.

    The cache (LRU, :func:`plan_cache_size` plans, :func:`clear_plan_cache`) is keyed by the plan class, the
    options (by type and value; an unhashable option: no caching for that call), and for every positional
    argument: for an array its type, layout (shape, byte strides, dtype: an id of the interned layout,
    :func:`numbatma.layout_record`), ``ptr % 1024`` (plans may depend on the alignment) and which earlier arguments
    it overlaps; for a scalar its type and value; and, in a process that sees several devices, the device the arrays
    are on (:func:`numbatma.array_device`; arrays of several devices - peer access - give each one's and the current
    device's), so arrays of another device
    never re-point a plan of this one: the plan runs on its arrays' device (:attr:`Plan.device`), whatever device is
    current. Arrays are read with :func:`numbatma.layout_record` (torch tensors through their methods) and their
    device's reader, once per call. On a hit:

    * the very same array objects at the same addresses as the plan's last call: nothing to do, the plan launches
      as it is (a dict look-up and the launch);
    * other arrays (or the same objects at other addresses): the plan is re-pointed at them
      (:meth:`Plan.rebind`'s work: its map of where each argument's descriptors, views and references sit is made
      once and compiled into one function that each re-point runs; descriptors are re-pointed in place, the
      prepared launch gets the new views' and arrays' addresses patched into its parameter block at the launch);
    * a plan with outputs of its own (:meth:`Plan.owned_output`, e.g. attention's ``lse``) gets fresh ones
      (:meth:`Plan.fresh_outputs`): each call returns its own.

    A re-point that fails builds a fresh plan. Plan classes with ``rebindable = False`` and plans whose
    ``cacheable`` is False are built every call. A plan in use is taken out of the cache (a concurrent call with the
    same key builds its own).

    Retention: a cached plan keeps references to the arrays of its last call (descriptors, views, output, its
    prepared launch), so the cache keeps at most ``plan_cache_size()`` plans' last arrays alive, plus the arguments of
    each plan class's last call (the key reused for the very same arguments: :func:`_call_key`);
    :func:`clear_plan_cache` frees them."""
    key = None
    if _cache_max and plan_class.rebindable:
        key, facts, overlap = _call_key(plan_class, arrays, options)
    if key is not None:
        try:
            with _cache_lock:
                plan = _cache.pop(key, None)
                _stats["hits" if plan is not None else "misses"] += 1
        except TypeError:  # (an unhashable scalar or option value: the key cannot be looked up)
            key = None
    if key is None:
        with _cache_lock:
            _stats["uncached"] += 1
        return plan_class(*arrays, **options).launch(stream)
    if plan is not None:
        try:
            if plan._owned or not _same_arrays(plan, arrays, facts):
                plan._repoint(arrays, facts, fresh=True, overlap=overlap)
        except Exception:  # noqa: BLE001 - NotRebindable, or a re-point the driver refused: a fresh plan is always right
            with _cache_lock:
                _stats["rebind_failed"] += 1
            plan = None
    if plan is None:
        plan = plan_class(*arrays, **options)
        plan.__dict__["_user_facts"] = facts
    out = plan.launch(stream)
    if plan.cacheable:
        with _cache_lock:
            _cache[key] = plan
            while len(_cache) > _cache_max:
                _cache.popitem(last=False)
    return out


def _same_arrays(plan, arrays, facts):
    """Whether ``plan`` already points at ``arrays``: the same objects, at the same addresses (a torch tensor can
    move in place: ``set_``, ``resize_``)."""
    old, old_facts = plan._user_arrays, plan._facts()
    for a, b, f, g in zip(arrays, old, facts, old_facts):
        if a is not b or f is not None and f[0] != g[0]:
            return False
    return True
