"""CPU: the checks of tests/test_gpu_multi_device.py (tests/multi_device_checks.py) against a faked process that sees
two devices (tests/test_devices_cpu.py's ``two_gpus`` and ``contexts``): they must pass where the rule holds and fail
where it does not, so that a refactor of the plan cache or of prepared launches breaks CI rather than a two-GPU run."""
import types

import pytest

import multi_device_checks as checks
from numbatma import _numba_internals as internals
from numbatma import devices
from numbatma.kernels import StreamCopy, plan_cache_info, softmax, stream_copy
from numbatma.launch import launch_facts
from numbatma import streams
from test_devices_cpu import GB, contexts, t, two_gpus  # noqa: F401 - (the fixtures)


@pytest.fixture
def gpus(two_gpus, contexts, monkeypatch):  # noqa: F811
    """Two faked devices (tests/test_devices_cpu.py), torch's current stream of device i a raw handle 0x100 + i."""
    monkeypatch.setattr(streams, "_external", lambda handle: handle)
    return two_gpus


def test_the_cached_plans_of_device_1_are_seen_on_device_1(gpus):
    stream_copy(t(device=1), t(device=1, ptr=2 * GB))
    stream_copy(t(device=1, ptr=3 * GB), t(device=1, ptr=4 * GB))  # (a hit: re-pointed)
    assert plan_cache_info()["misses"] == 1 and plan_cache_info()["hits"] == 1
    checks.check_cached_on(1, plan_cache_info()["misses"])
    with pytest.raises(AssertionError, match="cached plans on devices"):
        checks.check_cached_on(0, 1)
    softmax(t((8, 64), device=1, ptr=5 * GB), t((8, 64), device=1, ptr=6 * GB))  # (a plan with a hot entry of its own)
    checks.check_cached_on(1, 2)
    stream_copy(t(device=0, ptr=7 * GB), t(device=0, ptr=8 * GB))
    assert checks.cached_plan_devices() == [0, 1, 1]
    assert [p.device for p in checks.plans_by_device()] == [0, 1, 1]


def test_a_plan_of_device_1_runs_there_with_its_context_pushed(gpus, contexts):  # noqa: F811
    plan = StreamCopy(t(device=1), t(device=1, ptr=2 * GB))
    assert plan.prepared_launch is None
    plan.launch()
    checks.check_runs_on(plan, 1)
    with pytest.raises(AssertionError, match="launches on device 1, not 0"):
        checks.check_runs_on(plan, 0)
    assert ("push", 101) in contexts and gpus["current"] == 0


def test_with_one_device_nothing_is_switched(gpus, monkeypatch):
    monkeypatch.setattr(devices, "_COUNT", [1])
    plan = StreamCopy(t(device=0), t(device=0, ptr=2 * GB))
    plan.launch()
    checks.check_runs_on(plan, 0, switches_context=False)
    with pytest.raises(AssertionError):
        checks.check_runs_on(plan, 0)


def test_shared_memory_granted_per_device_is_reported(monkeypatch):
    from cuda.bindings import driver as cu

    current = [0]
    monkeypatch.setattr(devices, "current_device", lambda: current[0])
    monkeypatch.setattr(cu, "cuDeviceGetAttribute", lambda attribute, device: (cu.CUresult.CUDA_SUCCESS, 232448))
    monkeypatch.setattr(cu, "cuKernelSetAttribute", lambda *a: (cu.CUresult.CUDA_SUCCESS,))
    cufunc = lambda: types.SimpleNamespace(attrs=types.SimpleNamespace(shared=0), handle=10 + current[0],  # noqa: E731
                                           device=types.SimpleNamespace(id=current[0]))
    kernel = types.SimpleNamespace(_codelibrary=types.SimpleNamespace(get_cufunc=cufunc))
    run = internals.PreparedLaunch()
    run.kernel, run.device, run.slots = kernel, 0, ()
    plan = types.SimpleNamespace(prepared_launch=run, shared_mem=100_000)
    internals._ensure_dynamic_smem(kernel, 100_000)
    with pytest.raises(AssertionError, match=r"granted on devices \[0\], expected \[0, 1\]"):
        checks.check_shared_memory_granted(plan, {0, 1})
    current[0] = 1
    internals._ensure_dynamic_smem(kernel, 100_000)
    checks.check_shared_memory_granted(plan, {0, 1})
    assert launch_facts(run) == {"device": 0, "switches_context": False, "dynamic_smem": {0: 100_000, 1: 100_000},
                                 "prepared": True}


def test_launch_facts_of_a_launch_through_numba():
    """A launch that goes through numba each time (no parameter block): not prepared, no device known."""
    assert launch_facts(None) == {"device": None, "switches_context": False, "dynamic_smem": {}, "prepared": False}
    assert launch_facts(lambda stream=0: None)["prepared"] is False
