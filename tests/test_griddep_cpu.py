"""CPU tests of programmatic dependent launch (PDL): both grid-dependency intrinsics compile to their exact PTX
and link through nvJitLink for every target (sm_90a, sm_100a, sm_120a all have them); the SASS has them in
program order, with the dependent kernel's global loads after the wait; the host side: ``prepare_launch(...,
dependent=True)`` launches through ``cuLaunchKernelEx`` with the programmatic stream serialization attribute (the
driver calls intercepted), ``numbatma.dependent_launch()`` does the same for prepared runs and for launches through
numba (hook 11: cuda.core's ``LaunchConfig`` gets ``programmatic_stream_serialization=True``); the GPU test kernels
compile offline."""
import types as pytypes

import pytest
from numba import cuda, types

import numbatma
from numbatma import _numba_internals as internals
from numbatma import compile as nbc
from numbatma.intrinsics import all_ptx, griddep, griddepcontrol_launch_dependents, griddepcontrol_wait
from numbatma.intrinsics._asm import TARGETS

SIG = (types.float32[::1], types.float32[::1])


def producer(x, y):
    griddepcontrol_launch_dependents()  # early: the dependent's prologue overlaps this whole kernel
    i = cuda.grid(1)
    if i < x.size:
        y[i] = 2.0 * x[i] + 1.0


def consumer(y, z):
    i = cuda.grid(1)
    griddepcontrol_wait()  # before the first read of what the producer wrote
    if i < y.size:
        z[i] = y[i] * y[i]


@pytest.fixture(scope="module", params=TARGETS)
def compiled(request):
    arch = request.param
    ptx = {f.__name__: nbc.compile_ptx(f, SIG, arch=arch) for f in (producer, consumer)}
    return arch, ptx


def _body(ptx):
    return ptx[ptx.index(".entry"):]


def test_table_and_exports():
    assert griddep.PTX == {"griddepcontrol_launch_dependents": griddep.LAUNCH_DEPENDENTS,
                           "griddepcontrol_wait": griddep.WAIT}
    assert griddep.LAUNCH_DEPENDENTS.text == "griddepcontrol.launch_dependents;"
    assert griddep.WAIT.text == "griddepcontrol.wait;"
    for name, ptx in griddep.PTX.items():
        assert all_ptx()[name] is ptx
        assert ptx.min_sm == 90 and ptx.targets is None  # PTX ISA 7.8, sm_90+: every numbatma target
        assert ptx.memory  # (a compiler memory barrier: loads stay after the wait)
    assert griddep in numbatma.intrinsics.FAMILIES
    assert sorted(griddep.__all__) == ["griddepcontrol_launch_dependents", "griddepcontrol_wait"]
    for name in griddep.__all__:
        assert getattr(numbatma.intrinsics, name) is getattr(griddep, name)
        doc = getattr(griddep, name).__doc__
        assert "Simulator" in doc and "PTX (generated from the PTX table" in doc
        assert f"``{griddep.PTX[name].text}``" in doc


def test_exact_ptx_text(compiled):
    arch, ptx = compiled
    assert f".target {arch}" in ptx["producer"]
    lines = [line.strip() for line in _body(ptx["producer"]).splitlines()]
    assert lines.count("griddepcontrol.launch_dependents;") == 1 and "griddepcontrol.wait;" not in lines
    lines = [line.strip() for line in _body(ptx["consumer"]).splitlines()]
    assert lines.count("griddepcontrol.wait;") == 1 and "griddepcontrol.launch_dependents;" not in lines


def test_consumer_loads_after_the_wait(compiled):
    arch, ptx = compiled
    body = _body(ptx["consumer"])
    assert body.index("griddepcontrol.wait;") < body.index("ld.global")


def test_links_for_every_target(compiled):
    arch, ptx = compiled
    for text in ptx.values():
        assert nbc.link_cubin(text, arch)[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", TARGETS)
def test_sass_in_program_order(arch):
    """numba-cuda's own build (LTO through nvJitLink): ``launch_dependents`` is PREEXIT, ``wait`` is ACQBULK,
    and the consumer's global load comes after the wait."""
    def both(y, z):
        griddepcontrol_launch_dependents()
        i = cuda.grid(1)
        griddepcontrol_wait()
        if i < y.size:
            z[i] = y[i] * y[i]

    sass = nbc.sass(nbc.compile_cubin(both, SIG, arch=arch))
    ops = [line.split("*/", 1)[1].split(";")[0].strip() for line in sass.splitlines()
           if line.strip().startswith("/*") and "*/" in line]
    names = [op.split()[0] if op else "" for op in ops]
    assert "PREEXIT" in names and "ACQBULK" in names, sass
    first_load = next(i for i, n in enumerate(names) if n.startswith("LDG"))
    assert names.index("PREEXIT") < names.index("ACQBULK") < first_load


def test_typing_takes_no_arguments():
    def k(y, z):
        griddepcontrol_wait(1)

    with pytest.raises(Exception, match=r"griddepcontrol_wait: takes \(\)"):
        nbc.compile_ptx(k, SIG, arch="sm_90a")


# -- host side: the launch attribute ------------------------------------------------------------------------------
class _Recorder:
    """Stands in for cuda.core's ``launch`` (no GPU): records (stream, config, kernel, args)."""

    def __init__(self):
        self.calls = []

    def __call__(self, stream, config, kernel, *args):
        self.calls.append((stream, config, kernel, args))


@pytest.fixture
def offline_launch(monkeypatch):
    """``_numba_internals.prepare_launch`` with everything that needs a GPU replaced: the compiled kernel (a
    stand-in with numba's ``_Kernel`` attributes whose arguments numba-cuda's own ``_prepare_args`` marshals), the
    dynamic shared-memory attribute and the driver's launch calls (tests/fakes.py's FakeDriver)."""
    from fakes import FakeDriver, OfflineKernel

    kernel = OfflineKernel((types.float32, types.int32))
    driver = FakeDriver([4, 4]).install(monkeypatch)
    monkeypatch.setattr("numbatma._prepared_launch.compiled_kernel", lambda dispatcher, args: kernel)
    monkeypatch.setattr("numbatma._prepared_launch._ensure_dynamic_smem", lambda k, nbytes: None)
    return kernel, driver


def _params(*values):
    import struct

    return tuple(struct.pack("<" + fmt, v) for fmt, v in values)


@pytest.mark.parametrize("dependent", [False, True])
def test_prepare_launch_sets_programmatic_stream_serialization(offline_launch, dependent):
    kernel, driver = offline_launch
    run = numbatma.prepare_launch(object(), (1.5, 7), (4, 2), 128, 1024, dependent=dependent)
    run()
    run(5)  # (a raw stream handle)
    run(5)
    assert len(driver.calls) == 3
    first, second, third = driver.calls
    assert (first["stream"], second["stream"], third["stream"]) == (0, 5, 5)
    for call in driver.calls:
        assert call["function"] == kernel.handle and call["params"] == _params(("f", 1.5), ("i", 7))
        assert call["dependent"] is dependent
        assert (call["grid"], call["block"], call["shared_mem"]) == ((4, 2, 1), (128, 1, 1), 1024)
    if dependent:  # (the launch configuration is built once per stream)
        config = run._dependent_memo[1]
        run(5)
        assert run._dependent_memo[1] is config and driver.calls[-1]["stream"] == 5


def test_prepared_run_inside_dependent_launch_is_dependent(offline_launch):
    kernel, driver = offline_launch
    run = numbatma.prepare_launch(object(), (1.5, 7), 4, 128)
    run()
    with numbatma.dependent_launch():
        run()
        with numbatma.dependent_launch(False):
            run()
    run()
    assert [c["dependent"] for c in driver.calls] == [False, True, False, False]
    explicit = numbatma.prepare_launch(object(), (1.5, 7), 4, 128, dependent=True)
    with numbatma.dependent_launch(False):
        explicit()  # (dependent=True holds whatever the scope says)
    assert driver.calls[-1]["dependent"] is True
    unscoped = numbatma.prepare_launch(object(), (1.5, 7), 4, 128, scoped=False)
    with numbatma.dependent_launch():
        unscoped()  # (scoped=False: the scope does not reach it)
    assert driver.calls[-1]["dependent"] is False


def test_launch_config_builds_without_a_gpu():
    from cuda.bindings import driver

    config = internals.launch_config((3,), (32, 4), 0, dependent=True, stream=driver.CUstream(7))
    assert config.numAttrs == 1
    attribute = config.attrs[0]
    assert attribute.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attribute.value.programmaticStreamSerializationAllowed == 1
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (3, 1, 1)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ, config.sharedMemBytes) == (32, 4, 1, 0)
    assert int(config.hStream) == 7
    assert internals.launch_config(1, 32, 0).numAttrs == 0


def test_dependent_is_keyword_only():
    import inspect

    params = inspect.signature(numbatma.prepare_launch).parameters
    assert list(params) == ["kernel", "args", "grid", "block", "shared_mem", "dependent", "scoped"]
    assert params["dependent"].kind is inspect.Parameter.KEYWORD_ONLY and params["dependent"].default is False
    assert params["scoped"].kind is inspect.Parameter.KEYWORD_ONLY and params["scoped"].default is True
    assert params["shared_mem"].default == 0


class _FakeDispatcher:
    """A kernel launched through numba (``kernel[grid, block, stream, smem](*args)``): records the launch
    configuration and whether the launch was made inside a dependent-launch scope (what hook 11 reads)."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, config):
        def launch(*args):
            self.launches.append((config, args, internals.dependent_launches()))

        return launch


@pytest.mark.parametrize("dependent", [False, True])
def test_fallback_launch_through_numba_carries_dependent(monkeypatch, dependent):
    """Where the launch cannot be prepared (a debug kernel, host arrays: ``_numba_internals.prepare_launch``
    returns None), each run launches through numba, and ``dependent=True`` puts it in hook 11's scope."""
    monkeypatch.setattr("numbatma._prepared_launch.prepare_launch", lambda *a, **k: None)
    # the handle becomes numba's external stream at this edge (numbatma.streams.numba_stream), and only here
    monkeypatch.setattr("numbatma.streams._external", lambda handle: ("external", handle))
    kernel = _FakeDispatcher()
    run = numbatma.prepare_launch(kernel, [1, 2], 8, 64, 256, dependent=dependent)
    run(3)
    run(0)
    assert kernel.launches == [((8, 64, ("external", 3), 256), (1, 2), dependent), ((8, 64, 0, 256), (1, 2), dependent)]
    assert not internals.dependent_launches()


def test_dependent_launch_scope_is_per_thread_and_restored():
    import threading

    seen = []
    with numbatma.dependent_launch():
        worker = threading.Thread(target=lambda: seen.append(internals.dependent_launches()))
        worker.start()
        worker.join()
        seen.append(internals.dependent_launches())
        with pytest.raises(RuntimeError):
            with numbatma.dependent_launch(False):
                raise RuntimeError
        seen.append(internals.dependent_launches())
    seen.append(internals.dependent_launches())
    assert seen == [False, True, True, False]


def test_numba_launch_gets_the_attribute_inside_the_scope(monkeypatch):
    """Hook 11 end to end short of the driver: numba-cuda's own ``_Kernel.launch`` (with hook 3's wrapper; a
    stand-in kernel object) builds its LaunchConfig and calls the dispatcher module's ``launch``, whose wrapper
    (hook 11, over a recorder in place of cuda.core's) sets the attribute inside ``dependent_launch()`` only."""
    from numba.cuda import dispatcher

    assert dispatcher.launch.__module__ == "numbatma._launch_hooks"  # (installed on the GPU path)
    recorder = _Recorder()
    monkeypatch.setattr(dispatcher, "launch", internals._dependent_core_launch(recorder))
    kernel = pytypes.SimpleNamespace(
        debug=False, cooperative=False, launch_bounds=None, argument_types=(types.int32,),
        _prepare_args=lambda ty, value, stream, retr, kernelargs: kernelargs.append(value),
        _codelibrary=pytypes.SimpleNamespace(get_cufunc=lambda: pytypes.SimpleNamespace(kernel="the-cufunc")),
    )
    dispatcher._Kernel.launch(kernel, (5,), (2, 1, 1), (64, 1, 1), "the-stream", 0)
    with numbatma.dependent_launch():
        dispatcher._Kernel.launch(kernel, (6,), (2, 1, 1), (64, 1, 1), "the-stream", 0)
    dispatcher._Kernel.launch(kernel, (7,), (2, 1, 1), (64, 1, 1), "the-stream", 0)
    assert [(c[0], c[2], c[3]) for c in recorder.calls] == [("the-stream", "the-cufunc", (v,)) for v in (5, 6, 7)]
    assert [c[1].programmatic_stream_serialization for c in recorder.calls] == [False, True, False]
    assert recorder.calls[1][1].grid == (2, 1, 1) and recorder.calls[1][1].block == (64, 1, 1)


# -- the GPU test's kernels compile offline ---------------------------------------------------------------------
@pytest.mark.parametrize("arch", TARGETS)
def test_gpu_test_kernels_compile(arch):
    import test_gpu_griddep as G

    for kernel in (G.k_produce, G.k_consume, G.k_finish):
        ptx = nbc.compile_ptx(kernel, G.SIGNATURES[kernel.__name__], arch=arch)
        nbc.link_cubin(ptx, arch)
    assert "griddepcontrol.launch_dependents;" in nbc.compile_ptx(G.k_produce, G.SIGNATURES["k_produce"], arch=arch)
    body = _body(nbc.compile_ptx(G.k_consume, G.SIGNATURES["k_consume"], arch=arch))
    before, after = body.split("griddepcontrol.wait;")
    assert before.count("ld.global") == 1 and after.count("ld.global") == 1  # (its own input w before; y after)


def test_plans_follow_the_dependent_scope(monkeypatch):
    """The ready-made kernels call griddepcontrol_wait before they touch memory: their prepared runs are scoped,
    so inside numbatma.dependent_launch() they launch dependent (and outside it they do not)."""
    import numbatma
    from numbatma import _numba_internals as internals

    seen = []

    def fake_prepare(dispatcher, args, grid, block, shared_mem, dependent=False, scoped=True, sources=None):
        seen.append((dependent, scoped))
        return lambda stream=0: None

    monkeypatch.setattr("numbatma._prepared_launch.prepare_launch", fake_prepare)
    from numbatma.kernels import Plan

    class Tiny(Plan):
        kernel = object()
        grid, block = 1, 32
        args = ()
        output = "out"

    with numbatma.dependent_launch():
        assert Tiny().launch() == "out"
    assert seen == [(False, True)]  # (not dependent by itself; scoped: the enclosing dependent_launch decides)


# Global memory accesses a kernel of numbatma.kernels may make (PTX mnemonics' prefixes).
_GLOBAL_ACCESS = ("ld.global", "st.global", "red.global", "atom.global", "cp.async.bulk", "cp.reduce.async.bulk")


def _plan_cases():
    """Every plan of tests/test_kernel_plans_cpu.py's contract test, and the kernels those plans do not reach: the
    copy with a tail, the two-role copy, chunked softmax, attention."""
    import numpy as np

    from fakes import FakeCudaArray
    from numbatma.kernels import Attention, Softmax, StreamCopy
    from test_kernel_plans_cpu import PLANS

    def fa(shape, dtype=np.float32, ptr=1 << 20):
        return FakeCudaArray(shape, dtype, ptr=ptr)

    g = 1 << 34
    return dict(PLANS, **{
        "StreamCopy-tail": lambda: StreamCopy(fa((512, 500)), fa((512, 500), ptr=g)),
        "StreamCopy-two-roles": lambda: StreamCopy(fa((512, 512)), fa((512, 512), ptr=g), two_roles=True),
        "Softmax-chunked": lambda: Softmax(fa((100, 40000)), fa((100, 40000), ptr=g)),
        "Attention": lambda: Attention(*(fa((1, 2, 256, 64), np.float16, ptr=p) for p in (1 << 20, 1 << 30, 1 << 31,
                                                                                            g)),
                                       fa((1, 2, 256), ptr=1 << 36)),
    })


@pytest.mark.parametrize("name", sorted(_plan_cases()))
def test_every_plan_kernel_waits_before_touching_memory(name, monkeypatch):
    """PTX of each ready-made kernel: ``griddepcontrol.wait`` comes before its first global memory access and
    ``griddepcontrol.launch_dependents`` right after it - so launching a chain of plans dependent is safe."""
    from numbatma.kernels import _launch

    monkeypatch.setattr(_launch, "sm_count", lambda *a: 132)
    plan = _plan_cases()[name]()
    body = _body(nbc.compile_ptx(plan.kernel.py_func, plan.args, arch="sm_90a"))
    lines = [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("//")]
    wait = lines.index("griddepcontrol.wait;")
    assert lines[wait + 1] == "griddepcontrol.launch_dependents;"
    first = next(i for i, ln in enumerate(lines) if ln.startswith(_GLOBAL_ACCESS) or
                 any(" " + m in ln or "\t" + m in ln for m in _GLOBAL_ACCESS))
    assert wait < first, (name, lines[first])
    assert body.count("griddepcontrol.wait;") == 1
