"""CPU: which device numbatma launches on (numbatma/devices.py, the plans' devices in kernels/_plan.py, the function
forms' cache key in kernels/_plan_cache.py, prepared launches and hook 2's device check in
numbatma/_numba_internals.py).

No GPU: a process that sees two devices is faked (``two_gpus``: the current device is a variable, making a device
current is recorded, a stand-in torch whose tensors say their device, SM counts per device). The GPU side of the same
rules is tests/test_gpu_multi_device.py (two GPUs)."""
import ctypes
import sys
import types

import numpy as np
import pytest

import fakes
import numbatma
from numbatma import DeviceView, TensorMap, TensorMapError, _descriptor_base, _intake, array_layout, devices, streams
from numbatma import _numba_internals as internals
from numbatma import _prepared_launch as prepared
from numbatma.kernels import (NotRebindable, Plan, StreamCopy, _launch, _plan, _plan_cache, clear_plan_cache,
                              plan_cache_info, stream_copy)

GB = 1 << 30
MB = 1 << 20


@pytest.fixture
def two_gpus(monkeypatch):
    """A process that sees two devices: ``state["current"]`` is the current device (0 at first), making a device
    current (``enter_device``) switches it and is recorded in ``state["entered"]``; device 0 has 132 SMs, device 1
    66; a stand-in torch whose tensors say their device (``get_device()``) and whose current stream on device ``i``
    is ``0x100 + i``; no peer access yet; an empty plan cache."""
    monkeypatch.setitem(sys.modules, "torch", fakes.fake_torch(current_stream=lambda index: 0x100 + index))
    monkeypatch.setattr(_intake, "_READERS", {})
    devices.DEVICE_READERS.clear()  # (the plan cache holds this dict: cleared in place)
    monkeypatch.setattr(devices, "_COUNT", [2])
    monkeypatch.setattr(devices, "_PEERS", set())
    state = {"current": 0, "entered": []}

    def current():
        return state["current"]

    def enter(device):
        state["entered"].append(device)
        if device is None or device == state["current"]:
            return None
        previous, state["current"] = state["current"], device
        return ("context of", previous)

    def leave(context):
        if context is not None:
            state["current"] = context[1]

    monkeypatch.setattr(devices, "current_device", current)
    monkeypatch.setattr(_plan_cache, "current_device", current)
    for module in (devices, _plan, _descriptor_base):
        monkeypatch.setattr(module, "enter_device", enter)
        monkeypatch.setattr(module, "leave_device", leave)
    monkeypatch.setattr(_launch, "sm_count", lambda device=None: {0: 132, 1: 66}[
        state["current"] if device is None else device])
    monkeypatch.setattr(streams, "_external", lambda handle: ("external", handle))
    clear_plan_cache()
    yield state
    clear_plan_cache()
    devices.DEVICE_READERS.clear()


def t(shape=(64, 64), device=0, ptr=GB, dtype="float32"):
    """A stand-in CUDA torch tensor on ``device`` (None: a CPU tensor)."""
    return fakes.FakeTorchTensor(shape, dtype, ptr=ptr, device=device)


def numba_array(ptr, owner):
    """A numba device array whose memory pointer has ``owner`` (numba's ``gpu_data.owner``)."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    memory = types.SimpleNamespace(device_ctypes_pointer=ctypes.c_void_p(ptr), owner=owner)
    return DeviceNDArray((4, 4), (16, 4), np.dtype(np.float32), gpu_data=memory)


def numba_context(device):
    return types.SimpleNamespace(is_managed=True, context=types.SimpleNamespace(device=types.SimpleNamespace(id=device)))


class DLPackLike:
    """An array that says where it is through DLPack only (CuPy, JAX, ...)."""

    def __init__(self, kind, index):
        self.where = (kind, index)

    def __dlpack_device__(self):
        return self.where


# -- numbatma.array_device ------------------------------------------------------------------------------------------
def test_the_device_of_each_kind_of_array(two_gpus, monkeypatch):
    for module in (devices, _descriptor_base):  # (the driver's answer for an address: device 1 at 1 GiB, 0 at 2 GiB)
        monkeypatch.setattr(module, "pointer_device", lambda ptr: {GB: 1, 2 * GB: 0}.get(ptr))
    assert numbatma.array_device(t(device=1)) == 1 and numbatma.array_device(t(device=0)) == 0
    assert numbatma.array_device(t(device=None)) is None  # (a CPU tensor)
    # numba: its allocation's context; else the array it was made from; else the driver's answer for the address
    assert numbatma.array_device(numba_array(2 * GB, numba_context(1))) == 1
    assert numbatma.array_device(numba_array(2 * GB, t(device=1))) == 1
    assert numbatma.array_device(numba_array(GB, None)) == 1
    assert numbatma.array_device(fakes.numba_array((4, 4), np.float32, 2 * GB)) == 0
    # DLPack: CUDA memory names its device; host and managed memory are no one device's
    assert numbatma.array_device(DLPackLike(2, 1)) == 1
    assert numbatma.array_device(DLPackLike(13, 0)) is None and numbatma.array_device(DLPackLike(1, 0)) is None
    # a bare CUDA Array Interface: the device of the context that owns its address (pointer_device)
    assert numbatma.array_device(fakes.FakeCudaArray((4, 4), np.float32, ptr=GB)) == 1
    assert numbatma.array_device(fakes.FakeCudaArray((4, 4), np.float32, ptr=3 * GB)) is None  # (unknown memory)
    # numbatma's own: a view is on its owner's device, a layout where its address is, a TensorMap where its array is
    layout = array_layout(fakes.FakeCudaArray((4, 4), np.float32, ptr=2 * GB))
    assert numbatma.array_device(DeviceView(layout, t(device=1))) == 1
    assert numbatma.array_device(DeviceView(layout, None)) == 0 and numbatma.array_device(layout) == 0
    tm = TensorMap(fakes.FakeCudaArray((64, 64), np.float32, ptr=2 * GB), (16, 16))
    assert numbatma.array_device(tm) == 0
    tm._device_id = 1  # (recorded when encoded: that is the answer then)
    assert numbatma.array_device(tm) == 1
    for value in (2.0, 3, "text", None, np.float32(1)):
        assert numbatma.array_device(value) is None


def test_without_a_driver_no_array_has_a_device():
    if devices.driver() is not None:
        pytest.skip("this machine has a CUDA driver")
    assert devices.pointer_device(GB) is None and devices.current_device() is None
    assert numbatma.array_device(fakes.FakeCudaArray((4, 4), np.float32, ptr=GB)) is None
    assert devices.device_count() == 1 and not devices.several_devices()
    assert devices.enter_device(1) is None  # (nothing to switch)


def test_the_reader_is_decided_once_per_class(two_gpus):
    a, b = t(device=1), t(device=0)
    assert numbatma.array_device(a) == 1
    read = devices.DEVICE_READERS[type(a)]
    assert read is fakes.FakeTorchTensor.get_device  # (torch: the method itself, no wrapper)
    assert numbatma.array_device(b) == 0 and devices.DEVICE_READERS[type(b)] is read


# -- the device of several arrays ----------------------------------------------------------------------------------
def test_arrays_of_one_device(two_gpus):
    assert devices.common_device("Op", (t(device=1), 2.0, t(device=1, ptr=2 * GB))) == 1
    assert devices.common_device("Op", (t(device=0),)) == 0
    assert devices.common_device("Op", (2.0, "x")) is None and devices.common_device("Op", ()) is None


def test_arrays_of_two_devices_are_refused_naming_both(two_gpus):
    with pytest.raises(TensorMapError) as info:
        devices.common_device("StreamCopy", (t(device=0), t(device=1)), TensorMapError)
    text = str(info.value)
    assert "StreamCopy: the arrays are on different devices (argument 0 on device 0, argument 1 on device 1)" in text
    assert "tensor.to('cuda:0')" in text and "numbatma.enable_peer_access(0, 1)" in text
    two_gpus["current"] = 1
    with pytest.raises(ValueError, match=r"enable_peer_access\(1, 0\)"):
        devices.common_device("Op", (t(device=0), 2.0, t(device=1)))


def test_with_peer_access_the_current_device_takes_arrays_of_its_peers(two_gpus):
    devices._PEERS.add((1, 0))  # (device 1 may use device 0's memory)
    two_gpus["current"] = 1
    assert devices.common_device("Op", (t(device=0), t(device=1))) == 1
    two_gpus["current"] = 0  # (device 0 was given no access to device 1's memory)
    with pytest.raises(ValueError, match="different devices"):
        devices.common_device("Op", (t(device=0), t(device=1)))


# -- plans: built, prepared and launched on their arrays' device ---------------------------------------------------
def test_a_plan_is_built_on_its_arrays_device(two_gpus):
    big = (4096, 4096)  # (4096 tiles: the persistent grid is the SM count of the device it was built on)
    plan = StreamCopy(t(big, device=1), t(big, device=1, ptr=2 * GB))
    assert plan.device == 1 and plan.grid == 66 and 1 in two_gpus["entered"]
    assert two_gpus["current"] == 0  # (made current for the build only)
    plan0 = StreamCopy(t(big, device=0), t(big, device=0, ptr=2 * GB))
    assert plan0.device == 0 and plan0.grid == 132


def test_a_plan_of_arrays_on_two_devices_is_refused(two_gpus):
    with pytest.raises(TensorMapError, match=r"StreamCopy: the arrays are on different devices \(argument 0 on "
                                             r"device 1, argument 1 on device 0\)"):
        StreamCopy(t(device=1), t(device=0, ptr=2 * GB))
    with pytest.raises(TensorMapError, match="different devices"):
        stream_copy(t(device=1), t(device=0, ptr=2 * GB))  # (the function form: the same error)


def test_rebind_keeps_a_plan_on_its_device(two_gpus):
    plan = StreamCopy(t(device=0), t(device=0, ptr=2 * GB))
    with pytest.raises(NotRebindable, match="StreamCopy runs on device 0 .* the new arrays are on device 1"):
        plan.rebind(t(device=1, ptr=3 * GB), t(device=1, ptr=4 * GB))
    assert plan.rebind(t(device=0, ptr=3 * GB), t(device=0, ptr=4 * GB)) is plan


@pytest.fixture
def recorded(monkeypatch):
    """StreamCopy launches recorded (the plan, and the device current at the launch) instead of run."""
    launched = []

    def launch(self, stream=None):
        launched.append(self)
        return self.output

    monkeypatch.setattr(StreamCopy, "launch", launch)
    return launched


def test_the_cache_key_has_the_arrays_device(two_gpus, recorded):
    a0, b0 = t(device=0), t(device=0, ptr=2 * GB)
    a1, b1 = t(device=1), t(device=1, ptr=2 * GB)  # (the same addresses and layout, on the other device)
    key0, key1 = _plan_cache.cache_key(StreamCopy, (a0, b0), {}), _plan_cache.cache_key(StreamCopy, (a1, b1), {})
    assert key0 != key1 and key0[-1] == 0 and key1[-1] == 1
    two_gpus["current"] = 1
    assert _plan_cache.cache_key(StreamCopy, (a0, b0), {}) == key0  # (the arrays' device, not the current one)
    devices._PEERS.add((1, 0))  # (arrays of two devices: each one's device and the current device)
    assert _plan_cache.cache_key(StreamCopy, (a0, b1), {})[-1] == ((0, 1), 1)
    stream_copy(a0, b0)
    stream_copy(a1, b1)  # (a hit would re-point device 0's plan at device 1's memory: a plan of its own instead)
    stream_copy(a0, b0)
    assert plan_cache_info()["misses"] == 2 and plan_cache_info()["hits"] == 1
    assert [p.device for p in recorded] == [0, 1, 0] and recorded[0] is recorded[2]


def test_a_process_with_one_device_reads_no_devices(two_gpus, monkeypatch):
    monkeypatch.setattr(devices, "_COUNT", [1])
    read = []
    monkeypatch.setattr(fakes.FakeTorchTensor, "get_device", lambda self: read.append(self) or 0)
    devices.DEVICE_READERS.clear()
    assert _plan_cache.cache_key(StreamCopy, (t(), t(ptr=2 * GB)), {})[-1] is None and not read


def test_sm_count_is_per_device(monkeypatch):
    from numba import cuda
    from numbatma.intrinsics import persistent_grid

    current = [0]
    monkeypatch.setattr(cuda, "gpus", [types.SimpleNamespace(MULTIPROCESSOR_COUNT=132),
                                       types.SimpleNamespace(MULTIPROCESSOR_COUNT=78)], raising=False)
    monkeypatch.setattr(devices, "current_device", lambda: current[0])
    devices._sm_count.cache_clear()
    try:
        assert (_launch.sm_count(0), _launch.sm_count(1), _launch.sm_count()) == (132, 78, 132)
        current[0] = 1
        assert _launch.sm_count() == 78 and _launch.persistent_grid(10 ** 6) == 78
        assert _launch.persistent_grid(10 ** 6, 2, device_id=0) == 264 and _launch.persistent_grid(5) == 5
        assert persistent_grid(10 ** 6) == 78 and persistent_grid(10 ** 6, devices.sm_count(0)) == 132  # the public one
    finally:
        devices._sm_count.cache_clear()


# -- launches: the plan's device, streams of the plan's device ---------------------------------------------------------
class Tiny(Plan):
    def __init__(self, a, b):
        self.a, self.b = a, b

    output = property(lambda self: self.b)


def test_a_plan_launches_on_torchs_stream_of_its_device(two_gpus):
    plan = Tiny(t(device=1), t(device=1, ptr=2 * GB))
    assert plan.stream_for(None) == 0x101  # (device 1's, while device 0 is current)
    devices._PEERS.add((1, 0))
    two_gpus["current"] = 1
    peer = Tiny(t(device=0), t(device=1, ptr=2 * GB))  # (device 1 uses device 0's memory: the plan is device 1's)
    assert peer.device == 1 and peer.stream_for(None) == 0x101


class TorchStreamLike:
    """A torch stream as numbatma sees one: ``cuda_stream``, and ``device_index`` (a property of the class)."""

    def __init__(self, handle, device):
        self.cuda_stream, self._device = handle, device

    device_index = property(lambda self: self._device)


class CupyStreamLike:
    def __init__(self, ptr, device):
        self.ptr, self._device = ptr, device

    device_id = property(lambda self: self._device)


def test_a_stream_of_another_device_is_refused(two_gpus):
    plan = Tiny(t(device=1), t(device=1, ptr=2 * GB))
    with pytest.raises(ValueError, match=r"Tiny.launch: the stream belongs to device 0 but the plan runs on device "
                                         r"1 .*torch.cuda.current_stream\(1\)"):
        plan.stream_for(TorchStreamLike(0x77, 0))
    with pytest.raises(ValueError, match="belongs to device 0"):
        plan.stream_for(CupyStreamLike(0x78, 0))
    assert plan.stream_for(TorchStreamLike(0x77, 1)) == 0x77
    assert plan.stream_for(0x79) == 0x79  # (a raw handle: not checked, the driver refuses a wrong one)
    assert streams.stream_device(0x79) is None and streams.stream_device(None) is None
    assert streams.stream_device(TorchStreamLike(1, 1)) == 1 and streams.stream_device(CupyStreamLike(1, 0)) == 0


def test_outputs_a_plan_makes_again_are_made_on_its_device(two_gpus):
    class Owning(Plan):
        def __init__(self, x):
            self.x = x
            self.out = self.owned_output(lambda: t(device=two_gpus["current"], ptr=5 * GB))

        output = property(lambda self: self.out)

    plan = Owning(t(device=1))
    assert plan.out.get_device() == 1  # (built with device 1 current)
    plan.fresh_outputs()  # (device 0 current: made there first, then again on device 1)
    assert plan.out.get_device() == 1 and two_gpus["current"] == 0


def test_a_launch_prepares_on_the_plans_device_and_patches_anywhere(two_gpus, monkeypatch):
    fakes.offline_gpu(monkeypatch.setattr)
    monkeypatch.setattr(streams, "_external", lambda handle: handle)  # (torch's stream of device 1: 0x101)
    prepared_on = []
    prepare = _plan.prepare_launch
    monkeypatch.setattr(_plan, "prepare_launch", lambda *a, **k: prepared_on.append(two_gpus["current"]) or
                        prepare(*a, **k))
    stream_copy(t(device=1), t(device=1, ptr=2 * GB))
    assert prepared_on == [1] and two_gpus["current"] == 0
    entered = len(two_gpus["entered"])
    stream_copy(t(device=1, ptr=3 * GB), t(device=1, ptr=4 * GB))  # (a hit: re-pointed, the launch patched)
    assert prepared_on == [1] and len(two_gpus["entered"]) == entered and plan_cache_info()["hits"] == 1


# -- prepared launches: they run on the device they were prepared on -------------------------------------------------
@pytest.fixture
def contexts(two_gpus, monkeypatch):
    """The driver's current context follows ``two_gpus["current"]`` (context ``100 + device``); pushes and pops are
    recorded; the compiled kernel is device 1's when prepared there."""
    from cuda.bindings import driver as cu

    fake = fakes.offline_gpu(monkeypatch.setattr)
    calls = []
    stack = []

    def get_current():
        calls.append("get")
        return (cu.CUresult.CUDA_SUCCESS, cu.CUcontext(100 + two_gpus["current"]))

    def push(context):
        calls.append(("push", int(context)))
        stack.append(two_gpus["current"])
        two_gpus["current"] = int(context) - 100
        return (cu.CUresult.CUDA_SUCCESS,)

    def pop():
        calls.append("pop")
        two_gpus["current"] = stack.pop()
        return (cu.CUresult.CUDA_SUCCESS, None)

    monkeypatch.setattr(cu, "cuCtxGetCurrent", get_current)
    monkeypatch.setattr(cu, "cuCtxPushCurrent", push)
    monkeypatch.setattr(cu, "cuCtxPopCurrent", pop)
    compiled = prepared.compiled_kernel  # (the fake that fakes.offline_gpu set, if any)

    def compiled_here(dispatcher, args):
        kernel = compiled(dispatcher, args)
        kernel._codelibrary.get_cufunc().device = types.SimpleNamespace(id=two_gpus["current"])
        return kernel

    monkeypatch.setattr("numbatma._prepared_launch.compiled_kernel", compiled_here)
    launch = fake.launch
    monkeypatch.setattr(cu, "cuLaunchKernel", lambda *a: calls.append(("launch on", two_gpus["current"])) or
                        launch(*a))
    return calls


def _k(x):
    pass


def test_a_prepared_launch_runs_on_its_device_whatever_is_current(two_gpus, contexts):
    from numba import cuda

    two_gpus["current"] = 1
    run = internals.prepare_launch(cuda.jit(_k), (fakes.numba_array((64,), np.float32, GB),), 1, 32, 0)
    assert type(run) is internals.ContextLaunch and run.device == 1 and int(run.context) == 101
    contexts.clear()
    run()
    assert contexts == ["get", ("launch on", 1)]  # (its device is current: one look, no switch)
    two_gpus["current"] = 0
    contexts.clear()
    run()
    assert contexts == ["get", ("push", 101), ("launch on", 1), "pop"] and two_gpus["current"] == 0


def test_a_launch_refused_while_pushed_says_where_it_ran(two_gpus, contexts, monkeypatch):
    from cuda.bindings import driver as cu
    from numba import cuda
    from numba.cuda.cudadrv.driver import CudaAPIError

    two_gpus["current"] = 1
    run = internals.prepare_launch(cuda.jit(_k), (fakes.numba_array((64,), np.float32, GB),), 1, 32, 0)
    two_gpus["current"] = 0
    monkeypatch.setattr(run, "_launch", lambda *a: (cu.CUresult.CUDA_ERROR_INVALID_HANDLE,))
    with pytest.raises(CudaAPIError, match="INVALID_HANDLE.*runs on device 1, where it was prepared.*the stream "
                                           "must be one of device 1"):
        run(0x1234)
    assert two_gpus["current"] == 0  # (popped again)


def test_with_one_device_a_prepared_launch_compares_nothing(two_gpus, contexts, monkeypatch):
    from numba import cuda

    monkeypatch.setattr(devices, "_COUNT", [1])
    run = internals.prepare_launch(cuda.jit(_k), (fakes.numba_array((64,), np.float32, GB),), 1, 32, 0)
    assert type(run) is internals.PreparedLaunch
    contexts.clear()
    run()
    run()
    assert contexts == [("launch on", 0)] * 2


# -- descriptors: their device, recorded when encoded; checked at launch ----------------------------------------------
def test_a_descriptor_records_its_arrays_device_and_stays_there(two_gpus, monkeypatch):
    monkeypatch.setattr(devices, "pointer_device", lambda ptr: 1 if ptr < 4 * GB else 0)
    monkeypatch.setattr(_descriptor_base.TMADescriptor, "_encode_driver", lambda self, driver: "encoded")
    monkeypatch.setattr(_descriptor_base, "_replace_address", lambda raw, ptr: (0,))
    tm = TensorMap(fakes.FakeCudaArray((64, 64), np.float32, ptr=GB), (16, 16))
    assert tm._device_id is None
    assert tm.driver_tensor_map() == "encoded" and tm._device_id == 1
    assert two_gpus["entered"][-1] == 1  # (encoded with its array's device current)
    with pytest.raises(TensorMapError, match="TensorMap.repoint: the new array is on device 0 but this TensorMap "
                                             "describes memory of device 1"):
        tm.repoint(fakes.FakeCudaArray((64, 64), np.float32, ptr=5 * GB))
    tm.repoint(fakes.FakeCudaArray((64, 64), np.float32, ptr=2 * GB))  # (the same device: re-pointed)
    assert tm._ptr == 2 * GB


def _encoded(device):
    tm = TensorMap(fakes.FakeCudaArray((64, 64), np.float32, ptr=GB), (16, 32))
    tm._descriptor, tm._device_id = object(), device
    return tm


def test_a_descriptor_of_another_device_is_refused_at_launch(two_gpus, monkeypatch):
    monkeypatch.setattr("numbatma._launch_hooks.current_device_id", lambda: 1)
    tm = _encoded(0)
    with pytest.raises(TensorMapError) as info:  # (numba's own launch)
        internals._prepare_numbatma_arg(tm.numba_type, tm, [])
    text = str(info.value)
    assert "this TensorMap describes memory of device 0, but the kernel launches on device 1" in text
    assert "cuda.gpus[0]" in text and "numbatma.enable_peer_access(1, 0)" in text
    internals._prepared_device.device = 1  # (a prepared launch of device 1 being built or patched)
    try:
        with pytest.raises(TensorMapError, match="but the prepared launch runs on device 1"):
            internals._prepare_numbatma_arg(tm.numba_type, tm, [])
        devices._PEERS.add((1, 0))
        args = []
        internals._prepare_numbatma_arg(tm.numba_type, tm, args)  # (peer access: a prepared launch takes it)
        assert args == [tm._descriptor]
    finally:
        internals._prepared_device.device = None
    with pytest.raises(TensorMapError, match="launch through numbatma.prepare_launch"):  # (numba's own: still no)
        internals._prepare_numbatma_arg(tm.numba_type, tm, [])
    same = []
    internals._prepare_numbatma_arg(tm.numba_type, _encoded(1), same)
    assert len(same) == 1


def test_dynamic_shared_memory_is_granted_per_device(monkeypatch):
    from cuda.bindings import driver as cu

    current = [0]
    granted = []
    monkeypatch.setattr(devices, "current_device", lambda: current[0])
    monkeypatch.setattr(cu, "cuDeviceGetAttribute", lambda attribute, device: (cu.CUresult.CUDA_SUCCESS, 232448))
    monkeypatch.setattr(cu, "cuKernelSetAttribute", lambda attribute, n, handle, device: granted.append(
        (n, handle, int(device))) or (cu.CUresult.CUDA_SUCCESS,))

    def cufunc():  # (numba loads the kernel once per device: that device's handle)
        return types.SimpleNamespace(attrs=types.SimpleNamespace(shared=0), handle=10 + current[0],
                                     device=types.SimpleNamespace(id=current[0]))

    kernel = types.SimpleNamespace(_codelibrary=types.SimpleNamespace(get_cufunc=cufunc))
    internals._ensure_dynamic_smem(kernel, 100_000)
    internals._ensure_dynamic_smem(kernel, 100_000)
    current[0] = 1
    internals._ensure_dynamic_smem(kernel, 100_000)
    internals._ensure_dynamic_smem(kernel, 1000)
    assert granted == [(100_000, 10, 0), (100_000, 11, 1)]
    assert kernel._numbatma_dynamic_smem == {0: 100_000, 1: 100_000}


# -- peer access --------------------------------------------------------------------------------------------------------
class PeerDriver:
    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = types.SimpleNamespace(name="CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED")

    def __init__(self, state, links, answer=0):
        self.state, self.links, self.answer, self.enabled = state, links, answer, []

    def cuInit(self, flags):
        return (0,)

    def cuDeviceCanAccessPeer(self, device, peer):
        return (0, int((device, peer) in self.links))

    def cuCtxEnablePeerAccess(self, context, flags):
        self.enabled.append((self.state["current"], context))
        return (self.answer,)


@pytest.fixture
def peers(two_gpus, monkeypatch):
    from numba import cuda

    fake = PeerDriver(two_gpus, {(0, 1), (1, 0)})
    monkeypatch.setattr(devices, "_DRIVER", fake)
    monkeypatch.setattr(cuda, "gpus", [types.SimpleNamespace(get_primary_context=lambda i=i: types.SimpleNamespace(
        handle=f"context of device {i}")) for i in range(3)], raising=False)
    return fake


def test_enable_peer_access_once_per_pair(two_gpus, peers):
    assert numbatma.enable_peer_access is devices.enable_peer_access
    assert not numbatma.peer_access_enabled(1, 0) and numbatma.peer_access_enabled(1, 1)
    numbatma.enable_peer_access(1, 0)
    assert peers.enabled == [(1, "context of device 0")]  # (in device 1's context, for device 0's)
    assert two_gpus["current"] == 0 and numbatma.peer_access_enabled(1, 0) and not numbatma.peer_access_enabled(0, 1)
    numbatma.enable_peer_access(1, 0)
    numbatma.enable_peer_access(types.SimpleNamespace(index=1), 0)  # (a torch.device)
    numbatma.enable_peer_access(0, 0)
    assert len(peers.enabled) == 1  # (idempotent; a device's own memory needs nothing)
    peers.answer = PeerDriver.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED  # (enabled by someone else before)
    numbatma.enable_peer_access(0, 1)
    assert numbatma.peer_access_enabled(0, 1)


def test_enable_peer_access_refuses_what_cannot_be(two_gpus, peers, monkeypatch):
    with pytest.raises(ValueError, match=r"enable_peer_access: peer 2 is not a device of this process: it sees 2 "):
        numbatma.enable_peer_access(0, 2)  # (two devices: there is no device 2)
    monkeypatch.setattr(devices, "_COUNT", [3])
    with pytest.raises(RuntimeError, match=r"enable_peer_access\(0, 2\): device 0 cannot access device 2's memory"):
        numbatma.enable_peer_access(0, 2)
    with pytest.raises(ValueError, match="a device ordinal"):
        numbatma.enable_peer_access(-1, 0)
    with pytest.raises(ValueError, match="a device ordinal"):
        numbatma.enable_peer_access(True, 0)
    peers.answer = types.SimpleNamespace(name="CUDA_ERROR_TOO_MANY_PEERS")
    with pytest.raises(RuntimeError, match="cuCtxEnablePeerAccess failed: CUDA_ERROR_TOO_MANY_PEERS"):
        numbatma.enable_peer_access(1, 0)
    assert not numbatma.peer_access_enabled(1, 0)


def test_the_public_names():
    for name in ("array_device", "enable_peer_access", "peer_access_enabled"):
        assert name in numbatma.__all__ and getattr(numbatma, name) is getattr(devices, name)


def test_what_numba_offers_the_device_readers():
    """array_device reads a numba array's ``gpu_data.owner`` (a MemoryPointer: itself, or the owner it was made with,
    e.g. the array ``cuda.as_cuda_array`` wrapped), ``is_managed`` (numba's own allocations) and ``context.device.id``;
    enter_device pushes numba's primary context (``cuda.gpus[i].get_primary_context()``, ``Context.push`` / ``pop``).
    They exist, as used, in this numba-cuda."""
    import inspect

    from numba.cuda import api
    from numba.cuda.cudadrv import devices as numba_devices
    from numba.cuda.cudadrv import driver as numba_driver

    init = inspect.getsource(numba_driver.MemoryPointer.__init__)
    assert "self.context = context" in init and "self._owner = owner" in init
    assert "self.is_managed = finalizer is not None" in init
    assert "return self if self._owner is None else self._owner" in inspect.getsource(numba_driver.MemoryPointer)
    assert "owner=owner" in inspect.getsource(api.from_cuda_array_interface)
    for method in ("push", "pop"):
        assert callable(getattr(numba_driver.Context, method))
    assert callable(numba_driver.Device.get_primary_context)
    assert "self.get_primary_context = self._device.get_primary_context" in inspect.getsource(
        numba_devices._DeviceContextManager.__init__)


def test_pointer_device_asks_for_the_owning_context(monkeypatch):
    """The device of an address: its context (CU_POINTER_ATTRIBUTE_CONTEXT), that context's device
    (cuCtxGetDevice_v2), remembered per context; memory no context owns (pools, VMM) and unknown memory: None. (The
    driver's DEVICE_ORDINAL attribute answered 0 for device 1's memory on a two-H100 machine: not asked.)"""
    from types import SimpleNamespace

    calls = []

    class Driver:
        CUpointer_attribute = SimpleNamespace(CU_POINTER_ATTRIBUTE_CONTEXT="CTX")

        @staticmethod
        def cuPointerGetAttribute(attribute, ptr):
            assert attribute == "CTX"
            return {GB: (0, 0x1111), 2 * GB: (0, 0x2222), 3 * GB: (0, 0)}.get(ptr, (1, None))

        @staticmethod
        def cuCtxGetDevice_v2(context):
            calls.append(context)
            return 0, {0x1111: 1, 0x2222: 0}[int(context)]

    monkeypatch.setattr(devices, "_DRIVER", Driver)
    monkeypatch.setattr(devices, "_POINTER_CONTEXT", "CTX")
    monkeypatch.setattr(devices, "_CONTEXT_DEVICES", {})
    assert devices.pointer_device(GB) == 1 and devices.pointer_device(2 * GB) == 0
    assert devices.pointer_device(GB) == 1 and calls == [0x1111, 0x2222]  # (remembered per context)
    assert devices.pointer_device(3 * GB) is None  # (no context owns it)
    assert devices.pointer_device(4 * GB) is None and devices.pointer_device(0) is None  # (unknown; NULL)


def test_one_device_launch_does_not_ask_for_the_device(monkeypatch):
    """In a process that sees one device every descriptor is on it: numba's launch path does not look the current
    device up for each descriptor argument (the host-path cost of a user kernel taking TensorMaps)."""
    monkeypatch.setattr(devices, "_COUNT", [1])
    monkeypatch.setattr("numbatma._launch_hooks.current_device_id", lambda: pytest.fail("the current device was looked up"))
    tm, args = _encoded(0), []
    internals._prepare_numbatma_arg(tm.numba_type, tm, args)
    assert args == [tm._descriptor]
