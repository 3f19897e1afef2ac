"""The on-disk cache of numbatma's kernels, keyed by an explicit string (hook 12, applied to one kernel at a time).

A seam module (numba-cuda private names: ``numba.cuda.dispatcher.CUDACache`` and its ``_index_key``,
``_load_overload`` / ``_save_overload``, ``_cache_file``, ``_impl``; ``_Kernel._rebuild``). Hook 12 is described in
``numbatma/_numba_internals.py``'s docstring; ``numbatma.compile.enable_disk_cache`` is its public door;
``tests/test_numba_internals.py`` checks the upstream names (:func:`_disk_cache_hook_points`).
"""
from __future__ import annotations


# -- hook 12: on-disk cache of numbatma's kernels -------------------------------------------------------------
_KeyedCache = None  # the CUDACache subclass, made on first use (numba.cuda.dispatcher is not imported before)
_cache_warned = set()


def _disk_cache_hook_points():
    """The upstream objects hook 12 relies on (tests check they exist and keep the shape the subclass mirrors)."""
    from numba.cuda import dispatcher
    from numba.cuda.core import caching

    return {
        "CUDADispatcher.enable_caching": (dispatcher.CUDADispatcher, "enable_caching"),
        "CUDADispatcher.compile": (dispatcher.CUDADispatcher, "compile"),
        "CUDACache._index_key": (dispatcher.CUDACache, "_index_key"),
        "CUDACache.load_overload": (dispatcher.CUDACache, "load_overload"),
        "Cache._index_key": (caching.Cache, "_index_key"),
        "Cache._load_overload": (caching.Cache, "_load_overload"),
        "Cache._save_overload": (caching.Cache, "_save_overload"),
        "IndexDataCacheFile.save": (caching.IndexDataCacheFile, "save"),
        "IndexDataCacheFile.load": (caching.IndexDataCacheFile, "load"),
        "_Kernel._rebuild": (dispatcher._Kernel, "_rebuild"),
    }


def _cache_warning(what, cache, exc):
    """Warn (once per process and kind of failure) that the on-disk cache could not ``what`` a kernel."""
    import warnings

    if what in _cache_warned:
        return
    _cache_warned.add(what)
    warnings.warn(
        f"numbatma: the on-disk kernel cache could not {what} {cache._name} ({type(exc).__name__}: {exc}); the "
        f"kernel is compiled instead (further such failures are not reported)", RuntimeWarning, stacklevel=3,
    )


def _keyed_cache_class():
    """numba-cuda's ``CUDACache`` with an explicit key in place of the hash of the closure cells (made once)."""
    global _KeyedCache
    if _KeyedCache is not None:
        return _KeyedCache
    import hashlib

    import numba_cuda
    from numba.cuda import dispatcher

    def sha256(data):
        return hashlib.sha256(data).hexdigest()

    class KeyedCUDACache(dispatcher.CUDACache):
        """The on-disk cache of one kernel whose identity is ``key`` (a string naming everything its code depends
        on besides the bytecode): the index key is upstream's with ``sha256(key)`` where upstream hashes a
        cloudpickle of the closure cells."""

        def __init__(self, py_func, key, targetoptions):
            super().__init__(py_func)
            self.numbatma_key = key
            self._key_digest = sha256(key.encode())
            self._code_digest = sha256(py_func.__code__.co_code)
            self._targetoptions = targetoptions  # (the dispatcher's own dict: launch_bounds as compiled)

        def _index_key(self, sig, codegen):
            # upstream (Cache._index_key): (sig, magic tuple, numba-cuda version, (bytecode hash, cells hash))
            key = (sig, codegen.magic_tuple(), numba_cuda.__version__, (self._code_digest, self._key_digest))
            if self._launch_config_key is not None:  # (CUDACache._index_key)
                key += (("launch_config", self._launch_config_key),)
            from . import debug

            extra = debug.cache_key()  # (hook 10)
            return key if extra is None else key + (extra,)

        def _load_overload(self, sig, target_context):
            if not self._enabled:
                return None
            try:
                key = self._index_key(sig, target_context.codegen())
                data = self._cache_file.load(key)
                # (stored as (key, payload): a data file that a concurrent save of another entry overwrote - the
                # index numbers data files per process - holds another key and is a miss)
                if not (isinstance(data, tuple) and len(data) == 2 and data[0] == key):
                    return None
                kernel = self._impl.rebuild(target_context, data[1])
            except Exception as exc:  # (a damaged or foreign file: compile instead)
                _cache_warning("load", self, exc)
                return None
            kernel.launch_bounds = self._targetoptions.get("launch_bounds")  # (_Kernel._rebuild drops it)
            return kernel

        def _save_overload(self, sig, data):
            if not self._enabled:
                return
            try:
                if not self._impl.check_cachable(data):
                    return
                self._impl.locator.ensure_cache_path()
                key = self._index_key(sig, data.codegen)
                self._cache_file.save(key, (key, self._impl.reduce(data)))
            except Exception as exc:  # (unwritable directory, a kernel numba cannot serialise: just no cache)
                _cache_warning("save", self, exc)

    _KeyedCache = KeyedCUDACache
    return _KeyedCache


def enable_disk_cache(dispatcher, key):
    """Turn on numba-cuda's on-disk cache for ``dispatcher`` (a ``cuda.jit`` kernel, not a device function), keyed
    by ``key`` (a non-empty string) instead of the contents of the kernel's closure cells: kernels whose code
    depends on anything besides their bytecode (closures of a factory, device functions they call) must have
    that in ``key``. Files go where ``cache=True`` puts them (``NUMBA_CACHE_DIR``, else ``__pycache__`` beside
    the kernel's source when writable, else numba's user-wide cache directory); every closure of one factory
    shares one index file, an entry per key and signature. Returns ``dispatcher``."""
    from numba.cuda import dispatcher as nbdispatcher

    if not isinstance(key, str) or not key:
        raise TypeError(f"enable_disk_cache: key must be a non-empty string, got {key!r}")
    if not isinstance(dispatcher, nbdispatcher.CUDADispatcher) or dispatcher.targetoptions.get("device"):
        raise TypeError(f"enable_disk_cache takes a cuda.jit kernel (not a device function), got {dispatcher!r}")
    dispatcher._cache = _keyed_cache_class()(dispatcher.py_func, key, dispatcher.targetoptions)
    return dispatcher


def disk_cache_key(dispatcher):
    """The key :func:`enable_disk_cache` gave ``dispatcher``, or None when it has none."""
    return getattr(getattr(dispatcher, "_cache", None), "numbatma_key", None)
