import os
import re

import pytest

from gpuinfo import gpu_reason

# The quick subset (``pytest -m quick``, about a minute on 2 cores where the whole suite takes several): host-side
# rules and validation, plan rules, the PTX registry, PTX / link / SASS checks, and a few simulator files (as
# tests/test_simulator.py's subprocess tests and, run directly under NUMBA_ENABLE_CUDASIM=1, as themselves). Files
# of seconds each on 2 cores; the kernel libraries' compiles, the examples and the long simulator files are left to
# the whole suite.
QUICK_FILES = frozenset({
    # host validation, plans and their rules, error messages
    "test_host_rules_cpu.py", "test_plan_rules_cpu.py", "test_tensormap_validation.py", "test_launch_params.py",
    "test_kernel_plans_cpu.py", "test_plan_cache_cpu.py", "test_devices_cpu.py", "test_import_graph.py",
    "test_ptx_registry.py", "test_typing_messages_cpu.py", "test_error_battery.py", "test_attention_reference_cpu.py",
    # PTX, link and SASS checks: every intrinsic in PTX and linked for each target, TMA, descriptor, wgmma, swizzle
    "test_compile.py", "test_accumulator_cpu.py", "test_descriptor_cpu.py", "test_wgmma_cpu.py",
    "test_tma_ops_cpu.py", "test_swizzle_cpu.py",
    # simulator files (semantics, diagnostics, a few intrinsic families)
    "test_simulator.py", "test_sim_accumulator.py", "test_sim_cluster.py", "test_sim_descriptor.py",
    "test_sim_diagnostics.py", "test_sim_semantics.py", "test_sim_tma_ops.py", "test_sim_streams.py",
})


def skip_gpu_tests_without_a_gpu(items):
    """Tests marked ``gpu`` are skipped (with the reason) unless a GPU with TMA (compute capability 9.0+) is
    usable."""
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


def deselect_by_pattern(config, items):
    """NUMBATMA_DESELECT=<regex> drops tests whose node id matches (used to keep a known fault on the GPU from
    taking down the other tests of its worker while it is investigated)."""
    pattern = os.environ.get("NUMBATMA_DESELECT")
    if pattern:
        keep = [item for item in items if not re.search(pattern, item.nodeid)]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def mark_quick(items):
    """Marks ``quick`` the tests of QUICK_FILES; a subprocess test of tests/test_simulator.py by the simulator file it
    runs (its parameter ``name``)."""
    for item in items:
        name = os.path.basename(str(item.fspath))
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if name == "test_simulator.py" and "name" in params:
            name = params["name"]
        if name in QUICK_FILES:
            item.add_marker(pytest.mark.quick)


def spread_simulator_subprocesses(items):
    """Spreads tests/test_simulator.py's subprocess tests (each a file or a shard of one under the simulator, seconds
    to a minute or two) evenly through the session, in that file's order (longest first). xdist hands each worker
    a block of consecutive tests up front (with ``--dist worksteal``, the README's and CI's choice: an equal share of
    the list, an idle worker then taking half of a busy one's remaining tests - 7:03 instead of 8:32 for the whole
    suite on 2 cores, 2026-11-28; with ``--dist load`` the rest in shrinking blocks from the front): spread out, the
    long subprocesses land in different workers' blocks instead of all in one worker's (which then finishes
    minutes after the others)."""
    sims = [item for item in items if os.path.basename(str(item.fspath)) == "test_simulator.py"]
    rest = [item for item in items if os.path.basename(str(item.fspath)) != "test_simulator.py"]
    if not sims or not rest:
        return
    step = len(rest) / len(sims)
    spread, j = [], 0
    for i, item in enumerate(rest):
        while j < len(sims) and j * step <= i:
            spread.append(sims[j])
            j += 1
        spread.append(item)
    items[:] = spread + sims[j:]


@pytest.hookimpl(tryfirst=True)  # (before -m selects by marker)
def pytest_collection_modifyitems(config, items):
    # one named function per purpose: mark the GPU tests to skip, then drop the deselected ones, mark the quick
    # subset, spread the simulator subprocesses
    skip_gpu_tests_without_a_gpu(items)
    deselect_by_pattern(config, items)
    mark_quick(items)
    spread_simulator_subprocesses(items)
