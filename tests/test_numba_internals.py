"""Fails loudly when numba-cuda changes under numbatma's hooks (numbatma/_numba_internals.py and the seam modules it
lists: _launch_hooks.py, _prepared_launch.py, _sim_hooks.py, _lowering_sites.py, _disk_cache.py, _inline_copy.py)."""
import inspect
import re

import numpy as np
from numba import cuda, types

import numbatma
from numbatma import _disk_cache, _inline_copy, _launch_hooks, _lowering_sites, _prepared_launch, _sim_hooks
from numbatma import _numba_internals as internals
from numbatma import compile as nbc
from numbatma._types import SharedArray

from fakes import FakeCudaArray

# The modules that touch numba-cuda private names (docs/architecture.md: the seam).
SEAM_MODULES = (internals, _launch_hooks, _prepared_launch, _sim_hooks, _lowering_sites, _disk_cache, _inline_copy)
SEAM = {m.__name__ for m in SEAM_MODULES}


def test_numba_cuda_version_in_tested_range():
    lo, hi = internals.TESTED_RANGE
    assert lo <= internals.numba_cuda_version() < hi


def test_hook_points_exist_with_expected_signatures():
    points = internals._hook_points()
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import nvvm

    # the hooks are installed (our wrappers are in place)
    assert nvvm.set_cuda_kernel.__module__ == internals.__name__
    assert nvvm.compile_ir.__module__ == internals.__name__
    assert dispatcher._Kernel._prepare_args.__module__ == _launch_hooks.__name__
    assert dispatcher._Kernel.launch.__module__ == _launch_hooks.__name__
    assert set(points) == {
        "nvvm.set_cuda_kernel", "_Kernel._prepare_args", "_Kernel.launch", "Cuda_shared_array.generic",
        "nvvm.compile_ir", "dispatcher.get_current_device", "dispatcher.LaunchConfig", "nvvm.set_launch_bounds",
        "dispatcher.launch",
    }
    assert dispatcher.get_current_device.__module__ == internals.__name__
    # compile_device asks get_current_device() (looked up in the dispatcher module) for the target CC
    assert "get_current_device().compute_capability" in inspect.getsource(dispatcher.CUDADispatcher.compile_device)
    # the upstream functions our wrappers call keep the argument lists we rely on
    src = inspect.getsource(dispatcher._Kernel.__init__)
    assert "kernel_fixup" in src
    from numba.cuda import compiler

    assert "nvvm.set_cuda_kernel(kernel)" in inspect.getsource(compiler.kernel_fixup)
    assert "kernel.args = kernel.args[1:]" in inspect.getsource(compiler.kernel_fixup)


def test_cluster_hook_points():
    """Hook 8: _Kernel.launch builds its launch configuration by calling dispatcher.LaunchConfig with keywords;
    cuda.core's LaunchConfig takes cluster= and then counts the grid in clusters; kernels get their launch
    bounds through nvvm.set_launch_bounds(kernel, launch_bounds), which stores the bounds on the _Kernel."""
    from cuda.core import LaunchConfig
    from numba.cuda import compiler, dispatcher
    from numba.cuda.cudadrv import nvvm

    assert dispatcher.LaunchConfig.__module__ == _launch_hooks.__name__
    assert dispatcher.LaunchConfig._numbatma_original is LaunchConfig
    assert nvvm.set_launch_bounds.__module__ == _launch_hooks.__name__
    source = inspect.getsource(dispatcher)  # (_Kernel.launch itself is numbatma's wrapper)
    assert re.search(r"config = LaunchConfig\(\s*grid=griddim,\s*block=blockdim,\s*shmem_size=sharedmem,", source)
    assert "from cuda.core import launch, LaunchConfig" in source
    assert "cluster" in LaunchConfig.__init__.__doc__ and "cluster" in LaunchConfig.__doc__
    assert "the grid parameter represents the number of\nclusters (not blocks)" in LaunchConfig.__doc__
    init = inspect.getsource(dispatcher._Kernel.__init__)
    assert "nvvm.set_launch_bounds(kernel, launch_bounds)" in init and "self.launch_bounds = launch_bounds" in init
    assert "nvvm.set_launch_bounds(kernel, launch_bounds)" in inspect.getsource(compiler)
    assert 'targetoptions["launch_bounds"] = launch_bounds' in inspect.getsource(cuda.jit)
    assert "_Kernel(self.py_func, argtypes, **self.targetoptions)" in inspect.getsource(dispatcher.CUDADispatcher)


def test_dependent_launch_hook_points():
    """Hook 11: _Kernel.launch builds a new cuda.core LaunchConfig for each launch and hands it to the module's
    ``launch`` (cuda.core's, looked up in the dispatcher module at call time) as ``launch(stream, config, kernel,
    *kernelargs)``; cuda.core's LaunchConfig has a settable ``programmatic_stream_serialization``."""
    from cuda.core import LaunchConfig, launch
    from numba.cuda import dispatcher

    assert dispatcher.launch.__module__ == _launch_hooks.__name__
    assert dispatcher.launch._numbatma_original is launch
    upstream = inspect.getsource(dispatcher._Kernel.launch._numbatma_original)  # (hook 3 wraps _Kernel.launch)
    assert re.search(r"config = LaunchConfig\(", upstream)
    assert "launch(stream, config, kernel, *kernelargs)" in upstream
    assert upstream.index("config = LaunchConfig(") < upstream.index("launch(stream, config, kernel, *kernelargs)")
    assert "from cuda.core import launch, LaunchConfig" in inspect.getsource(dispatcher)
    assert LaunchConfig(grid=1, block=32, programmatic_stream_serialization=True).programmatic_stream_serialization
    config = LaunchConfig(grid=(1, 1, 1), block=(32, 1, 1), shmem_size=0)  # (no cluster: needs no GPU)
    assert config.programmatic_stream_serialization is False
    config.programmatic_stream_serialization = True
    assert config.programmatic_stream_serialization is True


def test_dependent_launch_scope_sets_the_attribute():
    """Hook 11's wrapper: inside dependent_launch() the configuration handed to cuda.core's launch has
    programmatic_stream_serialization=True; outside, or inside dependent_launch(False), it is left alone;
    blocks nest and restore."""
    from cuda.core import LaunchConfig

    seen = []
    wrapped = internals._dependent_core_launch(lambda stream, config, kernel, *args: seen.append(
        (stream, config.programmatic_stream_serialization, kernel, args)))

    def config():
        return LaunchConfig(grid=(2, 1, 1), block=(32, 1, 1), shmem_size=0)

    wrapped("s", config(), "k", 1, 2)
    with internals.dependent_launch():
        assert internals.dependent_launches()
        wrapped("s", config(), "k", 3)
        with internals.dependent_launch(False):
            wrapped("s", config(), "k")
        wrapped("s", config(), "k")
    assert not internals.dependent_launches()
    wrapped("s", config(), "k")
    assert seen == [("s", False, "k", (1, 2)), ("s", True, "k", (3,)), ("s", False, "k", ()), ("s", True, "k", ()),
                    ("s", False, "k", ())]


def test_disk_cache_hook_points():
    """Hook 12 (enable_disk_cache): a subclass of CUDACache set as the dispatcher's ``_cache`` (what
    enable_caching does); its _index_key repeats upstream's key (Cache._index_key: sig, magic tuple, numba-cuda
    version, (bytecode hash, closure hash); CUDACache adds the launch-config entry) with the closure hash replaced;
    its _load_overload / _save_overload repeat upstream's steps (index key, index file, impl.rebuild /
    check_cachable, ensure_cache_path, reduce); compile() reaches the cache through load_overload /
    save_overload and counts hits and misses per signature; a rebuilt kernel has no launch_bounds."""
    from numba.cuda import dispatcher
    from numba.cuda.core import caching

    points = internals._disk_cache_hook_points()
    for label, (owner, attr) in points.items():
        assert callable(getattr(owner, attr, None)), label
    assert issubclass(internals._keyed_cache_class(), dispatcher.CUDACache)
    assert "self._cache = CUDACache(self.py_func)" in inspect.getsource(dispatcher.CUDADispatcher.enable_caching)
    assert list(inspect.signature(dispatcher.CUDACache.__init__).parameters) == ["self", "py_func"]
    index_key = inspect.getsource(caching.Cache._index_key)
    assert "codebytes = self._py_func.__code__.co_code" in index_key
    assert "cvars = tuple([x.cell_contents for x in self._py_func.__closure__])" in index_key
    assert "hasher = lambda x: hashlib.sha256(x).hexdigest()" in index_key
    assert re.search(r"return \(\s*sig,\s*codegen\.magic_tuple\(\),\s*numba_cuda\.__version__,\s*\(\s*"
                     r"hasher\(codebytes\),\s*hasher\(cvarbytes\),?\s*\),?\s*\)", index_key), index_key
    cuda_key = dispatcher.CUDACache._index_key
    cuda_key = inspect.getsource(getattr(cuda_key, "_numbatma_original", cuda_key))  # (hook 10 may wrap it)
    assert "key = super()._index_key(sig, codegen)" in cuda_key
    assert 'key + (("launch_config", self._launch_config_key),)' in cuda_key
    assert "if self._launch_config_key is None:" in cuda_key
    load = inspect.getsource(caching.Cache._load_overload)
    for line in ("if not self._enabled:", "key = self._index_key(sig, target_context.codegen())",
                 "data = self._cache_file.load(key)", "data = self._impl.rebuild(target_context, data)"):
        assert line in load, line
    save = inspect.getsource(caching.Cache._save_overload)
    for line in ("if not self._enabled:", "if not self._impl.check_cachable(data):",
                 "self._impl.locator.ensure_cache_path()", "key = self._index_key(sig, data.codegen)",
                 "data = self._impl.reduce(data)", "self._cache_file.save(key, data)"):
        assert line in save, line
    assert "self._guard_against_spurious_io_errors()" in inspect.getsource(caching.Cache.load_overload)
    assert "return self._load_overload(sig, target_context)" in inspect.getsource(caching.Cache.load_overload)
    assert "self._save_overload(sig, data)" in inspect.getsource(caching.Cache.save_overload)
    assert list(inspect.signature(caching.IndexDataCacheFile.save).parameters) == ["self", "key", "data"]
    assert list(inspect.signature(caching.IndexDataCacheFile.load).parameters) == ["self", "key"]
    compile_src = inspect.getsource(dispatcher.CUDADispatcher.compile)
    for line in ("kernel = self._cache.load_overload(sig, self.targetctx)", "self._cache_hits[sig] += 1",
                 "self._cache_misses[sig] += 1", "self._cache.save_overload(sig, kernel)"):
        assert line in compile_src, line
    assert "cache_hits=self._cache_hits" in inspect.getsource(dispatcher.CUDADispatcher.stats.fget)
    assert "launch_bounds" not in inspect.signature(dispatcher._Kernel._rebuild).parameters


def test_simulator_hook_points_exist():
    """install_simulator's upstream objects (importable without NUMBA_ENABLE_CUDASIM) and the attributes of
    the simulator's threads numbatma's runtime reads."""
    points = internals._simulator_hook_points()
    for label, (owner, attr) in points.items():
        assert getattr(owner, attr, None) is not None, label
    from numba.cuda.simulator import kernel, kernelapi

    thread_init = inspect.getsource(kernel.BlockThread.__init__)
    for attr in ("self.syncthreads_blocked", "self._manager", "self.blockIdx", "self.threadIdx", "self.thread_id",
                 "self.abort"):
        assert attr in thread_init, attr
    assert "self._allocations" in inspect.getsource(kernelapi.FakeCUDAShared.__init__)
    assert "_dynshared" in inspect.getsource(kernelapi.FakeCUDAShared.__init__)
    assert "syncthreads()" in inspect.getsource(kernel.BlockThread.syncthreads_count)  # the wrapped method
    assert "syncthreads()" in inspect.getsource(kernelapi.FakeCUDAModule.syncthreads)
    # The replacement BlockManager.run builds threads and releases barriers as upstream's does.
    assert list(inspect.signature(kernel.BlockThread.__init__).parameters) == [
        "self", "f", "manager", "blockIdx", "threadIdx", "debug"]
    for attr in ("self.syncthreads_event", "self.exception"):
        assert attr in thread_init, attr
    manager_init = inspect.getsource(kernel.BlockManager.__init__)
    for attr in ("self._f", "self._block_dim", "self._debug"):
        assert attr in manager_init, attr
    # The device-function calls keep their module swapped for a launch (_sim_hooks._serialised_launch): upstream's
    # bookkeeping of swapped_cuda_module, used as it does.
    for name in ("_swap_refcount", "_swap_orig", "_globals_locks", "_locks_register_lock"):
        assert hasattr(kernelapi, name), name
    swap = inspect.getsource(kernelapi.swapped_cuda_module)
    for line in ("_swap_refcount[gid] == 0", "fn_globs.update(_swap_orig.pop(gid))", "del _swap_refcount[gid]"):
        assert line in swap, line
    assert "_get_kernel_context" in dir(kernel) and "swapped_cuda_module(self.fn" in inspect.getsource(
        kernel.FakeCUDAKernel.__call__)
    upstream_run = inspect.getsource(kernel.BlockManager.run)
    for line in ("BlockThread(target, self, grid_point, block_point, self._debug)", "t.syncthreads_event.set()",
                 "t.syncthreads_blocked = False", "raise t.exception[0].with_traceback(t.exception[1])"):
        assert line in upstream_run, line


def test_shared_array_typed_as_shared():
    def k(out):
        a = cuda.shared.array((4, 8), np.float32)
        out[0] = a[0, 0]

    from numba.cuda.compiler import compile_cuda
    from numba.cuda.descriptor import cuda_target

    cres = compile_cuda(k, types.void, (types.float32[::1],), cc=(9, 0))
    shared = [t for t in cres.type_annotation.typemap.values() if isinstance(t, SharedArray)]
    assert shared and shared[0].static_shape == (4, 8)
    del cuda_target


def test_byval_spelling_per_nvvm_dialect():
    ir_text = 'define void @k(%"struct.numbatma.CUtensorMap"* byval(%"struct.numbatma.CUtensorMap") align 128 %a)'
    assert "byval align 128" in internals._nvvm_ir_for_arch(ir_text, "compute_90a")
    assert internals._TYPED_BYVAL in internals._nvvm_ir_for_arch(ir_text, "compute_100a")


def test_grid_constant_annotation_lists_every_descriptor():
    d = numbatma.TensorMap(FakeCudaArray((64, 64), np.float32), (16, 32))

    def k(a, b, n, c):
        pass

    for arch in nbc.ARCHS:
        ptx = nbc.compile_ptx(k, (d.numba_type, d.numba_type, types.int32, d.numba_type), arch=arch)
        entry = ptx[ptx.index(".entry"): ptx.index(")", ptx.index(".entry"))]
        assert entry.count(".param .align 128 .b8") == 3, entry


def test_device_functions_compile_without_a_driver():
    """Hook 6: a kernel calling a device function compiles offline (compile_device asks the driver for the
    current device's compute capability unless numbatma.compile is compiling)."""
    from numba import cuda

    @cuda.jit(device=True)
    def twice(x):
        return 2 * x

    def k(out):
        out[0] = twice(out[0])

    for arch in nbc.ARCHS:
        assert "st.global" in nbc.compile_ptx(k, (types.float32[::1],), arch=arch)


def test_prepared_launch_follows_kernel_launch():
    """numbatma.prepare_launch repeats what _Kernel.launch does once (argument marshalling through
    _prepare_args, then cuda.core.launch(stream, LaunchConfig(...), cufunc.kernel, *kernelargs), which a prepared
    run replaces by the driver's launch of the same kernel: cufunc.handle, the CUkernel of cufunc.kernel); compiles
    the overload through the dispatcher's own argument typing; converts streams as _to_core_stream does (a numba
    stream by its ``handle``)."""
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import driver

    original = inspect.getsource(dispatcher)
    assert re.search(r"for t, v in zip\(self\.argument_types, args\):\s*self\._prepare_args\(t, v, stream, retr, "
                     r"kernelargs\)", original)
    assert "kernel = cufunc.kernel\n        launch(stream, config, kernel, *kernelargs)" in original
    assert "cufunc = self._codelibrary.get_cufunc()" in original
    assert "argtypes = [self.typeof_pyval(a) for a in args]\n        return self.compile(tuple(argtypes))" in original
    assert "self.stream = driver._to_core_stream(stream)" in original
    assert callable(driver._to_core_stream)
    assert "is_cooperative=self.cooperative" in original  # (prepared launches are never cooperative)
    # the CUkernel a prepared run launches: CudaPythonFunction keeps cuda.core's Kernel and its handle
    assert "__slots__" in inspect.getsource(driver.CudaPythonFunction)
    assert {"kernel", "handle"} <= set(driver.CudaPythonFunction.__slots__)
    assert "self.handle = kernel.handle" in inspect.getsource(driver.CudaPythonFunction.__init__)
    # streams: a numba Stream's handle is what _to_core_stream hands cuda.core
    to_core = inspect.getsource(driver._to_core_stream)
    assert "isinstance(stream, Stream)" in to_core and "from_handle(stream.handle or 0)" in to_core
    assert issubclass(driver.CudaAPIError, Exception) and "def __init__(self, code, msg)" in inspect.getsource(
        driver.CudaAPIError)


def test_prepared_launch_patches_an_array_at_numbas_data_pointer():
    """PreparedLaunch.update patches a replaced array's address at the fifth of its _prepare_args values: numba-cuda
    appends meminfo, parent, size, itemsize, the data pointer, the shape and the strides, in that order."""
    from numba.cuda import dispatcher

    src = inspect.getsource(dispatcher._Kernel._prepare_args._numbatma_original)
    order = ["kernelargs.append(meminfo)", "kernelargs.append(parent)", "kernelargs.append(devary.size)",
             "kernelargs.append(itemsize := devary.dtype.itemsize)", "kernelargs.append(devary.ptr)",
             "kernelargs.extend(shape := devary.shape)", "kernelargs.extend("]
    at = [src.index(piece) for piece in order]
    assert at == sorted(at) and internals._ARRAY_PTR == 4


def test_prepared_launch_lays_out_what_cuda_core_would_pass():
    """The parameter block (KernelParams) holds, for every value numba-cuda's _prepare_args marshalled, the bytes
    cuda.core's launch (its ParamHolder, built here without a GPU) would have passed for it."""
    import ctypes

    from cuda.core._kernel_arg_handler import ParamHolder

    from fakes import OfflineKernel, numba_array

    kernel = OfflineKernel((types.float32[:, ::1], types.float16, types.boolean, types.int8, types.uint64,
                            types.float64, types.complex64, types.int32))
    values = kernel.marshalled((numba_array((4, 8), np.float32, 1 << 30), 1.5, True, -3, 2 ** 63 + 5, 2.5,
                                1 - 2j, -7))
    params = internals.KernelParams.build(values)
    holder = ParamHolder(values)
    theirs = (ctypes.c_void_p * len(values)).from_address(holder.ptr)
    assert len(params.sizes) == len(values) == 9 + 1 + 1 + 1 + 1 + 1 + 2 + 1
    for i, value in enumerate(values):
        assert params.value_bytes(i) == ctypes.string_at(theirs[i], params.sizes[i]), (i, value)
    assert params.sizes == [8] * 9 + [2, 1, 1, 8, 8, 4, 4, 4]


class _OfflineDispatcher:
    def typeof_pyval(self, value):
        from numba import typeof

        return typeof(value)


def _offline_prepared(monkeypatch, argument_types, args, param_sizes, sources=None):
    from fakes import FakeDriver, OfflineKernel

    kernel = OfflineKernel(argument_types)
    driver = FakeDriver(param_sizes).install(monkeypatch)
    monkeypatch.setattr("numbatma._prepared_launch.compiled_kernel", lambda dispatcher, a: kernel)
    monkeypatch.setattr("numbatma._prepared_launch._ensure_dynamic_smem", lambda k, nbytes: None)
    return internals.prepare_launch(_OfflineDispatcher(), args, 4, 128, 0, sources=sources), driver


def test_prepared_launch_update_patches_arrays_and_scalars(monkeypatch):
    import struct

    from fakes import numba_array

    x = numba_array((64, 32), np.float32, 1 << 20)
    view = numbatma.DeviceView(numbatma.array_layout(FakeCudaArray((64, 8), np.float32, ptr=1 << 24)), x)
    view_array = numba_array((64, 8), np.float32, 1 << 24)  # (what launch_argument makes of the view on a GPU)
    run, driver = _offline_prepared(
        monkeypatch, (types.float32[:, ::1], types.float32[:, ::1], types.float64, types.int64),
        (x, view_array, 2.0, 7), [8] * 18 + [8, 8], sources=(x, view, 2.0, 7))
    run()
    ptr = lambda call, i: struct.unpack("<Q", call["params"][i])[0]  # noqa: E731
    assert ptr(driver.calls[-1], 4) == 1 << 20 and ptr(driver.calls[-1], 13) == 1 << 24
    assert [slot[0] for slot in run.slots] == ["array", "array", "scalar", "scalar"]
    x2 = numba_array((64, 32), np.float32, 5 << 20)
    view2 = numbatma.DeviceView(numbatma.array_layout(FakeCudaArray((64, 8), np.float32, ptr=9 << 24)), x2)
    before = driver.calls[-1]["params"]
    assert run.update((x2, view2, 3.0, 7))  # (new addresses and a new scalar; the int the same object: kept)
    run(5)
    call = driver.calls[-1]
    assert call["stream"] == 5 and ptr(call, 4) == 5 << 20 and ptr(call, 13) == 9 << 24
    values = call["params"]
    assert values[:4] == before[:4] and values[5:13] == before[5:13] and values[14:18] == before[14:18]
    assert values[18] == struct.pack("<d", 3.0) and values[19] == before[19]
    assert run.sources == (x2, view2, 3.0, 7) and run.keep_alive == run.sources
    # what it does not patch: another layout, another scalar type, another argument count; nothing changes then
    kept = values
    assert not run.update((numba_array((64, 16), np.float32, 5 << 20), view2, 3.0, 7))
    assert not run.update((x2, view2, 3, 7)) and not run.update((x2, view2, 3.0))
    assert not run.update((x2, view2, 4.0, "7"))  # (a patchable change before an unpatchable one: none made)
    assert run.sources == (x2, view2, 3.0, 7)
    run(5)
    run(5)
    assert driver.calls[-1]["params"] == driver.calls[-2]["params"] == kept
    # a scalar equal to the one in the block is written all the same: -0.0 == 0.0
    assert run.update((x2, view2, 0.0, 7)) and run.update((x2, view2, -0.0, 7))
    run(5)
    assert driver.calls[-1]["params"][18] == struct.pack("<d", -0.0)


def test_prepared_launch_update_converts_a_replaced_descriptor(monkeypatch):
    import ctypes

    from cuda.bindings import driver as cu

    from numbatma import TensorMap

    def encoded(tm, fill):  # (what driver_tensor_map encodes on a GPU: 128 recognisable bytes)
        tm._raw = cu.CUtensorMap()
        tm._raw.opaque = [cu.cuuint64_t(fill + i) for i in range(16)]
        tm._descriptor = f"core-{fill}"
        return tm

    a = encoded(TensorMap(FakeCudaArray((64, 64), np.float32, ptr=1 << 20), (16, 16)), 100)
    b = encoded(TensorMap(FakeCudaArray((64, 64), np.float32, ptr=1 << 22), (16, 16)), 200)
    other = encoded(TensorMap(FakeCudaArray((64, 64), np.float32, ptr=1 << 22), (16, 32)), 300)
    run, driver = _offline_prepared(monkeypatch, (a.numba_type,), (a,), [128])
    assert run.slots[0][0] == "descriptor" and run.params.pointers[0] == a._raw.getPtr()
    run()
    assert driver.calls[-1]["params"] == (ctypes.string_at(a._raw.getPtr(), 128),)
    assert run.update((b,)) and run.params.pointers[0] == b._raw.getPtr()
    run()
    assert driver.calls[-1]["params"] == (b.to_bytes(),)
    assert not run.update((other,)) and run.params.pointers[0] == b._raw.getPtr()  # (another box: another type)


def test_prepared_launch_sees_a_descriptor_repointed_in_place(monkeypatch):
    """A descriptor re-pointed in place (TensorMap.repoint: cuTensorMapReplaceAddress on its own CUtensorMap) is what
    the next run passes: the parameter block points at the descriptor's CUtensorMap, not at a copy."""
    from cuda.bindings import driver as cu

    from numbatma import TensorMap, _descriptor_base

    tm = TensorMap(FakeCudaArray((64, 64), np.float32, ptr=1 << 20), (16, 16))
    tm._raw = cu.CUtensorMap()
    tm._raw.opaque = [cu.cuuint64_t(1 << 20)] + [cu.cuuint64_t(0)] * 15
    tm._descriptor = "core"

    def replace(tensor_map, address):  # (the driver's: here the address is the first word)
        tensor_map.opaque = [cu.cuuint64_t(address)] + list(tensor_map.opaque)[1:]
        return (cu.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(_descriptor_base, "_replace_address", replace)
    run, driver = _offline_prepared(monkeypatch, (tm.numba_type,), (tm,), [128])
    run()
    tm.repoint(FakeCudaArray((64, 64), np.float32, ptr=3 << 20))
    assert tm._core_stale  # (cuda.core's descriptor gets the address when numba's launch next uses it)
    run()
    first, second = (int.from_bytes(c["params"][0][:8], "little") for c in driver.calls)
    assert (first, second) == (1 << 20, 3 << 20)


def test_prepare_checks_the_layout_against_the_drivers_parameter_sizes(monkeypatch):
    """Where the driver tells the kernel's parameter sizes (cuKernelGetParamInfo), a parameter block that does not fit
    them (another count, another size) fails at prepare time, naming what was laid out; a driver that cannot tell
    leaves it unchecked; an 8-byte Python int may fill a smaller integer parameter."""
    import pytest

    from fakes import numba_array

    x = numba_array((16,), np.float32, 1 << 20)
    sig = (types.float32[::1], types.float32)
    run, driver = _offline_prepared(monkeypatch, sig, (x, 2.0), [8] * 7 + [4])
    assert run is not None and driver.queries == 9  # (the count, then the 8 parameters)
    assert driver.past == []  # (no index past the last: compute-sanitizer reports one as an API error)
    for sizes in ([8] * 7, [8] * 7 + [8], [8] * 7 + [4, 4], [8] * 6 + [16, 4]):
        with pytest.raises(RuntimeError, match="laid out 8 kernel parameters"):
            _offline_prepared(monkeypatch, sig, (x, 2.0), sizes)
    assert _offline_prepared(monkeypatch, sig, (x, 2.0), [8] * 6 + [4, 4])[0] is not None  # (the shape: an int)
    from fakes import FakeDriver

    # A driver without cuKernelGetParamCount: the laid-out count is asked for, never an index past the kernel's last
    # parameter unless the kernel has fewer (a mismatch, refused).
    for sizes, fits in (([8] * 7 + [4], True), ([8] * 7, False), ([8] * 7 + [4, 4], None)):
        driver = FakeDriver(sizes, count=False).install(monkeypatch)
        kernel = _prepared_launch.compiled_kernel(_OfflineDispatcher(), (x, 2.0))
        kernel.__dict__.pop("_numbatma_param_sizes", None)
        if fits is False:
            with pytest.raises(RuntimeError, match="laid out 8 kernel parameters"):
                internals.prepare_launch(_OfflineDispatcher(), (x, 2.0), 4, 128, 0)
        else:  # (True: fits; None: a ninth parameter is not told apart without the count)
            assert internals.prepare_launch(_OfflineDispatcher(), (x, 2.0), 4, 128, 0) is not None
            assert driver.past == []
    FakeDriver([1, 2, 3], report=False).install(monkeypatch)
    kernel = _prepared_launch.compiled_kernel(None, ())
    kernel.__dict__.pop("_numbatma_param_sizes", None)
    assert internals.prepare_launch(_OfflineDispatcher(), (x, 2.0), 4, 128, 0) is not None  # (unchecked)


def test_prepared_launch_streams(monkeypatch):
    """A run's stream: 0, a raw handle, a numba stream (its handle), anything else numba's launch takes
    (_to_core_stream); the last stream's CUstream is kept."""
    from numba.cuda.cudadrv import driver as nd

    from fakes import numba_array

    run, driver = _offline_prepared(monkeypatch, (types.float32[::1],), (numba_array((8,), np.float32, 1 << 20),),
                                    [8] * 7)
    numba_stream = nd.Stream(handle=__import__("cuda.bindings.driver").bindings.driver.CUstream(0xAB))
    core = type("CoreStream", (), {"handle": 0xCD})()
    monkeypatch.setattr(nd, "_to_core_stream", lambda s: s if s is core else (_ for _ in ()).throw(TypeError(s)))
    for stream, handle in ((0, 0), (None, 0), (0x1234, 0x1234), (numba_stream, 0xAB), (core, 0xCD)):
        run(stream)
        assert driver.calls[-1]["stream"] == handle
    memo = run._stream_memo
    run(core)
    assert run._stream_memo is memo
    import pytest

    with pytest.raises(TypeError):
        run(object())


def test_typing_error_hook_points():
    """Hook 9 (numbatma/errors.py): numba-cuda's type inference calls each constraint as
    ``constraint(typeinfer)``; every constraint class with its own ``__call__`` is wrapped (the call constraints
    among them), each instance has the statement's ``loc``; Numba's "No implementation" summary is raised by
    numba.core's function types, whose TypingError numba-cuda's ConstraintNetwork does not catch (so numbatma's
    error, a subclass of it, reaches the user unchanged)."""
    from numba.core import errors as core_errors
    from numba.cuda.core import errors as cuda_errors
    from numba.cuda.core import typeinfer

    classes = internals._constraint_classes()
    assert {"CallConstraint", "IntrinsicCallConstraint", "SetItemConstraint", "StaticGetItemConstraint"} <= set(classes)
    for cls in classes.values():
        assert getattr(vars(cls)["__call__"], "_numbatma_original", None) is not None, cls
    assert "constraint(typeinfer)" in inspect.getsource(typeinfer.ConstraintNetwork.propagate)
    assert "loc=constraint.loc" in inspect.getsource(typeinfer.ConstraintNetwork.propagate)
    assert "self.loc = loc" in inspect.getsource(typeinfer.CallConstraint.__init__)
    assert not issubclass(core_errors.TypingError, cuda_errors.TypingError)
    from numba.core.types import functions

    assert "raise_error" in inspect.getsource(functions.BaseFunction.get_call_type)
    assert "prefer_literal" in inspect.getsource(functions.BaseFunction.get_call_type)


def test_hooks_are_numbered_in_order_with_one_install_function_each():
    """_numba_internals' docstring lists hooks 1..13 in order, each naming its install function (hook 12: the
    function that applies it to one kernel) and the seam module that holds it; that function is defined there, the
    module's ``# -- hook N`` section is there, and every seam module's sections follow the numbering's order."""
    doc = internals.__doc__
    listed = [int(n) for n in re.findall(r"^(\d+)\. ", doc, flags=re.M)]
    assert listed == list(range(1, 14))
    entries = re.findall(r"^(\d+)\. :func:`(\w+)` \((this module|``(_\w+)\.py``)", doc, flags=re.M)
    assert [int(n) for n, *_ in entries] == list(range(1, 14))
    seen = {}
    for n, name, _, module in entries:
        holder = {m.__name__.split(".")[-1]: m for m in SEAM_MODULES}[module or "_numba_internals"]
        assert vars(holder).get(name) is not None and getattr(holder, name).__module__ == holder.__name__, (n, name)
        assert callable(getattr(internals, name, None)), (n, name)  # (installed from here: re-exported)
        seen.setdefault(holder, []).append(int(n))
    for holder in SEAM_MODULES:
        sections = [int(n) for n in re.findall(r"^# -- hook (\d+):", inspect.getsource(holder), flags=re.M)]
        assert sorted(set(sections)) == seen.get(holder, []) and sections == sorted(sections), holder.__name__


def test_every_seam_module_is_listed_and_states_its_purpose():
    """The seam modules are the ones _numba_internals' docstring names, each under the size limit of
    tests/test_import_graph.py, with a one-line purpose as its docstring's first line."""
    for module in SEAM_MODULES:
        first = module.__doc__.split("\n")[0]
        assert first.endswith(".") and len(first) <= 120, module.__name__
        if module is not internals:
            assert f"``{module.__name__.split('.')[-1]}.py``" in internals.__doc__, module.__name__
        assert len(inspect.getsource(module).splitlines()) <= 800, module.__name__


def test_install_functions_are_idempotent():
    """Each hook's install function wraps its upstream object once (a second call leaves it as it is)."""
    from numba.cuda import cudadecl, dispatcher
    from numba.cuda.cudadrv import nvvm

    from numba.cuda.core import inline_closurecall

    before = [nvvm.set_cuda_kernel, nvvm.compile_ir, nvvm.set_launch_bounds, dispatcher._Kernel._prepare_args,
              dispatcher._Kernel.launch, dispatcher.get_current_device, dispatcher.LaunchConfig,
              cudadecl.Cuda_shared_array.generic, dispatcher.launch, inline_closurecall.InlineWorker.inline_ir]
    shim = inline_closurecall.copy
    for install in (internals.install_grid_constant_params, internals.install_descriptor_arguments,
                    internals.install_launch_checks, internals.install_shared_array_type,
                    internals.install_compile_ir, internals.install_offline_target, internals.install_clusters,
                    internals.install_typing_errors, internals.install_dependent_launches,
                    internals.install_inline_copy, internals.install):
        install()
    after = [nvvm.set_cuda_kernel, nvvm.compile_ir, nvvm.set_launch_bounds, dispatcher._Kernel._prepare_args,
             dispatcher._Kernel.launch, dispatcher.get_current_device, dispatcher.LaunchConfig,
             cudadecl.Cuda_shared_array.generic, dispatcher.launch, inline_closurecall.InlineWorker.inline_ir]
    assert after == before and inline_closurecall.copy is shim
    for wrapper in after:
        assert wrapper.__module__ in SEAM
        assert wrapper._numbatma_original.__module__ not in SEAM  # (upstream's, wrapped once)


def test_inline_copy_hook_points():
    """Hook 13: InlineWorker.inline_ir copies the callee's IR through its module's ``copy.deepcopy``, one block at a
    time (copy_ir), twice (a mutable copy and the unmutated one it returns), then asks for the blocks' one scope;
    Var.__deepcopy__ copies its scope with the memo it is given. The hook is in place."""
    from numba.cuda.core import inline_closurecall, ir

    points = internals._inline_copy_hook_points()
    assert set(points) == {"inline_closurecall.copy.deepcopy", "InlineWorker.inline_ir"}
    for label, (owner, attr) in points.items():
        assert callable(getattr(owner, attr, None)), label
    source = inspect.getsource(inline_closurecall.InlineWorker.inline_ir._numbatma_original)
    assert "copy.deepcopy(block)" in source and source.count("copy_ir(callee_ir)") == 2
    assert "assert len(callee_scopes) == 1" in source
    assert "copy.deepcopy(self.scope, memo)" in inspect.getsource(ir.Var.__deepcopy__)
    assert inline_closurecall.copy.deepcopy is _inline_copy._deepcopy
    assert inline_closurecall.InlineWorker.inline_ir.__module__ == _inline_copy.__name__


def test_inline_copy_shares_one_scope_per_function():
    """Inside inline_ir the blocks of one function come out of ``copy.deepcopy(block)`` sharing one copy of their
    scope, the copied statements' variables the scope's own; copying the same block again gives a new copy (the
    unmutated second copy); outside inline_ir, and for anything but a block, deepcopy is the standard one."""
    import copy

    from numba.cuda.core import inline_closurecall, ir

    loc = ir.Loc("f.py", 1)
    scope = ir.Scope(None, loc)
    blocks = []
    for name in ("a", "b"):
        block = ir.Block(scope, loc)
        block.append(ir.Assign(ir.Const(1, loc), scope.define(name, loc), loc))
        blocks.append(block)
    shim = inline_closurecall.copy
    _inline_copy._session.memos = {}
    try:
        first = [shim.deepcopy(b) for b in blocks]
        again = shim.deepcopy(blocks[0])
    finally:
        _inline_copy._session.memos = None
    assert first[0].scope is first[1].scope and first[0].scope is not scope
    assert first[0].body[0].target is first[0].scope.localvars.get("a")
    assert first[1].body[0].target is first[1].scope.localvars.get("b")
    assert again is not first[0] and again.scope is not first[0].scope and again.body[0].target.name == "a"
    outside = [shim.deepcopy(b) for b in blocks]  # (upstream's: each block its own copy of the scope)
    assert outside[0].scope is not outside[1].scope
    assert shim.deepcopy([1, [2]]) == [1, [2]] and shim.copy is copy.copy


def test_inline_copy_leaves_the_compiled_code_as_it_was():
    """A kernel of nested ``inline="always"`` device functions with branches and a loop (several blocks, shared
    variables) compiles to the same PTX with hook 13 on and off (but for the compile counters in symbol names). (Every
    plan kernel of numbatma.kernels gave the same PTX both ways when the hook was written.)"""
    import copy

    from numba.cuda.core import inline_closurecall

    @cuda.jit(device=True, inline="always")
    def inner(x, i):
        if i % 2:
            return x + 1.0
        return x * 2.0

    @cuda.jit(device=True, inline="always")
    def outer(x, i):
        for j in range(3):
            x = inner(x, i + j)
        return x

    def kernel(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] = outer(outer(a[i], i), i + 1)

    def ptx():
        text = nbc.compile_ptx(kernel, (types.float32[:],), arch="sm_90a")
        text = text if isinstance(text, str) else text[0]
        return sorted(re.sub(r"B\d+v\d+", "Bv", line) for line in text.splitlines() if not line.startswith("//"))

    hooked = (inline_closurecall.copy, inline_closurecall.InlineWorker.inline_ir)
    with_hook = ptx()
    try:
        inline_closurecall.copy = copy
        inline_closurecall.InlineWorker.inline_ir = hooked[1]._numbatma_original
        without = ptx()
    finally:
        inline_closurecall.copy, inline_closurecall.InlineWorker.inline_ir = hooked
    assert with_hook == without and any(line.strip().startswith(("add.f", "fma.rn.f")) for line in with_hook)


def test_accessor_points_exist_with_expected_signatures():
    """The accessors through which the other modules reach numba-cuda private names (intrinsic, make_array,
    populate_array, call_sreg, declare_vprintf): the upstream names exist and take the arguments the
    accessors pass."""
    from numba.cuda import extending, nvvmutils
    from numba.cuda.np import arrayobj

    points = internals._accessor_points()
    assert set(points) == {"extending._intrinsic", "arrayobj.make_array", "arrayobj.populate_array",
                           "nvvmutils.call_sreg", "nvvmutils.declare_vprint"}
    for label, (owner, attr) in points.items():
        assert callable(getattr(owner, attr, None)), label

    def params(f):
        return list(inspect.signature(f).parameters)

    # _intrinsic(typer) or _intrinsic(**options)(typer) builds an _Intrinsic(name, typer, prefer_literal, target=...)
    assert params(extending._intrinsic) == ["args", "kwargs"]
    assert "_Intrinsic(name, func, **kwargs)" in inspect.getsource(extending._intrinsic)
    assert params(extending._Intrinsic.__init__) == ["self", "name", "defn", "prefer_literal", "kwargs"]
    assert params(arrayobj.make_array) == ["array_type"]
    assert params(arrayobj.populate_array) == ["array", "data", "shape", "strides", "itemsize", "meminfo", "parent"]
    assert params(internals.populate_array) == params(arrayobj.populate_array)
    assert params(nvvmutils.call_sreg) == ["builder", "name"]
    assert {"tid.x", "tid.y", "tid.z", "ntid.x", "ntid.y", "ntid.z"} <= set(nvvmutils.SREG_MAPPING)
    assert params(nvvmutils.declare_vprint) == ["lmod"]


def test_accessors_build_an_intrinsic_reading_a_special_register():
    """intrinsic + call_sreg + make_array + populate_array, end to end: an intrinsic returning a 1-element view
    of its argument at ``tid.x`` compiles to a read of %tid.x."""
    from llvmlite import ir

    @internals.intrinsic(target="cuda", prefer_literal=False)
    def tid_view(typingctx, arr):
        result = types.Array(arr.dtype, 1, "C")

        def codegen(context, builder, sig, args):
            src = internals.make_array(sig.args[0])(context, builder, args[0])
            tid = builder.zext(internals.call_sreg(builder, "tid.x"), ir.IntType(64))
            out = internals.make_array(result)(context, builder)
            intp = context.get_value_type(types.intp)
            internals.populate_array(out, data=builder.gep(src.data, [tid]), shape=[ir.Constant(intp, 1)],
                                     strides=[ir.Constant(intp, 4)], itemsize=ir.Constant(intp, 4), meminfo=None)
            return out._getvalue()

        return result(arr), codegen

    def k(a):
        v = tid_view(a)
        v[0] = 1.0

    ptx = nbc.compile_ptx(k, (types.float32[::1],))
    assert "%tid.x" in ptx and "st.global" in ptx


def test_simulator_block_accessors():
    """simulated_block / simulated_block_dim / simulated_grid_dim read what numba's simulator gives a thread:
    BlockThread(f, manager, blockIdx, threadIdx, debug) keeps the manager as ``_manager``;
    BlockManager(f, grid_dim, block_dim, debug) keeps the shapes as ``_grid_dim`` / ``_block_dim``."""
    import threading

    from numba.cuda.simulator import kernel

    assert list(inspect.signature(kernel.BlockManager.__init__).parameters) == [
        "self", "f", "grid_dim", "block_dim", "debug"]
    init = inspect.getsource(kernel.BlockManager.__init__)
    assert "self._grid_dim = grid_dim" in init and "self._block_dim = block_dim" in init
    assert "BlockManager(self.fn, grid_dim, block_dim, self._debug)" in inspect.getsource(kernel)
    assert "self._manager = manager" in inspect.getsource(kernel.BlockThread.__init__)
    manager = kernel.BlockManager(lambda: None, (2, 3, 1), (4, 1, 1), False)
    thread = kernel.BlockThread(lambda: None, manager, (0, 0, 0), (1, 0, 0), False)
    assert internals.simulated_block(thread) is manager
    assert internals.simulated_block_dim(manager) == (4, 1, 1)
    assert internals.simulated_grid_dim(manager) == (2, 3, 1)
    assert internals.simulated_block(threading.current_thread()) is None  # (not a simulated thread)


def test_simulator_jit_and_launch_points():
    """Hook 7's decorator and launch parts: the simulator's cuda.jit (numba.cuda.simulator.api.jit) is what
    numba.cuda.jit is under the simulator; numbatma's replacement accepts exactly the GPU cuda.jit's options
    (its own parameters and the keywords _Kernel takes); FakeCUDAKernel.__getitem__ configures the kernel
    itself and __call__ pushes the one kernel context a process has (what the launch lock and the configured
    copy are for)."""
    from numba.cuda import decorators, dispatcher
    from numba.cuda.simulator import api, kernel, kernelapi

    for label, (owner, attr) in internals._simulator_jit_points().items():
        assert getattr(owner, attr, None) is not None, label
    assert api.jit.__module__ == "numba.cuda.simulator.api"  # (no simulator here: not replaced)
    gpu = set(inspect.signature(decorators.jit).parameters) - {"func_or_sig", "kws"}
    gpu |= set(inspect.signature(dispatcher._Kernel.__init__).parameters) - {"self", "py_func", "argtypes"}
    assert 'kws.get("boundscheck")' in inspect.getsource(decorators.jit)
    assert internals.GPU_JIT_OPTIONS == gpu | {"boundscheck"}
    getitem = inspect.getsource(kernel.FakeCUDAKernel.__getitem__)
    assert "self.grid_dim, self.block_dim = normalize_kernel_dimensions(" in getitem and "return self" in getitem
    call = inspect.getsource(kernel.FakeCUDAKernel.__call__)
    assert "with _push_kernel_context(fake_cuda_module):" in call and "if self._device or _kernel_context:" in call
    assert "concurrent simulated kernel not supported" in inspect.getsource(kernel._push_kernel_context)
    assert "fn_globs[k] = fake_cuda_module" in inspect.getsource(kernelapi.swapped_cuda_module)
    assert list(inspect.signature(kernel.FakeCUDAKernel.__init__).parameters) == [
        "self", "fn", "device", "fastmath", "extensions", "debug"]


def test_simulator_constant_rule_points():
    """check_constant_operand builds a kernel's IR with numba-cuda's frontend (bytecode.FunctionIdentity,
    interpreter.Interpreter, postproc.PostProcessor) and reads FunctionIR._definitions; the rule's verdicts
    match what the GPU build decides (tests/test_sim_parity_cpu.py) on these IR node kinds."""
    from numba.cuda.core import bytecode, interpreter, ir, postproc

    R = 4

    def kernel(out, n):
        m = R
        out[0] = (m, n)

    func_id = bytecode.FunctionIdentity.from_function(kernel)
    func_ir = interpreter.Interpreter(func_id).interpret(bytecode.ByteCode(func_id=func_id))
    postproc.PostProcessor(func_ir).run(False)
    assert isinstance(func_ir._definitions["m"][0], ir.FreeVar)
    assert isinstance(func_ir._definitions["n"][0], ir.Arg)
    tuples = [e for b in func_ir.blocks.values() for s in b.body if isinstance(s, ir.Assign)
              for e in [s.value] if isinstance(e, ir.Expr) and e.op == "build_tuple"]
    assert len(tuples) == 1
    m, n = tuples[0].items
    assert internals._is_constant(func_ir, m, False) and not internals._is_constant(func_ir, n, False)
    assert not internals._is_constant(func_ir, tuples[0].items[1], True)
    assert ir.Const and ir.Global


def test_typing_message_points():
    """Hook 9's plain-function refusal wraps TypeInferer.typeof_global(self, inst, target, gvar), which types a
    global or closure variable through resolve_value_type; compile_capability reads the pipeline's flags
    (targetconfig.ConfigStack, flags.compute_capability set by compile_cuda); lowering_loc reads
    Lower.lower_inst(self, inst)'s frame; a Pipeline method's wrong arity is caught where numba binds the
    overload typer's signature (inspect.signature(self._overload_func).bind)."""
    from numba.cuda import compiler, lowering
    from numba.cuda.core import targetconfig, typeinfer
    from numba.cuda.typing import templates

    assert typeinfer.TypeInferer.typeof_global.__module__ == internals.__name__
    upstream = typeinfer.TypeInferer.typeof_global._numbatma_original
    assert list(inspect.signature(upstream).parameters) == ["self", "inst", "target", "gvar"]
    assert "self.resolve_value_type(inst, gvar.value)" in inspect.getsource(upstream)
    assert "self.typeof_global(inst, inst.target, value)" in inspect.getsource(typeinfer.TypeInferer.typeof_assign)
    assert callable(targetconfig.ConfigStack.top_or_none)
    assert "flags.compute_capability = cc" in inspect.getsource(compiler.compile_cuda)
    assert internals.compile_capability() is None  # (outside a compilation)
    assert list(inspect.signature(lowering.Lower.lower_inst).parameters) == ["self", "inst"]
    build = inspect.getsource(templates._OverloadFunctionTemplate._build_impl)
    assert "ov_sig = inspect.signature(self._overload_func)" in build and "ov_sig.bind(*args, **kws)" in build
    assert "except TypeError as e:" in build  # (numbatma's error is no TypeError: it passes through)
