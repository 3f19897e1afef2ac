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
time per launch instead of tens) on first use, and again whenever ``kernel`` changes; a plan's arguments are fixed
when it is built (a plan whose scalars may change, such as ``Gemm.alpha``, prepares again itself). Plans never
launch dependent (``prepare_launch(..., scoped=False)``: ``numbatma.dependent_launch()`` does not reach them), as
their kernels do not call ``griddepcontrol_wait`` yet.

The function form of a plan (``stream_copy(src, dst, stream=..., **options)`` etc.) is :func:`run` : build the
plan, launch it on ``stream``, return its output.
"""
from __future__ import annotations

from numbatma import launch_argument, prepare_launch
from numbatma.streams import as_stream, default_stream

__all__ = ["Plan", "run"]


class Plan:
    """Base of the plans of :mod:`numbatma.kernels` (see the module docstring for the contract).

    A subclass sets ``kernel``, ``block``, ``shared_mem`` (attributes or properties) and provides ``grid``,
    ``args`` and ``output``; it overrides :meth:`launch` only when a launch is more than one kernel call
    (and then keeps its return convention)."""

    kernel = None
    block = 32
    shared_mem = 0

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
        use (and again when ``kernel`` changed)."""
        if self.kernel is not None:
            prepared = getattr(self, "_prepared_launch", None)
            if prepared is None or prepared[0] is not self.kernel:
                prepared = self._prepared_launch = (self.kernel, prepare_launch(
                    self.kernel, self.launch_args(), self.grid, self.block, self.shared_mem, scoped=False))
            prepared[1](self.stream_for(stream))
        return self.output


def run(plan_class, *arrays, stream=None, **options):
    """The function form of a plan: ``plan_class(*arrays, **options).launch(stream)``; returns the plan's output."""
    return plan_class(*arrays, **options).launch(stream)
