"""CPU: prepared launches through the driver (numbatma/_numba_internals.py ``prepare_launch``, ``KernelParams``,
``PreparedLaunch``) and the re-pointing of cached plans that patches them (kernels/_rebind.py, kernels/_plan.py).

No GPU: the compiled kernel is a stand-in whose arguments numba-cuda's own ``_prepare_args`` marshals, the driver's
launch is recorded with every parameter's bytes as the driver would copy them (tests/fakes.py: ``OfflineKernel``,
``FakeDriver``, ``offline_gpu``). The parameter block must hold what cuda.core's launch (its ``ParamHolder``, which
numba-cuda's own launches use) would have passed for the same marshalled values; a block patched in place must
equal one prepared from scratch; a function form re-pointed at new arrays must launch exactly what a plan built
fresh on them launches."""
import ctypes
import sys

import numpy as np
import pytest

import fakes
import numbatma
from numbatma import DeviceView, TensorMap, array_layout
from numbatma import _numba_internals as internals
from numbatma.kernels import _plan_cache, clear_plan_cache

MB = 1 << 20


@pytest.fixture
def gpu(monkeypatch):
    """The real prepared launch with only the GPU replaced (tests/fakes.py ``offline_gpu``); an empty plan cache."""
    driver = fakes.offline_gpu(monkeypatch.setattr)
    clear_plan_cache()
    yield driver
    clear_plan_cache()


def _kernel():
    pass


def Dispatcher():
    """A ``cuda.jit`` dispatcher (never compiled here: ``offline_gpu`` stands in for its compiled kernel; its typing
    of the arguments is numba-cuda's)."""
    from numba import cuda

    return cuda.jit(_kernel)


def _cuda_core_bytes(values, sizes):
    """The bytes cuda.core's launch passes for ``values`` (marshalled by numba): its ParamHolder, read back."""
    from cuda.core._kernel_arg_handler import ParamHolder

    holder = ParamHolder(values)
    pointers = (ctypes.c_void_p * len(values)).from_address(holder.ptr)
    return [ctypes.string_at(pointers[i], size) for i, size in enumerate(sizes)]


def _descriptor(ptr, box=(16, 16), shape=(64, 64)):
    return TensorMap(fakes.FakeCudaArray(shape, np.float32, ptr=ptr), box)


def _view(ptr, owner=None):
    return DeviceView(array_layout(fakes.FakeCudaArray((64, 8), np.float32, ptr=ptr, strides=(256, 4))), owner)


def _arguments(base):
    """One argument of every kind a prepared launch lays out (sources as a plan holds them, and as a launch passes
    them: a view as its numba array)."""
    tm = _descriptor(base)
    x = fakes.numba_array((64, 32), np.float32, base + MB)
    view = _view(base + 2 * MB, x)
    scalars = (np.float16(1.5), True, np.int8(-3), np.uint8(250), np.int16(-300), np.uint16(60000), np.int32(-7),
               np.uint32(4000000000), -(2 ** 40), np.uint64(2 ** 63 + 5), np.float32(2.5), 0.1, np.complex64(1 - 2j))
    sources = (tm, x, view) + scalars
    args = (tm, x, view.device_array()) + scalars
    return sources, args


def _prepare(sources, args):
    return internals.prepare_launch(Dispatcher(), args, (3, 2), 64, 1024, sources=sources)


def test_the_parameter_block_holds_what_cuda_core_would_pass(gpu):
    sources, args = _arguments(1 << 30)
    run = _prepare(sources, args)
    kernel = run.kernel
    assert [str(t) for t in kernel.argument_types[3:]] == ["float16", "bool", "int8", "uint8", "int16", "uint16",
                                                           "int32", "uint32", "int64", "uint64", "float32", "float64",
                                                           "complex64"]
    values = kernel.marshalled(args)  # (numba-cuda's marshalling: what its launch would hand cuda.core)
    assert len(values) == len(run.params.sizes) == 1 + 2 * (5 + 2 * 2) + 12 + 2
    assert values[0] == "core"  # (hook 2: cuda.core's descriptor, passed by value)
    ours = [run.params.value_bytes(i) for i in range(len(values))]
    assert ours[0] == sources[0].to_bytes()  # (the descriptor's own CUtensorMap: its 128 bytes)
    assert run.params.pointers[0] == sources[0].driver_tensor_map().getPtr()
    assert ours[1:] == _cuda_core_bytes(values[1:], run.params.sizes[1:])
    assert run.params.sizes == [128] + [8] * 18 + [2, 1, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 4, 4]
    # the array's and the view's data pointers, where update patches them
    assert [s[0] for s in run.slots[:3]] == ["descriptor", "array", "array"]
    assert ours[1 + internals._ARRAY_PTR] == (1 << 30 | MB).to_bytes(8, "little")
    assert ours[10 + internals._ARRAY_PTR] == ((1 << 30) + 2 * MB).to_bytes(8, "little")
    run((5,)[0])
    (call,) = gpu.calls
    assert call["params"] == tuple(ours) and call["grid"] == (3, 2, 1) and call["block"] == (64, 1, 1)
    assert (call["shared_mem"], call["stream"], call["dependent"]) == (1024, 5, False)


def test_an_updated_block_equals_a_fresh_preparation(gpu):
    sources, args = _arguments(1 << 30)
    run = _prepare(sources, args)
    moved, moved_args = _arguments(1 << 32)
    moved = list(moved)
    moved[2] = sources[2]._at(moved[2].layout.ptr - sources[2].layout.ptr, moved[1])  # (as a re-point makes it)
    moved[4] = False  # (a scalar of the same type, another value)
    moved[13] = np.float32(-1.0)
    moved = tuple(moved)
    assert run.update(moved)
    fresh = _prepare(moved, tuple(moved[:2]) + (moved[2].device_array(),) + moved[3:])
    n = len(run.params.sizes)
    assert [run.params.value_bytes(i) for i in range(n)] == [fresh.params.value_bytes(i) for i in range(n)]
    assert run.sources == moved and run.params.held[0] is moved[0].driver_tensor_map()
    # what cannot be patched leaves the block as it was
    before = [run.params.value_bytes(i) for i in range(n)]
    assert not run.update(moved[:2] + (_view(9 << 30, None)._at(0, None),) + moved[3:] + ("x",))
    assert not run.update(moved[:3] + (np.float32(1.0),) + moved[4:])  # (float16 slot: another type)
    assert not run.update((_descriptor(1 << 34, box=(16, 32)),) + moved[1:])  # (another descriptor type)
    other_layout = fakes.numba_array((32, 64), np.float32, 1 << 35)
    assert not run.update(moved[:1] + (other_layout,) + moved[2:])
    assert [run.params.value_bytes(i) for i in range(n)] == before and run.sources == moved


def test_what_the_block_cannot_lay_out_is_not_prepared():
    assert internals.param_field(1 + 2j) is None and internals.param_field(object()) is None
    assert internals.param_field(np.array([1.0])) is None and internals.param_field(ctypes.c_char(b"a")) is None
    assert internals.KernelParams.build([1, 1j]) is None
    assert internals.param_field(True) == (ctypes.c_bool, True)
    assert internals.param_field(-1) == (ctypes.c_uint64, 2 ** 64 - 1)
    empty = internals.KernelParams.build([])
    assert empty.address == 0 and empty.sizes == []


def test_a_failed_launch_raises_numbas_driver_error(gpu, monkeypatch):
    from cuda.bindings import driver
    from numba.cuda.cudadrv.driver import CudaAPIError

    sources, args = _arguments(1 << 30)
    run = _prepare(sources, args)
    monkeypatch.setattr(run, "_launch", lambda *a: (driver.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,))
    with pytest.raises(CudaAPIError, match="OUT_OF_RESOURCES"):  # (what Softmax's fallback looks for)
        run()


def test_descriptor_and_view_re_pointed_read_as_fresh_ones():
    tm = _descriptor(1 << 30)
    base = tm._layout
    target = fakes.FakeCudaArray((64, 64), np.float32, ptr=(1 << 30) + 4096)
    assert tm._moved(target, (1 << 30) + 4096) is tm
    assert tm._layout == array_layout(target) and tm.array is target and tm._layout_base is base
    with pytest.raises(numbatma.TensorMapError, match="aligned"):
        tm._moved(target, (1 << 30) + 8)
    tm.repoint(fakes.FakeCudaArray((64, 64), np.float32, ptr=5 << 30))
    assert tm._layout == array_layout(fakes.FakeCudaArray((64, 64), np.float32, ptr=5 << 30))
    view = _view(1 << 30, "owner")
    moved = view._at(MB, "new owner")._at(MB, "newer owner")
    fresh = _view((1 << 30) + 2 * MB, "newer owner")
    assert moved.layout == fresh.layout and moved.owner == "newer owner" and moved._base is view._base
    assert moved.__cuda_array_interface__ == fresh.__cuda_array_interface__
    assert view.layout == array_layout(fakes.FakeCudaArray((64, 8), np.float32, ptr=1 << 30, strides=(256, 4)))


# -- the function forms: re-pointed at new tensors, they launch what a fresh plan launches -------------------------
@pytest.fixture
def torch_like(monkeypatch):
    from numbatma import _intake

    monkeypatch.setitem(sys.modules, "torch", fakes.fake_torch())
    monkeypatch.setattr(_intake, "_READERS", {})


def _tensors(base):
    def t(shape, dtype="float32", off=0, strides=None):
        return fakes.FakeTorchTensor(shape, dtype, ptr=base + off, strides=strides)

    return dict(x=t((64, 64)), y=t((64, 64), off=MB), a=t((64, 64), off=2 * MB), rows=t((64,), off=3 * MB),
                bf=t((128, 128), "bfloat16", off=4 * MB), cf=t((128, 128), "bfloat16", off=5 * MB),
                q=t((1, 2, 128, 64), "bfloat16", off=6 * MB), k=t((1, 2, 128, 64), "bfloat16", off=7 * MB),
                v=t((1, 2, 128, 64), "bfloat16", off=8 * MB), o=t((1, 2, 128, 64), "bfloat16", off=9 * MB),
                wide=t((64, 1003), off=10 * MB, strides=(1008, 1)), wide_out=t((64, 1003), off=11 * MB,
                                                                              strides=(1008, 1)))


FORMS = {
    "stream_copy": lambda K, d: K.stream_copy(d["x"], d["y"]),
    "stream_copy_tail": lambda K, d: K.stream_copy(d["wide"], d["wide_out"]),
    "axpy": lambda K, d: K.axpy(2.0, d["x"], d["a"], d["y"]),
    "transpose": lambda K, d: K.transpose(d["x"], d["y"]),
    "row_sum": lambda K, d: K.row_sum(d["x"], d["rows"]),
    "softmax": lambda K, d: K.softmax(d["wide"], d["wide_out"]),
    "softmax_in_place": lambda K, d: K.softmax(d["x"], d["x"]),
    "laplacian5": lambda K, d: K.laplacian5(d["x"], d["y"]),
    "gemm": lambda K, d: K.gemm(d["bf"], d["bf"], d["cf"]),
    "attention": lambda K, d: K.attention(d["q"], d["k"], d["v"], d["o"]),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_re_pointed_function_form_launches_what_a_fresh_plan_launches(gpu, torch_like, monkeypatch, form):
    from numba import cuda

    from numbatma import kernels as K

    lse = {}  # (attention's own lse: one numba array per shape, at one address: the allocator's recycling)
    monkeypatch.setattr(cuda, "device_array", lambda shape, dtype: lse.setdefault(
        (tuple(shape), np.dtype(dtype)), fakes.numba_array(shape, dtype, 1 << 40)))
    call = FORMS[form]
    sets = [_tensors(1 << 30), _tensors(1 << 34), _tensors((1 << 31) + 4096)]
    launched = []
    for i in (0, 1, 2, 0, 0):  # (new tensors, new again, the first again, the same again)
        call(K, sets[i])
        launched.append(gpu.calls[-1])
    info = _plan_cache.plan_cache_info()
    assert (info["hits"], info["misses"], info["rebind_failed"]) == (4, 1, 0), info
    assert gpu.builds == 1  # (the cached plan's launch prepared once, then patched)
    for i, seen in zip((0, 1, 2), launched):
        clear_plan_cache()
        call(K, sets[i])  # (a plan built fresh on these tensors)
        fresh = gpu.calls[-1]
        assert seen["params"] == fresh["params"], (form, i)
        assert {k: seen[k] for k in ("grid", "block", "shared_mem", "stream", "function")} == {
            k: fresh[k] for k in ("grid", "block", "shared_mem", "stream", "function")}
    assert launched[3]["params"] == launched[4]["params"] == launched[0]["params"]
    assert gpu.builds == 4


def test_the_compiled_replay_equals_the_tree_replay(gpu, torch_like, monkeypatch):
    """The map's program, compiled into one function, moves a plan exactly as the map's tree does."""
    from numba import cuda

    from numbatma import kernels as K
    from numbatma.kernels import _rebind

    made = []
    monkeypatch.setattr(cuda, "device_array", lambda shape, dtype: made.append(
        fakes.numba_array(shape, dtype, (1 << 40) + len(made) * MB)) or made[-1])
    one, two = _tensors(1 << 30), _tensors(1 << 34)
    for cls, names in ((K.StreamCopy, ("wide", "wide_out")), (K.Gemm, ("bf", "bf", "cf")),
                       (K.Attention, ("q", "k", "v", "o")), (K.Softmax, ("x", "x"))):
        plans = [cls(*(one[n] for n in names)) for _ in range(2)]
        owned = tuple(cuda.device_array(o[0].shape, o[0].dtype) for o in plans[0]._owned)  # (new outputs: shared)
        new = tuple(two[n] for n in names) + owned
        new_facts = tuple(numbatma.layout_facts(a) for a in new)
        for plan, compiled in zip(plans, (True, False)):
            old = tuple(one[n] for n in names) + tuple(o[0] for o in plan._owned)
            old_facts = tuple(numbatma.layout_facts(a) for a in old)
            rmap = _rebind.rebind_map(plan, old, old_facts, skip=K._plan._BOOKKEEPING)
            assert rmap.program is not None, cls
            if not compiled:
                rmap.program = None  # (the tree)
            assert rmap.replay(plan, old, new, old_facts, new_facts)
            assert ("def replay" in rmap._replay.source) if compiled else rmap._replay is None
        for a, b in zip(plans[0].args, plans[1].args):
            if isinstance(a, TensorMap):
                assert a._layout == b._layout, cls
                assert a.array is b.array or a.array.layout == b.array.layout and a.array.owner is b.array.owner
            elif isinstance(a, DeviceView):
                assert a.layout == b.layout and a.owner is b.owner, cls
            else:
                assert a is b or a == b, cls
        assert plans[0].output == plans[1].output
