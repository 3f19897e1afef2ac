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
* ``launch(stream=0)``: launch on ``stream`` (asynchronously) and return ``output``.

The function form of a plan (``stream_copy(src, dst, stream=..., **options)`` etc.) is :func:`run` : build the
plan, launch it on ``stream``, return its output.
"""
from __future__ import annotations

from numbatma import launch_argument

__all__ = ["Plan", "run"]


class Plan:
    """Base of the plans of :mod:`numbatma.kernels` (see the module docstring for the contract).

    A subclass sets ``kernel``, ``block``, ``shared_mem`` (attributes or properties) and provides ``grid``,
    ``args`` and ``output``; it overrides :meth:`launch` only when a launch is more than one kernel call
    (and then keeps its return convention)."""

    kernel = None
    block = 32
    shared_mem = 0

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

    def launch(self, stream=0):
        """Launch the kernel on ``stream`` (asynchronously, like any kernel launch) and return ``output``.
        Nothing is launched when there is nothing to compute (``kernel`` is None)."""
        if self.kernel is not None:
            self.kernel[self.grid, self.block, stream, self.shared_mem](*self.launch_args())
        return self.output


def run(plan_class, *arrays, stream=0, **options):
    """The function form of a plan: ``plan_class(*arrays, **options).launch(stream)``; returns the plan's output."""
    return plan_class(*arrays, **options).launch(stream)
