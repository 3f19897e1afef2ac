"""The plan contract every kernel of :mod:`numbatma.kernels` follows, and the helper behind the function forms.

A *plan* is built once from the arrays and options (validation, TensorMaps, kernel choice; no GPU needed) and
launched any number of times. Every plan class derives from :class:`Plan` and provides:

* ``kernel``: the ``@cuda.jit`` kernel, or None when there is nothing to launch (an empty array);
* ``grid``: blocks (an int; persistent kernels count the GPU's SMs on first use);
* ``block``: threads per block (an int);
* ``shared_mem``: bytes of dynamic shared memory per block;
* ``args``: the kernel's arguments, valid offline (``numbatma.compile.compile_ptx(plan.kernel.py_func,
  plan.args)``); ``launch_args()`` gives them as a launch passes them (views converted once);
* ``output``: the array the plan writes;
* ``launch(stream=None)``: launch on ``stream`` (asynchronously) and return ``output``.

Streams: ``launch`` takes a numba, torch, CuPy or cuda.core stream, anything with ``__cuda_stream__``, or a raw
handle (:func:`numbatma.streams.as_stream`). With none given, a plan built from torch tensors launches on torch's
*current* stream (so it orders with the torch ops around it), any other on the legacy default stream.

Launches are *prepared* (:func:`numbatma.prepare_launch`: the arguments converted once, a few microseconds of host
time per launch instead of tens) on first use, and again whenever ``kernel`` or a scalar argument changed (such as
``Axpy.a``, ``Gemm.alpha``/``beta``, ``Attention.scale``); the arrays and
descriptors are fixed when the plan is built until
:meth:`Plan.rebind` re-points it at other arrays, which drops the prepared launch. Plans never
launch dependent (``prepare_launch(..., scoped=False)``: ``numbatma.dependent_launch()`` does not reach them), as
their kernels do not call ``griddepcontrol_wait`` yet.

The function form of a plan (``stream_copy(src, dst, stream=..., **options)`` etc.) is :func:`run` : look the
plan up in a small LRU cache (:func:`plan_cache_size`, :func:`clear_plan_cache`; see :func:`run` for the key),
re-point a cached plan at the new arrays (:meth:`Plan.rebind`) or build one, launch it on ``stream``, return its
output.
"""
from __future__ import annotations

from numbatma import array_layout, launch_argument, prepare_launch
from numbatma.streams import as_stream, default_stream

from ._rebind import NotRebindable, Range, Rebinder, is_scalar

__all__ = ["Plan", "NotRebindable", "run", "plan_cache_size", "clear_plan_cache", "plan_cache_info"]

_DROPPED = ("_user_arrays", "_prepared_launch")  # (not walked by rebind: reset instead)


class Plan:
    """Base of the plans of :mod:`numbatma.kernels` (see the module docstring for the contract).

    A subclass sets ``kernel``, ``block``, ``shared_mem`` (attributes or properties) and provides ``grid``,
    ``args`` and ``output``; it overrides :meth:`launch` only when a launch is more than one kernel call
    (and then keeps its return convention)."""

    kernel = None
    block = 32
    shared_mem = 0
    #: Whether :meth:`rebind` can re-point a plan of this class at other arrays of the same layout (then the
    #: function form caches its plans). A class whose plans depend on the arrays in a way :meth:`rebind` does
    #: not handle sets it False.
    rebindable = True

    @property
    def cacheable(self):
        """Whether :func:`run` may keep this plan for later calls (``rebindable``; a plan that allocated an
        array of its own that it returns, which a later call must not share, says False)."""
        return type(self).rebindable

    def __new__(cls, *arrays, **options):
        plan = super().__new__(cls)
        plan._user_arrays = arrays  # (what a launch without a stream looks at: torch tensors -> torch's stream)
        plan._prepared_launch = None
        return plan

    @property
    def args(self):
        """The kernel's arguments (descriptors, views and scalars), valid offline."""
        raise NotImplementedError

    @property
    def output(self):
        """The array the plan writes (what :meth:`launch` returns)."""
        raise NotImplementedError

    def rebind(self, *arrays):
        """Point this plan at ``arrays``: the arguments it was built from (scalars included, in the same order),
        each array of the same layout (shape, byte strides, dtype) as before; returns the plan.

        Generic: for each input array ``i``, ``delta_i`` = new address - old address. Every
        :class:`numbatma.TensorMap` (and ``Im2colTensorMap``) reachable from the plan (its attributes, lists,
        tuples, dicts and objects of numbatma.kernels' own classes such as ``ExactStore``; not arrays) whose
        address lies inside input ``i``'s memory is re-pointed (``repoint``, no re-encoding) ``delta_i`` bytes
        further; every :class:`numbatma.DeviceView`, :class:`numbatma.ArrayLayout` and (simulator) array view
        inside input ``i`` is re-made ``delta_i`` further; every reference to an old input array becomes the new
        one. The prepared launch is dropped (the next launch prepares with the new arguments). Raises
        :class:`NotRebindable` where it cannot (a view it cannot re-make, an address inside two inputs that
        moved differently); the plan is then in an undefined state and must be dropped."""
        old = getattr(self, "_user_arrays", ())
        if len(old) != len(arrays):
            raise NotRebindable(f"{type(self).__name__} was built from {len(old)} arguments, got {len(arrays)}")
        if not type(self).rebindable:
            raise NotRebindable(f"{type(self).__name__} plans cannot be re-pointed")
        ranges = []
        for o, n in zip(old, arrays):
            if is_scalar(o) or is_scalar(n):
                if not (is_scalar(o) and is_scalar(n)):
                    raise NotRebindable("an array argument became a scalar (or the reverse)")
                continue  # (scalars are part of the cache key: equal by value)
            lo_, ln = array_layout(o), array_layout(n)
            if (lo_.shape, lo_.strides, lo_.dtype) != (ln.shape, ln.strides, ln.dtype):
                raise NotRebindable(f"{ln.name} with byte strides {ln.strides} is not the layout the plan was "
                                    f"built for ({lo_.name} with byte strides {lo_.strides})")
            ranges.append(Range(o, n, lo_, ln))
        if any(r.old is not r.new for r in ranges):
            Rebinder(ranges).fix_object(self, skip=_DROPPED)
            self._prepared_launch = None
        self._user_arrays = arrays
        return self

    def launch_args(self):
        """``args`` as a launch passes them (:func:`numbatma.launch_argument`: views become device arrays once)."""
        return tuple(launch_argument(a) for a in self.args)

    def stream_for(self, stream):
        """The stream a launch on ``stream`` uses (see the module docstring): ``stream`` as numba takes it, or with
        None the default for this plan's arrays."""
        if stream is None:
            return default_stream(getattr(self, "_user_arrays", ()))
        return as_stream(stream)

    def launch(self, stream=None):
        """Launch the kernel on ``stream`` (asynchronously, like any kernel launch) and return ``output``.
        Nothing is launched when there is nothing to compute (``kernel`` is None). The launch is prepared on first
        use, and again when ``kernel`` or a scalar argument changed."""
        if self.kernel is not None:
            scalars = tuple(a for a in self.args if is_scalar(a))  # (``Axpy.a``, ``Gemm.alpha``: changeable)
            prepared = getattr(self, "_prepared_launch", None)
            if prepared is None or prepared[0] is not self.kernel or prepared[1] != scalars:
                prepared = self._prepared_launch = (self.kernel, scalars, prepare_launch(
                    self.kernel, self.launch_args(), self.grid, self.block, self.shared_mem, scoped=False))
            prepared[2](self.stream_for(stream))
        return self.output


# (imported last: the cache module uses nothing of this one at import time)
from ._plan_cache import (  # noqa: E402
    DEFAULT_PLAN_CACHE_SIZE, clear_plan_cache, plan_cache_info, plan_cache_size, run)  # noqa: F401
