"""What the two-GPU tests (tests/test_gpu_multi_device.py) check of cached plans and prepared launches, on public API
only (:func:`numbatma.kernels.cached_plans`, :attr:`Plan.device`, :attr:`Plan.prepared_launch`,
:func:`numbatma.launch.launch_facts`). tests/test_multi_device_checks_cpu.py runs the same checks against a faked
process that sees two devices, so a refactor of the plan cache or of prepared launches fails CI, not only a run on a
machine with two GPUs (these tests once read plan-cache internals that a refactor had removed, and nothing noticed)."""
from numbatma.kernels import cached_plans
from numbatma.launch import launch_facts


def cached_plan_devices():
    """The devices of the function forms' cached plans, sorted."""
    return sorted(plan.device for plan in cached_plans())


def plans_by_device():
    """The cached plans, sorted by device."""
    return sorted(cached_plans(), key=lambda plan: plan.device)


def check_cached_on(device, count):
    """Exactly ``count`` plans are cached, all of them on ``device``."""
    devices = cached_plan_devices()
    assert devices == [device] * count, f"cached plans on devices {devices}, expected {count} on device {device}"


def check_runs_on(plan, device, switches_context=True):
    """``plan``'s prepared launch runs on ``device`` (pushing its context when another is current, where the process
    sees several devices)."""
    facts = launch_facts(plan.prepared_launch)
    assert facts["prepared"], f"{type(plan).__name__}: its launch is not prepared: {facts}"
    assert facts["device"] == device, f"{type(plan).__name__} launches on device {facts['device']}, not {device}"
    assert facts["switches_context"] is switches_context, facts


def check_shared_memory_granted(plan, devices):
    """The kernel of ``plan`` had its dynamic shared-memory limit raised on each of ``devices``, to at least what
    ``plan`` asks for."""
    granted = launch_facts(plan.prepared_launch)["dynamic_smem"]
    assert set(granted) == set(devices), f"granted on devices {sorted(granted)}, expected {sorted(devices)}"
    assert all(v >= plan.shared_mem for v in granted.values()), (granted, plan.shared_mem)
