"""The function forms' plan cache: :func:`run` (what ``stream_copy(...)``, ``gemm(...)`` ... call) keeps the plans it
built in a small LRU cache and re-points a cached plan at the new arrays instead of building it again.

It uses a plan through the plan contract only (a CPU test reads this module and fails on any underscore attribute of a
plan): the plan class's ``rebindable``, building a plan, ``plan.cacheable``, ``plan.owned_outputs``,
``plan.reuse(arrays, facts=..., overlap=...)`` (the argument rules for new arrays, the re-point, fresh owned outputs;
see :meth:`numbatma.kernels.Plan.reuse`), ``plan.fresh_outputs(overlap=...)`` (a repeated call) and
``plan.launch(stream)``."""
from __future__ import annotations

import itertools
import operator
import threading

from numbatma import layout_record
from numbatma.devices import DEVICE_READERS as _device_readers
from numbatma.devices import array_device, current_device, device_reader, several_devices
from numbatma.launch import scalar_key

from ._rebind import NotRebindable, _scalar_types
from ._rebind import is_scalar as _is_scalar
from ._rebind import overlapping

__all__ = ["run", "plan_cache_size", "clear_plan_cache", "plan_cache_info", "cache_key", "cached_plans",
           "DEFAULT_PLAN_CACHE_SIZE"]

DEFAULT_PLAN_CACHE_SIZE = 32


_cache = {}  # key -> _Entry: the cached plans, except each plan class's last one
_hot = {}  # plan class -> _Entry of its last call (taken out while a call uses it; see run)
_cache_lock = threading.Lock()  # (guards _cache, _stats and moves into and out of _hot; a call's own take of its
_cache_max = DEFAULT_PLAN_CACHE_SIZE  # plan class's _hot entry and its return are single dict operations)
_stats = {"hits": 0, "misses": 0, "uncached": 0, "rebind_failed": 0}
_ticks = itertools.count(1)  # (use order: an entry's tick is that of its last call; the least recent is evicted)
_generation = [0]  # (bumped by clear_plan_cache and plan_cache_size: an entry of an older one is not put back)
_NO_DEVICE = object()
_tick = operator.attrgetter("tick")


class _Entry:
    """A cached plan and its key, with what :func:`run` needs to tell that a call repeats the plan's last one: that
    call's arguments (the objects), options, each array's layout facts (address, and the interned shape, strides and
    dtype of :func:`numbatma.layout_record`; None for a scalar), the overlapping pairs as the key found them (what a
    plan with outputs of its own is re-pointed with) and ``owned``: whether the plan has outputs of its own
    (:attr:`Plan.owned_outputs`, fixed once it is built). ``tick`` orders uses (LRU); ``hits``: hits counted while
    the entry is its plan class's last call (owned by the call that took it, so counted without the lock)."""
    __slots__ = ("key", "plan", "arrays", "options", "facts", "overlap", "owned", "tick", "hits", "generation")

    def __init__(self, key, plan):
        self.key, self.plan, self.hits, self.generation = key, plan, 0, _generation[0]


def plan_cache_size(n=None):
    """The most plans the function forms keep (default ``DEFAULT_PLAN_CACHE_SIZE``, 32); with ``n``, set it
    (0 turns caching off; the least recently used plans beyond ``n`` are dropped). Returns the bound in force."""
    global _cache_max
    if n is not None:
        from ._options import int_option

        n = int_option("plan_cache_size", "n", n, 0)
        with _cache_lock:
            _cache_max = n
            _generation[0] += 1  # (a plan in use by a call now in flight is not put back: it may be one too many)
            for entry in list(_cache.values()) + list(_hot.values()):
                entry.generation = _generation[0]
            _trim()
    return _cache_max


def clear_plan_cache():
    """Drop every cached plan (and with them the references they hold to the last arrays they ran on)."""
    with _cache_lock:
        _generation[0] += 1
        _cache.clear()
        _hot.clear()
        for k in _stats:
            _stats[k] = 0


def plan_cache_info():
    """``{"hits", "misses", "uncached", "rebind_failed", "size", "maxsize"}``: the cache's counts since the last
    clear (``rebind_failed``: cache hits whose plan could not be re-pointed, so a new one was built). A call in flight
    on another thread holds its plan, which is counted again once the call is done."""
    with _cache_lock:
        hot = list(_hot.values())
        return dict(_stats, hits=_stats["hits"] + sum(e.hits for e in hot), size=len(_cache) + len(hot),
                    maxsize=_cache_max)


def cached_plans():
    """The cached plans, least recently used first (for tests and debugging)."""
    with _cache_lock:
        entries = list(_cache.values()) + list(_hot.values())
    return [e.plan for e in sorted(entries, key=_tick)]


def _retire(entry):
    """Move ``entry`` (no longer its plan class's last call, or not put back as one) into ``_cache``: its hits into
    the counts. Under the lock."""
    _stats["hits"] += entry.hits
    entry.hits = 0
    if entry.generation == _generation[0]:
        _cache[entry.key] = entry


def _trim():
    """Drop the least recently used plans beyond the bound. Under the lock."""
    while len(_cache) + len(_hot) > _cache_max:
        entries = list(_cache.values()) + list(_hot.values())
        if not entries:
            return
        victim = min(entries, key=_tick)
        if _cache.get(victim.key) is victim:
            del _cache[victim.key]
        elif _hot.get(victim.key[0]) is victim:
            _hot.pop(victim.key[0], None)  # (a call may have taken it meanwhile: then it is not put back)
        victim.generation = -1
        _stats["hits"] += victim.hits
        victim.hits = 0


def _option_key(value):
    """A hashable, type-aware form of an option value (raises TypeError when there is none)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(_option_key(v) for v in value)
    return scalar_key(value)


def cache_key(plan_class, arrays, options):
    """The cache key of ``run(plan_class, *arrays, **options)``, or None when the call cannot be cached (an
    unhashable option or scalar, an argument numbatma cannot read). See :func:`run`."""
    return _key_and_facts(plan_class, arrays, options)[0]


def _key_and_facts(plan_class, arrays, options):
    """(the cache key, the arguments' layout_facts with None for a scalar, the pairs ``(j, i)``, ``j < i``, of
    arguments that overlap: :func:`overlapping`), or three Nones.
    Each array is read once (:func:`numbatma.layout_record`: its layout interned, so the key holds the layout's id,
    and its byte span comes with it) and its device once (:func:`numbatma.array_device`'s reader of its class: a
    torch tensor's ``get_device()``)."""
    try:
        opts = tuple(sorted((k, _option_key(v)) for k, v in options.items())) if options else ()
        parts, facts, extents = [], [], []
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
                extents.append(None)
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
            parts.append((type(a), record[3], ptr & 1023))
            facts.append((ptr, record[0], record[1], record[2]))
            extents.append((ptr + record[4], ptr + record[5]))
        overlap = tuple(overlapping(extents))
        for i, j in overlap:  # (an array's part names the earlier arguments it overlaps)
            parts[j] += (i,)
        if devices is not _NO_DEVICE:  # (several devices, peer access: each one's, and the current device's)
            device = (tuple(None if f is None else array_device(a) for a, f in zip(arrays, facts)), current_device())
        elif device is _NO_DEVICE:  # (one device, or no array)
            device = None
        key = (plan_class, opts, tuple(parts), device)
        hash(key)
        return key, tuple(facts), overlap
    except Exception:  # noqa: BLE001 - unhashable options or scalars, arguments numbatma cannot read: not cached
        return None, None, None


def _repeats(entry, arrays, options):
    """Whether a call of ``arrays`` and ``options`` repeats the last call of ``entry``'s plan: the same argument
    objects (or equal ints: a float must be the same object, as ``-0.0 == 0.0``), each array read again
    (:func:`numbatma.layout_record`) at the same address with the same interned layout, options of the same values
    and types. Then every part of the key is what it was (layout ids, alignment, overlaps, the arrays' device: an
    array's device does not change while its address does not) and the plan points at these very arrays."""
    old = entry.arrays
    if len(arrays) != len(old):
        return False
    if options or entry.options:
        old_options = entry.options
        if options != old_options or any(type(v) is not type(old_options[k]) for k, v in options.items()):
            return False
    read_layout = layout_record
    for a, o, f in zip(arrays, old, entry.facts):
        if f is None:
            if a is not o and (type(a) is not int or type(o) is not int or a != o):
                return False
        elif a is not o:
            return False
        else:
            ptr, record = read_layout(a)  # (interned: the same layout is the very same shape, strides and dtype)
            if ptr != f[0] or record[0] is not f[1] or record[1] is not f[2] or record[2] is not f[3]:
                return False
    return True


def run(plan_class, *arrays, stream=None, **options):
    """The function form of a plan: ``plan_class(*arrays, **options).launch(stream)`` with the plan cached;
    returns the plan's output.

    The cache (:func:`plan_cache_size` plans, least recently used dropped first, :func:`clear_plan_cache`) is keyed
    by the plan class, the options (by type and value; an unhashable option: no caching for that call), and for every
    positional argument: for an array its type, layout (shape, byte strides, dtype: an id of the interned layout,
    :func:`numbatma.layout_record`), ``ptr % 1024`` (plans may depend on the alignment) and which earlier arguments
    it overlaps; for a scalar its type and value; and, in a process that sees several devices, the device the arrays
    are on (:func:`numbatma.array_device`; arrays of several devices - peer access - give each one's and the current
    device's), so arrays of another device never re-point a plan of this one: the plan runs on its arrays' device
    (:attr:`Plan.device`), whatever device is current. Arrays are read with :func:`numbatma.layout_record` (torch
    tensors through their methods) and their device's reader, once per call.

    * **A repeated call** (the usual loop): each plan class's last call is kept with its plan. A call with the very
      same argument objects, each at the same address with the same layout, and the same options
      (:func:`_repeats`), launches that plan as it is: no key is built, nothing is re-pointed (each array read once,
      a dict take and put back, the launch).
    * **Other arrays** (or the same objects at other addresses) of a cached key: :meth:`Plan.reuse` checks the
      argument rules for them (a refusal is raised to the caller, the plan stays cached) and re-points the plan
      (:meth:`Plan.rebind`'s work: its map of where each argument's descriptors, views and references sit is made
      once and compiled into one function that each re-point runs; descriptors are re-pointed in place, the
      prepared launch gets the new views' and arrays' addresses patched into its parameter block at the launch).
    * A plan with outputs of its own (:meth:`Plan.owned_output`, e.g. attention's ``lse``) gets fresh ones
      (:meth:`Plan.reuse`) every call, a repeated call too, so each call returns its own.

    A re-point that fails builds a fresh plan. Plan classes with ``rebindable = False`` and plans whose
    ``cacheable`` is False are built every call. A plan in use is taken out of the cache (a concurrent call with the
    same key builds its own).

    Retention: a cached plan keeps references to the arrays of its last call (descriptors, views, output, its
    prepared launch; its entry the arguments themselves), so the cache keeps at most ``plan_cache_size()`` plans' last
    arrays alive; :func:`clear_plan_cache` frees them."""
    entry = _hot.pop(plan_class, None)  # (taken: no other call uses its plan until it is put back)
    if entry is not None:
        try:
            repeated = _repeats(entry, arrays, options)
        except Exception:  # noqa: BLE001 - an argument that cannot be read now: the full key says why
            repeated = False
        if repeated:
            plan = entry.plan
            if entry.owned:  # (outputs of its own, e.g. attention's lse: fresh ones each call)
                try:
                    plan.fresh_outputs(overlap=entry.overlap)  # (the very arrays it points at: _repeats)
                except Exception:  # noqa: BLE001 - the keyed path re-points again, or builds a new plan
                    return _run_keyed(plan_class, entry, arrays, stream, options)
            entry.hits += 1
            entry.tick = next(_ticks)
            try:
                return plan.launch(stream)
            finally:
                if entry.generation != _generation[0] or _hot.setdefault(plan_class, entry) is not entry:
                    with _cache_lock:  # (cleared meanwhile, or another call's plan is the last one now)
                        _retire(entry)
                        _trim()
    return _run_keyed(plan_class, entry, arrays, stream, options)


def _run_keyed(plan_class, hot, arrays, stream, options):
    """:func:`run` past the repeated-call path: the key, a look-up, a re-point or a new plan. ``hot``: the plan
    class's last-call entry that :func:`run` took (or None), returned to the cache here."""
    key = None
    if _cache_max and plan_class.rebindable:
        key, facts, overlap = _key_and_facts(plan_class, arrays, options)
    if key is None:
        with _cache_lock:
            if hot is not None:
                _retire(hot)
            _stats["uncached"] += 1
        return plan_class(*arrays, **options).launch(stream)
    if hot is not None and hot.key == key and hot.generation == _generation[0]:
        entry = hot  # (the last call's plan, for other arrays of its key)
        entry.hits += 1
    else:
        with _cache_lock:
            if hot is not None:
                _retire(hot)
            entry = _cache.pop(key, None)
            if entry is None:
                _stats["misses"] += 1
            else:
                _stats["hits"] += 1
    plan = None
    if entry is not None:
        plan = entry.plan
        try:  # (the key vouches for the layouts, scalars and device: Plan.reuse's facts)
            plan.reuse(arrays, facts=facts, overlap=overlap)
        except NotRebindable:  # (a re-point that failed, whatever the cause: a fresh plan is always right)
            with _cache_lock:
                _stats["rebind_failed"] += 1
                _stats["hits"] += entry.hits
            plan = entry = None
        except Exception:  # (the argument rules refused the arrays: read-only output, an overlap the key admits)
            with _cache_lock:  # (the entry goes back: reuse changed nothing, its plan is fine for other arrays)
                _retire(entry)
            raise
    if plan is None:
        plan = plan_class(*arrays, **options)  # (it records the arrays' layout facts as it checks them)
        entry = _Entry(key, plan)
    entry.arrays, entry.options, entry.facts, entry.overlap, entry.tick = arrays, options, facts, overlap, next(_ticks)
    entry.owned = bool(plan.owned_outputs)
    out = plan.launch(stream)
    if plan.cacheable:
        with _cache_lock:
            if entry.generation == _generation[0]:
                if type(key[3]) is tuple:  # (peer access: the key holds the current device)
                    _cache[key] = entry
                else:
                    last = _hot.pop(plan_class, None)
                    if last is not None:
                        _retire(last)
                    _hot[plan_class] = entry
                _trim()
    elif entry.hits:
        with _cache_lock:
            _stats["hits"] += entry.hits
    return out

