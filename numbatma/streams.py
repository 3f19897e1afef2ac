"""Streams from any CUDA library, in one form: the raw ``CUstream`` handle (an int) that ``cuLaunchKernel`` takes.

``stream_handle(s)`` is the one conversion. It accepts what users have at hand:

* ``0`` / ``None``: the legacy default stream (``0``);
* a numba stream (``cuda.stream()``, ``cuda.default_stream()``, ``cuda.external_stream(h)``): its handle (under the
  CUDA simulator its ``cuda.stream()`` / ``cuda.default_stream()``, which a simulated launch ignores: 0);
* an object speaking the CUDA stream protocol (``__cuda_stream__()`` returning ``(version, handle)``: cuda.core
  streams and graph builders, recent CuPy and torch streams);
* a torch stream (``torch.cuda.Stream`` / ``torch.cuda.ExternalStream``: ``.cuda_stream``), a CuPy stream
  (``.ptr``);
* a raw ``CUstream`` handle (an ``int`` >= 0), as it is.

Anything else is a TypeError naming the value. A plan turns the caller's stream into its handle once
(``Plan.stream_for``) and every launch path takes that int: a prepared launch passes it to ``cuLaunchKernel``; a launch
that goes through numba's own ``kernel[grid, block, stream, smem]`` (the simulator, debug builds, host arrays) turns it
into what numba takes at that edge only, with :func:`numba_stream` (``numba.cuda.external_stream(handle)``, made once
per handle: a wrapper, the stream stays the caller's to destroy; 0 for the default stream and under the simulator).
:func:`as_stream` (a stream as numba takes it: a numba stream as it is, anything else through :func:`numba_stream`)
is a helper for user code that launches through numba itself; no numbatma launch path uses it.

``default_stream(arrays)`` is the stream (its handle) a launch uses when the caller names none: torch's *current*
stream when an argument is a torch tensor (so numbatma kernels order with the torch ops around them without the caller
thinking about it), else 0. It is :func:`torch_device` (which tensor, once per set of arrays) then :func:`torch_stream`
(torch's current stream there, per launch: cheaply, through torch's raw handle look-up where it has one).
"""
from __future__ import annotations

import functools
import sys

from ._env import SIMULATING

__all__ = ["as_stream", "default_stream", "numba_stream", "stream_device", "stream_handle", "torch_device",
           "torch_stream"]


def stream_handle(stream):
    """The ``CUstream`` handle (an int >= 0) of ``stream``: any stream the module docstring lists (0 / None: 0; a
    numba stream: its handle, 0 for a simulated one). Raises TypeError, naming the value and its type, for anything
    else. The one place a stream object becomes the form every launch path takes."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError(f"stream: a stream, not a bool, is expected (0 or None for the default stream), got {stream!r}")
    if isinstance(stream, int):
        if stream < 0:
            raise TypeError(f"stream: a stream handle is a non-negative integer (a CUstream), got {stream}")
        return stream
    if isinstance(stream, (str, bytes, float, complex)):
        raise TypeError(f"stream: cannot use {stream!r} (a {type(stream).__name__}) as a CUDA stream: pass a numba, "
                        f"torch, CuPy or cuda.core stream, an object with __cuda_stream__, a CUstream handle (an int "
                        f">= 0), or 0 / None for the default stream")
    if _is_numba_stream(stream):
        return 0 if SIMULATING else int(stream.handle or 0)
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        value = protocol() if callable(protocol) else protocol
        try:
            _, handle = value
            return int(handle)
        except (TypeError, ValueError):
            raise TypeError(f"{type(stream).__name__}.__cuda_stream__ returned {value!r}; the CUDA stream protocol "
                            f"returns (version, handle)") from None
    for attribute in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, other wrappers
        value = getattr(stream, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise TypeError(f"cannot use a {type(stream).__module__}.{type(stream).__name__} as a CUDA stream (got "
                    f"{_short_repr(stream)}): pass a numba, torch, CuPy or cuda.core stream, an object with "
                    f"__cuda_stream__, or a CUstream handle (int)")


def _short_repr(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_numba_stream(stream):
    if SIMULATING:
        # The simulator's cuda.stream() / cuda.default_stream() (numba.cuda.simulator.api.stream; a simulated
        # launch ignores it, as numba's own simulated launches do).
        from numba.cuda.simulator import api

        return isinstance(stream, api.stream) or type(stream).__name__ in ("FakeCUDAStream", "Stream")
    from numba.cuda.cudadrv.driver import Stream

    return isinstance(stream, Stream)


def numba_stream(handle):
    """``handle`` (a ``CUstream`` handle, or any stream :func:`stream_handle` takes) as numba's own launch
    ``kernel[grid, block, stream, smem]`` takes it: 0 for the default stream and under the simulator (a simulated
    launch ignores its stream), else ``numba.cuda.external_stream(handle)``, made once per handle. The one edge where a
    launch path leaves the handle form (numbatma.launch's launches through numba)."""
    if type(handle) is not int:
        handle = stream_handle(handle)
    if handle == 0 or SIMULATING:
        return 0
    return _external(handle)


def as_stream(stream):
    """``stream`` (see the module docstring) as numba-cuda takes it, for user code launching through numba itself: a
    numba stream as it is, anything else :func:`numba_stream` of its handle. (numbatma's launches take the handle:
    :func:`stream_handle`.)"""
    if stream is not None and not isinstance(stream, int) and _is_numba_stream(stream):
        return stream
    return numba_stream(stream_handle(stream))


@functools.lru_cache(maxsize=64)
def _external(handle):
    from numba import cuda

    return cuda.external_stream(handle)


def default_stream(arrays):
    """The handle of torch's current stream (of the first CUDA torch tensor's device) when one of ``arrays`` is a
    torch tensor, else 0. (torch is never imported here: a torch tensor means torch is loaded.)"""
    device = torch_device(arrays)
    return 0 if device is None else torch_stream(device)


def torch_device(arrays):
    """The ``device`` of the first CUDA torch tensor among ``arrays``, or None (none is; torch not loaded)."""
    torch = sys.modules.get("torch")
    if torch is None or SIMULATING:
        return None
    for a in arrays:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return a.device
    return None


def torch_stream(device):
    """The handle (an int) of torch's current stream on ``device`` (a torch device or its index). Through
    ``torch._C._cuda_getCurrentRawStream(index)`` (the handle itself: what torch's generated code calls) where torch
    has it, else ``torch.cuda.current_stream(device).cuda_stream`` (builds a Stream object: a few µs)."""
    torch = sys.modules["torch"]
    module, raw = _raw_getter
    if module is not torch:
        raw = _raw_stream_getter(torch)
    handle = None
    if raw is not None:
        index = getattr(device, "index", device)  # (a torch device's index; an int as it is)
        if isinstance(index, int):
            try:
                handle = raw(index)
            except Exception:  # noqa: BLE001 - a torch without it after all: the public spelling below
                handle = None
    if not isinstance(handle, int):
        handle = torch.cuda.current_stream(device).cuda_stream
    return handle


_raw_getter = (None, None)  # (the torch module, its raw current-stream function or None)


def _raw_stream_getter(torch):
    global _raw_getter
    raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    _raw_getter = (torch, raw if callable(raw) else None)
    return _raw_getter[1]


def stream_device(stream):
    """The device ``stream`` belongs to where the object says so without a driver call (a torch stream's
    ``device_index``, a CuPy stream's ``device_id``, a cuda.core stream's ``device``); None for anything else (a raw
    handle, a numba stream, 0 / None). Which attribute a stream class has is decided once per class."""
    read = _STREAM_DEVICES.get(type(stream))
    if read is None:
        read = _STREAM_DEVICES[type(stream)] = _stream_device_reader(type(stream))
    try:
        device = read(stream)
    except Exception:  # noqa: BLE001 - (an attribute that is not what it looks like: not checked)
        return None
    return device if isinstance(device, int) and not isinstance(device, bool) and device >= 0 else None


_STREAM_DEVICES = {}  # stream class -> its reader


def _stream_device_reader(cls):
    if issubclass(cls, (int, type(None))):
        return lambda s: None
    if hasattr(cls, "device_index"):  # torch.cuda.Stream / ExternalStream
        return lambda s: s.device_index
    if hasattr(cls, "device_id"):  # CuPy
        return lambda s: s.device_id
    if cls.__module__.split(".")[0] == "cuda" and hasattr(cls, "device"):  # cuda.core
        return lambda s: s.device.device_id
    return lambda s: None
