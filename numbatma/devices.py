"""Which GPU: the device that owns an array, the calling thread's current device, making a device current for a
while, and peer access between devices.

numbatma's rule (docs/guide.md, "Several GPUs"): a kernel of :mod:`numbatma.kernels` runs on the device that holds
its arrays, whatever device is current when it is called (as torch ops run on their tensors' device); a
:class:`numbatma.TensorMap` belongs to the device of the array it describes and is launched there; arrays of several
devices in one launch are an error unless the launching device was given access to the others' memory
(:func:`enable_peer_access`: TMA then reads and writes the peer's memory over NVLink / PCIe).

* :func:`array_device`: the device that owns an array (torch: ``tensor.get_device()``; numba: the context its memory
  was allocated in, or its owner's; DLPack exporters such as CuPy: ``__dlpack_device__()``; anything else with a CUDA
  Array Interface: the device of the context that owns its address (:func:`pointer_device`)). The reader is decided once
  per array class (:func:`device_reader`), so the function forms' cache key reads a torch tensor's device with one
  method call;
* :func:`current_device`: the ordinal of the calling thread's current CUDA context (``cuCtxGetDevice``);
* :func:`enter_device` / :func:`leave_device` (and :func:`on_device`): make a device's primary context current
  for a while - only where another one is current;
* :func:`enable_peer_access` / :func:`peer_access_enabled`: ``cuCtxEnablePeerAccess``, and which pairs were enabled;
* :func:`common_device`: the device a set of arrays is on (or the clear error where they disagree).

Without a CUDA driver (plans built offline) and under the simulator every array's device is None and nothing is
switched. A leaf module: it imports nothing of numbatma but ``_env``; numbatma's own array classes register their
readers (:func:`register_reader`).
"""
from __future__ import annotations

import contextlib
import operator
import sys
import functools
import threading

from ._env import SIMULATING

__all__ = ["array_device", "common_device", "current_device", "device_count", "device_reader", "enable_peer_access",
           "enter_device", "leave_device", "on_device", "peer_access_enabled", "register_reader", "several_devices",
           "sm_count"]

_DLPACK_CUDA = 2  # DLPack's kDLCUDA (kDLCUDAHost 3 and kDLCUDAManaged 13: memory no one device owns)

# -- the driver ----------------------------------------------------------------------------------------------------
_DRIVER = None  # cuda.bindings' driver module once it loaded a driver; False where there is none (decided once)
_POINTER_CONTEXT = None  # CU_POINTER_ATTRIBUTE_CONTEXT


def driver():
    """cuda.bindings' ``driver`` module where a CUDA driver is loaded (or loadable), else None (no driver: plans
    built offline; the simulator). Decided once."""
    global _DRIVER, _POINTER_CONTEXT
    drv = _DRIVER
    if drv is None:
        drv = False
        if not SIMULATING:
            try:
                from cuda.bindings import driver as drv

                drv.cuDriverGetVersion()  # (loads libcuda: raises where there is none)
                _POINTER_CONTEXT = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT
            except Exception:  # noqa: BLE001 - no driver here
                drv = False
        _DRIVER = drv
    return drv or None


def current_device():
    """The ordinal of the device of the calling thread's current CUDA context (numba's ``cuda.gpus[i]`` blocks,
    ``torch.cuda.set_device`` / ``torch.cuda.device(i)`` and cuda.core's ``Device(i).set_current()`` all make one
    current); None where no context is current or there is no driver; 0 under the simulator."""
    if SIMULATING:
        return 0
    drv = _DRIVER or driver()
    if drv is None:
        return None
    err, device = drv.cuCtxGetDevice()
    return None if err else int(device)


_COUNT = []  # (the number of devices, once known)


def sm_count(device_id=None):
    """Number of SMs of device ``device_id`` (what a persistent grid fills: ``numbatma.intrinsics.persistent_grid``);
    by default of the current device (with no context current, numba makes device 0's current, as a launch would).
    Known once per device. Raises ``ValueError`` for an id that is not an integer >= 0."""
    if device_id is None:
        device_id = current_device()
        if device_id is None:
            from numba import cuda

            device_id = cuda.get_current_device().id
    if isinstance(device_id, bool) or not hasattr(device_id, "__index__") or device_id < 0:
        raise ValueError(f"sm_count: device_id must be a CUDA device ordinal (an integer >= 0), got {device_id!r}: "
                         f"an invalid device id")
    return _sm_count(int(device_id))


@functools.lru_cache(maxsize=None)
def _sm_count(device_id):
    from numba import cuda

    if SIMULATING:
        return cuda.get_current_device().MULTIPROCESSOR_COUNT
    return cuda.gpus[device_id].MULTIPROCESSOR_COUNT


def device_count():
    """How many devices this process sees (``cuDeviceGetCount``; ``CUDA_VISIBLE_DEVICES`` applies); 1 without a
    driver and under the simulator. Known once."""
    if _COUNT:
        return _COUNT[0]
    drv = driver()
    count = 1
    if drv is not None:
        drv.cuInit(0)
        err, count = drv.cuDeviceGetCount()
        count = 1 if err else int(count)
    _COUNT.append(count)
    return _COUNT[0]


def several_devices():
    """Whether this process sees more than one device (:func:`device_count`): where it sees one, every array is on it
    and nothing needs comparing (the launch path's checks are skipped then). Known once."""
    count = _COUNT
    return (count[0] if count else device_count()) > 1


def pointer_device(ptr):
    """The device whose memory ``ptr`` (a device address) is: the device of the context that allocated or registered it
    (``CU_POINTER_ATTRIBUTE_CONTEXT``, then ``cuCtxGetDevice_v2`` of that context, remembered per context). None for
    memory the driver does not know (plain host memory), for memory no context owns (virtual-memory-management and
    memory-pool allocations: the driver's ``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`` answered 0 for device 1's memory
    on a two-H100 machine with driver 580, so it is not asked), for address 0, and without a driver."""
    drv = _DRIVER or driver()
    if drv is None or not ptr:
        return None
    err, context = drv.cuPointerGetAttribute(_POINTER_CONTEXT, ptr)
    if err:
        return None
    handle = int(context)
    if not handle:
        return None
    device = _CONTEXT_DEVICES.get(handle)
    if device is None:
        device = _context_device(drv, context)
        if device is not None:
            _CONTEXT_DEVICES[handle] = device
    return device


_CONTEXT_DEVICES = {}  # context handle -> device ordinal (pointer_device)


def _context_device(drv, context):
    """The ordinal of ``context``'s device: ``cuCtxGetDevice_v2(context)``, or (a driver without it) the context
    pushed for a ``cuCtxGetDevice``."""
    get = getattr(drv, "cuCtxGetDevice_v2", None)
    if get is not None:
        err, device = get(context)
        if not err:
            return int(device)
    if drv.cuCtxPushCurrent(context)[0]:
        return None
    try:
        err, device = drv.cuCtxGetDevice()
        return None if err else int(device)
    finally:
        drv.cuCtxPopCurrent()


# -- the device of an array -----------------------------------------------------------------------------------------
DEVICE_READERS = {}  # array class -> its reader as decided so far (device_reader fills it; the plan cache reads it)
_REGISTERED = []  # (class, reader): numbatma's own classes (register_reader)


def array_device(array):
    """The ordinal of the device that owns ``array``'s memory, or None: host memory, memory no one device owns
    (managed), not an array, no driver, the simulator.

    A torch tensor: ``tensor.get_device()``. A numba device array: the device of the context its memory was allocated
    in (numba's own allocations), else that of the array it was made from (``cuda.as_cuda_array(x)``: ``x``'s), else
    the driver's answer for its address. An object with ``__dlpack_device__`` (CuPy, JAX, ...): its answer. Any other
    object with a CUDA Array Interface: the device of the context that owns its address (:func:`pointer_device`).
    numbatma's own: a :class:`numbatma.DeviceView` is on its owner's device, a :class:`numbatma.TensorMap` on its
    array's, an :class:`numbatma.ArrayLayout` where its address is."""
    read = DEVICE_READERS.get(type(array))
    if read is None:
        read = device_reader(type(array))
    device = read(array)
    return device if device is None or device >= 0 else None


def device_reader(cls):
    """The function that reads the device of an array of class ``cls`` (what :func:`array_device` calls), decided
    once per class: it returns the device's ordinal, None, or a negative number (no device: a torch CPU tensor's
    ``get_device()`` is -1, read as it is, without a wrapper)."""
    read = DEVICE_READERS[cls] = _reader_for(cls)
    return read


def register_reader(cls, read):
    """Arrays of ``cls`` (and its subclasses) tell their device through ``read(array)`` (numbatma's own classes)."""
    _REGISTERED.append((cls, read))
    DEVICE_READERS.clear()


def _nowhere(array):
    return None


def _reader_for(cls):
    if SIMULATING:
        return _nowhere
    for base, read in _REGISTERED:
        if issubclass(cls, base):
            return read
    torch = sys.modules.get("torch")  # (never imported here: a torch tensor means torch is loaded)
    tensor = getattr(torch, "Tensor", None) if torch is not None else None
    if isinstance(tensor, type) and issubclass(cls, tensor) and hasattr(cls, "get_device"):
        return cls.get_device  # (-1 for a CPU tensor)
    if cls.__name__ == "DeviceNDArray" and cls.__module__ == "numba.cuda.cudadrv.devicearray":
        return _numba_device
    if hasattr(cls, "__dlpack_device__"):
        return _dlpack_device
    return _general_device


def _dlpack_device(array):
    try:
        kind, index = array.__dlpack_device__()
    except Exception:  # noqa: BLE001 - not a device array after all
        return None
    return int(index) if int(kind) == _DLPACK_CUDA else None


def _general_device(array):
    if hasattr(array, "__dlpack_device__"):
        device = _dlpack_device(array)
        if device is not None:
            return device
    try:
        cai = array.__cuda_array_interface__
    except Exception:  # noqa: BLE001 - not a CUDA array (a scalar, a host array)
        return None
    try:
        return pointer_device(int(cai["data"][0]))
    except Exception:  # noqa: BLE001 - a malformed interface: the intake says what is wrong with it
        return None


def _numba_device(array):
    data = array.gpu_data
    owner = getattr(data, "owner", None)
    if getattr(owner, "is_managed", False):  # (numba allocated it: in its context, on its device)
        try:
            return int(owner.context.device.id)
        except Exception:  # noqa: BLE001 - an allocation without a numba context: ask the driver below
            pass
    elif owner is not None and owner is not data and type(owner).__module__.split(".")[0] != "numba":
        device = array_device(owner)  # (made from another library's array: that array's device)
        if device is not None:
            return device
    try:
        ptr = array.device_ctypes_pointer.value
    except Exception:  # noqa: BLE001
        return None
    return pointer_device(ptr)


def common_device(who, arrays, error=ValueError):
    """The device the array arguments ``arrays`` are on (scalars and other non-arrays ignored; None where no array
    tells: offline, the simulator). Arrays on several devices: the current device, where it holds one of them and
    has peer access to each of the others (:func:`enable_peer_access`); else ``error`` naming which argument is
    where and the fix."""
    found = []
    for i, a in enumerate(arrays):
        device = array_device(a)
        if device is not None:
            found.append((i, device))
    if not found:
        return None
    first = found[0][1]
    if all(d == first for _, d in found):
        return first
    devices = {d for _, d in found}
    current = current_device()
    if current in devices and all(d == current or (current, d) in _PEERS for d in devices):
        return current
    where = ", ".join(f"argument {i} on device {d}" for i, d in found)
    target = current if current in devices else found[-1][1]
    peer = min(devices - {target})
    raise error(
        f"{who}: the arrays are on different devices ({where}). A kernel runs on one device, the one that holds its "
        f"arrays: move them to one device (e.g. tensor.to('cuda:{target}')). For device {target} to read and write "
        f"device {peer}'s memory over NVLink instead, call numbatma.enable_peer_access({target}, {peer}) and call "
        f"this with device {target} current (with cuda.gpus[{target}]: or torch.cuda.device({target}))."
    )


# -- making a device current ----------------------------------------------------------------------------------------
def enter_device(device):
    """Make ``device``'s primary context the calling thread's current one, unless it already is (or ``device`` is
    None, or there is no driver). Returns what :func:`leave_device` takes to make the previous one current again
    (None: nothing was changed). One driver call where nothing changes; none in a process that sees one device (where
    every context is that device's, and numba makes it current where none is)."""
    if device is None:
        return None
    if type(device) is not int or device < 0:  # (cuda.gpus[-1] would be the last device: never guessed)
        _ordinal(device, "device", "enter_device", exists=False)
    if (_DRIVER or driver()) is None or not several_devices() or current_device() == device:
        return None
    _ordinal(device, "device", "enter_device")
    from numba import cuda

    context = cuda.gpus[device].get_primary_context()
    context.push()  # (numba's own push: the context made ready for numba's allocations as well)
    return context


def leave_device(context):
    """Undo :func:`enter_device` (``context``: what it returned)."""
    if context is not None:
        context.pop()


@contextlib.contextmanager
def on_device(device):
    """``with on_device(d):`` - device ``d``'s primary context is current inside (see :func:`enter_device`)."""
    context = enter_device(device)
    try:
        yield
    finally:
        leave_device(context)


# -- peer access ----------------------------------------------------------------------------------------------------
_PEERS = set()  # (device, peer): kernels on device may use peer's memory (enable_peer_access)
_PEER_LOCK = threading.Lock()


def _ordinal(device, what, who="enable_peer_access", exists=True):
    """``device`` (an int, a ``torch.device``, a numba device) as an ordinal; ValueError naming ``what`` and the value
    for anything else ("0", -1, 1.0, True) and, with ``exists``, for an ordinal this process does not see (checked
    where a driver answers, and under the simulator: one device)."""
    index = getattr(device, "index", None)  # (a torch.device)
    if index is None:
        index = getattr(device, "id", device)  # (a numba device)
    if not isinstance(index, bool) and hasattr(type(index), "__index__") and not isinstance(index, int):
        index = operator.index(index)  # (a NumPy integer)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"{who}: {what} must be a device ordinal (an int >= 0), got {device!r}")
    if exists and index and (SIMULATING or driver() is not None):
        count = device_count()
        if index >= count:
            raise ValueError(
                f"{who}: {what} {device!r} is not a device of this process: it sees {count} device"
                f"{'s' if count != 1 else ''} (ordinals 0..{count - 1}; CUDA_VISIBLE_DEVICES applies)"
            )
    return index


def enable_peer_access(device, peer):
    """Let kernels running on ``device`` read and write the memory of device ``peer`` (ordinals, or
    ``torch.device("cuda:1")``): ``cuCtxEnablePeerAccess`` in ``device``'s primary context for ``peer``'s, once
    (calling it again does nothing). Afterwards numbatma launches on ``device`` accept TensorMaps (and plans accept
    arrays) of ``peer``'s memory: TMA then moves that data over NVLink (or PCIe). One direction: call
    ``enable_peer_access(peer, device)`` as well for the other. Raises RuntimeError where the two devices cannot
    reach each other's memory (``cuDeviceCanAccessPeer``)."""
    device, peer = _ordinal(device, "device"), _ordinal(peer, "peer")
    if device == peer or (device, peer) in _PEERS:
        return
    if SIMULATING:  # (one simulated device: nothing to enable)
        with _PEER_LOCK:
            _PEERS.add((device, peer))
        return
    drv = driver()
    if drv is None:
        raise RuntimeError("enable_peer_access needs the CUDA driver; none was found")
    drv.cuInit(0)
    err, can = drv.cuDeviceCanAccessPeer(device, peer)
    if err or not can:
        why = f"{err.name}" if err else "no NVLink or PCIe peer path between them"
        raise RuntimeError(f"enable_peer_access({device}, {peer}): device {device} cannot access device {peer}'s "
                           f"memory (cuDeviceCanAccessPeer: {why})")
    from numba import cuda

    peer_context = cuda.gpus[peer].get_primary_context()
    context = enter_device(device)
    try:
        (err,) = drv.cuCtxEnablePeerAccess(peer_context.handle, 0)
    finally:
        leave_device(context)
    if err and err != drv.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
        raise RuntimeError(f"enable_peer_access({device}, {peer}): cuCtxEnablePeerAccess failed: {err.name}")
    with _PEER_LOCK:
        _PEERS.add((device, peer))


def peer_access_enabled(device, peer):
    """Whether :func:`enable_peer_access` gave ``device`` access to ``peer``'s memory (always True for
    ``device == peer``). ``device`` / ``peer``: ordinals (ValueError naming the value for anything else)."""
    if type(device) is not int or type(peer) is not int or device < 0 or peer < 0:
        device = _ordinal(device, "device", "peer_access_enabled", exists=False)
        peer = _ordinal(peer, "peer", "peer_access_enabled", exists=False)
    return device == peer or (device, peer) in _PEERS
