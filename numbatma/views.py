"""Views of device memory as kernel arguments.

A ready-made kernel often needs an array seen differently from how the caller allocated it: the leading
axes folded into rows, the columns of a row split at a 16-byte boundary, bfloat16 viewed as its bits.
Describe the view as an :class:`ArrayLayout` (pointer, shape, byte strides, dtype; ``array_layout(x)``
gives the array's own, ``layout.columns(a, b)`` a range of its columns) and hand it to

* :func:`layout_view` for a :class:`TensorMap` source (keeps the dtype, bfloat16 included), or
* :func:`kernel_view` for a ``@cuda.jit`` argument (bfloat16 as uint16): a :class:`DeviceView` on a GPU,
  a simulated device array over the same memory under the CUDA simulator.

:func:`launch_argument` turns such an argument into what a launch passes most cheaply (a
:class:`DeviceView` becomes its numba device array, made once; everything else is returned as it is).
"""
from __future__ import annotations

from .tensormap import ArrayLayout, DeviceView, array_layout, kernel_view, layout_facts, layout_view

__all__ = ["ArrayLayout", "DeviceView", "array_layout", "kernel_view", "layout_facts", "layout_view", "launch_argument"]


def launch_argument(arg):
    """``arg`` as a kernel launch should receive it: the numba device array of a :class:`DeviceView` (made on
    first use and kept; a :class:`DeviceView` itself works too but is converted at every launch), any other
    argument unchanged."""
    return arg.device_array() if isinstance(arg, DeviceView) else arg
