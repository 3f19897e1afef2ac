"""On-disk caching of the ready-made kernels: ``@kernel_factory`` in place of ``@functools.lru_cache(maxsize=None)``
on a factory of ``@cuda.jit`` kernels.

A factory builds its kernel as a closure over compile-time constants and device functions. Numba's own
``cache=True`` keys such a closure on a pickle of its cells, which differs from process to process (they hold
dispatchers), so a second process would compile again. ``kernel_factory`` memoizes like ``lru_cache`` and gives
every ``cuda.jit`` kernel in the factory's result (the kernel itself, or one in a tuple, list or dict) Numba's
on-disk cache with an explicit key (:func:`numbatma.compile.enable_disk_cache`): the factory's module and
qualified name, its arguments (bound to its signature, defaults filled in), the kernel's position in the result,
its ``cuda.jit`` options, numbatma's version and a hash of the source of the whole installed package
(``numbatma``, ``numbatma.intrinsics``, ``numbatma.kernels``: every ``.py`` file, hashed once per process).

An argument (or option) is keyed by a repr that is the same in every process and tells apart values that make
different kernels: ``None``, bools, ints (NumPy's too), floats, strings, enum members, NumPy dtypes, Numba types
(``float32``), and tuples, lists and dicts of these. A factory called with anything else gets no disk cache for
that call (it is only memoized), as does a repr holding an address (``0x...``).

On by default; ``NUMBATMA_DISK_CACHE=0`` turns it off (read once, at import). Under the simulator and in the GPU
debug mode (``NUMBATMA_DEBUG``) nothing is cached on disk.
"""
from __future__ import annotations

import enum
import functools
import hashlib
import importlib
import inspect
import numbers
import os
import pathlib
import re

import numpy as np

import numbatma
from numbatma import SIMULATING, debug
from numbatma.cluster import ClusterLaunchBounds
from numbatma.compile import enable_disk_cache

PACKAGES = ("numbatma", "numbatma.intrinsics", "numbatma.kernels")
_OFF = ("0", "false", "no", "off")

ENABLED = os.environ.get("NUMBATMA_DISK_CACHE", "1").strip().lower() not in _OFF
"""Whether ``NUMBATMA_DISK_CACHE`` allows the on-disk cache (at import; default on)."""

ACTIVE = ENABLED and not SIMULATING and not debug.ENABLED
"""Whether kernel factories give their kernels the on-disk cache in this process."""

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


class Unstable(ValueError):
    """A value without a repr that is the same in every process (no disk cache for that call)."""


def stable_repr(value):
    """A repr of ``value`` that is the same in every process and differs between values that build different
    kernels; raises :class:`Unstable` for anything else."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        text = repr(value)
    elif isinstance(value, enum.Enum):
        text = f"{kind.__qualname__}.{value.name}"
    elif isinstance(value, np.bool_):
        text = repr(bool(value))
    elif isinstance(value, numbers.Integral):  # (NumPy integers: equal to the int, as the memo compares them)
        text = repr(int(value))
    elif isinstance(value, np.floating):
        text = repr(float(value))
    elif kind in (tuple, list):
        items = ", ".join(stable_repr(v) for v in value)
        text = f"({items}{',' if len(value) == 1 else ''})" if kind is tuple else f"[{items}]"
    elif kind is dict:
        items = sorted(f"{stable_repr(k)}: {stable_repr(v)}" for k, v in value.items())
        text = "{" + ", ".join(items) + "}"
    elif isinstance(value, (np.dtype, ClusterLaunchBounds)) or _is_numba_type(value):
        text = repr(value)  # (float32, Array(float32, 2, 'C'), dtype('float32'), cluster_launch_bounds(...))
    else:
        raise Unstable(f"no process-stable repr for a {kind.__module__}.{kind.__qualname__}")
    if _ADDRESS.search(text):
        raise Unstable(f"the repr {text!r} holds an address")
    return text


def _is_numba_type(value):
    from numba.core.types import Type

    return isinstance(value, Type)


@functools.lru_cache(maxsize=None)
def source_digest():
    """sha256 of the source of the installed numbatma (every ``.py`` file of its three packages, with its path
    relative to its package), computed once per process."""
    digest = hashlib.sha256()
    for name in PACKAGES:
        for folder in importlib.import_module(name).__path__:
            root = pathlib.Path(folder)
            for path in sorted(root.rglob("*.py")):
                relative = path.relative_to(root)
                if any(part == "__pycache__" or part.startswith(".") for part in relative.parts):
                    continue
                digest.update(f"{name}/{relative.as_posix()}\0".encode())
                digest.update(path.read_bytes())
                digest.update(b"\0")
    return digest.hexdigest()


def describe_call(factory, signature, args, kwargs):
    """``module.qualname(name=repr, ...)`` of a factory call (arguments bound, defaults filled in); raises
    :class:`Unstable` when an argument has no stable repr."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    described = ", ".join(f"{name}={stable_repr(value)}" for name, value in bound.arguments.items())
    return f"{factory.__module__}.{factory.__qualname__}({described})"


def _is_kernel(value):
    """A ``cuda.jit`` kernel (a dispatcher that is not a device function)."""
    options = getattr(value, "targetoptions", None)
    return isinstance(options, dict) and hasattr(value, "overloads") and not options.get("device")


def kernels_in(result, where=""):
    """(position, kernel) for every ``cuda.jit`` kernel in a factory's result: the result itself, or one inside
    tuples, lists and dicts (position ``[0]``, ``['name']``, ...)."""
    if _is_kernel(result):
        yield where, result
    elif type(result) in (tuple, list):
        for i, item in enumerate(result):
            yield from kernels_in(item, f"{where}[{i}]")
    elif type(result) is dict:
        for name in sorted(result, key=repr):
            yield from kernels_in(result[name], f"{where}[{name!r}]")


def cache_key(call, where, kernel):
    """The on-disk cache key of ``kernel`` at ``where`` in the result of ``call`` (:func:`describe_call`);
    raises :class:`Unstable` when one of its ``cuda.jit`` options has no stable repr."""
    options = stable_repr(dict(kernel.targetoptions))
    return f"{call}{where} options={options} numbatma={numbatma.__version__} source={source_digest()}"


def give_disk_cache(factory, signature, args, kwargs, result):
    """Give every kernel in ``result`` (what ``factory(*args, **kwargs)`` returned) its on-disk cache."""
    try:
        call = describe_call(factory, signature, args, kwargs)
    except Unstable:
        return
    for where, kernel in kernels_in(result):
        try:
            key = cache_key(call, where, kernel)
        except Unstable:
            continue
        try:
            enable_disk_cache(kernel, key)
        except Exception as exc:  # (e.g. no writable cache directory anywhere: the kernel just compiles)
            if not _warned:
                import warnings

                _warned.append(exc)
                warnings.warn(f"numbatma: no on-disk cache for {call}{where} ({type(exc).__name__}: {exc}); the "
                              f"kernel compiles in every process (further such failures are not reported)",
                              RuntimeWarning, stacklevel=3)
        else:
            _given.append(kernel)


_given = []  # (the memo keeps the kernels alive anyway)
_warned = []


def cached_kernels():
    """The kernels given the on-disk cache in this process so far (their ``stats`` count cache hits and misses)."""
    return list(_given)


def kernel_factory(factory):
    """Decorator for a factory of ``@cuda.jit`` kernels, in place of ``@functools.lru_cache(maxsize=None)``: the
    same memo (``cache_info``, ``cache_clear``), and each kernel of a new result gets Numba's on-disk cache keyed
    by the call (see the module docstring), so another process loads it instead of compiling it."""
    signature = inspect.signature(factory)

    @functools.lru_cache(maxsize=None)
    @functools.wraps(factory)
    def build(*args, **kwargs):
        result = factory(*args, **kwargs)
        if ACTIVE:
            give_disk_cache(factory, signature, args, kwargs, result)
        return result

    return build
