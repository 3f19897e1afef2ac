"""CPU: the function forms of numbatma.kernels cache their plans (kernels/_plan_cache.py ``run``, kernels/_rebind.py
behind ``Plan.rebind``).

Plans are built offline from FakeCudaArrays; launching needs a GPU, so every plan class's ``launch`` is replaced
by a recorder here. A rebound plan must equal a plan built fresh on the new arrays (every TensorMap, view and
array reference of its arguments), and each of its TensorMaps must have moved by exactly its array's delta."""
import re
import sys
import types

import numpy as np
import pytest

import fakes
import numbatma
from numbatma import DeviceView, TensorMap, array_layout
from numbatma.kernels import (Attention, Axpy, Gemm, Laplacian5, Plan, RowSum, Softmax, StreamCopy, TmaCopy, Transpose,
                              _launch, _plan, _plan_cache, attention, axpy, clear_plan_cache, gemm, plan_cache_info,
                              plan_cache_size, softmax, stream_copy)

from fakes import FakeCudaArray

G = 1 << 34
PLAN_CLASSES = (Attention, Axpy, Gemm, Laplacian5, RowSum, Softmax, StreamCopy, TmaCopy, Transpose)
OWN_LAUNCH = {cls: vars(cls).get("launch") for cls in PLAN_CLASSES}  # (RowSum, Softmax: their own)


def fa(shape, dtype=np.float32, ptr=1 << 20, strides=None):
    return FakeCudaArray(shape, dtype, ptr=ptr, strides=strides)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """A fixed SM count, an empty cache of the default size, and launches recorded instead of run."""
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 132)
    launched = []

    def launch(self, stream=None):
        launched.append(self)
        return self.output

    for cls in PLAN_CLASSES:
        monkeypatch.setattr(cls, "launch", launch)
    clear_plan_cache()
    plan_cache_size(_plan_cache.DEFAULT_PLAN_CACHE_SIZE)
    yield launched
    clear_plan_cache()
    plan_cache_size(_plan_cache.DEFAULT_PLAN_CACHE_SIZE)


# -- the cache -------------------------------------------------------------------------------------------------
def test_a_hit_reuses_the_plan_and_repoints_it(offline):
    out1, out2 = fa((512, 512), ptr=G), fa((512, 512), ptr=G + (1 << 24))
    assert stream_copy(fa((512, 512)), out1) is out1
    assert stream_copy(fa((512, 512), ptr=1 << 30), out2) is out2  # same layout and alignment class
    assert offline[0] is offline[1]
    plan = offline[1]
    assert plan.output is out2 and plan.dst is out2
    assert plan.src_map._layout.ptr == 1 << 30 and plan.dst_map._layout.ptr == G + (1 << 24)
    info = plan_cache_info()
    assert (info["hits"], info["misses"], info["size"], info["maxsize"]) == (1, 1, 1, 32)


def test_the_same_arrays_again_reuse_the_plan_untouched(offline):
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    softmax(x, y)
    plan = offline[0]
    plan._prepared_launch = prepared = ("kernel", "prepared")
    softmax(x, y)
    assert offline[1] is plan and plan._prepared_launch is prepared  # nothing moved: the launch stays prepared


@pytest.mark.parametrize("change", ["shape", "strides", "dtype", "alignment", "option", "scalar", "overlap"])
def test_a_changed_layout_or_option_builds_a_new_plan(offline, change):
    def call(shape=(256, 512), strides=None, dtype=np.float32, ptr=1 << 20, a=2.0, **options):
        x = fa(shape, dtype, ptr=ptr, strides=strides)
        out = x if change == "overlap" and options.pop("inplace", False) else fa(shape, dtype, ptr=G, strides=strides)
        return axpy(a, x, fa(shape, dtype, ptr=1 << 30, strides=strides), out, **options)

    call()
    call(ptr=(1 << 20) + 4096)  # a hit: only the address moved, by a multiple of 1024
    assert offline[1] is offline[0]
    changed = {"shape": dict(shape=(256, 256)), "strides": dict(strides=(4096, 4)),
               "dtype": dict(dtype=np.float64), "alignment": dict(ptr=(1 << 20) + 16),
               "option": dict(stages=2), "scalar": dict(a=3.0), "overlap": dict(inplace=True)}[change]
    call(**changed)
    assert offline[2] is not offline[0]
    assert plan_cache_info()["size"] == 2


def test_options_are_keyed_by_type_and_unhashable_ones_are_not_cached(offline):
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    stream_copy(x, y, stages=2)
    with pytest.raises(numbatma.TensorMapError, match="stages"):  # (equal to 2, but refused: not a cache hit)
        stream_copy(x, y, stages=2.0)
    key = _plan_cache.cache_key(StreamCopy, (x, y), {"stages": [2]})
    assert key is not None  # lists are keyed by their items
    assert _plan_cache.cache_key(StreamCopy, (x, y), {"stages": {2: 3}}) is None
    assert _plan_cache.cache_key(StreamCopy, (x, object()), {}) is None  # not an array numbatma reads


def test_the_cache_is_a_bounded_lru(offline):
    plan_cache_size(2)
    shapes = [(256, 256), (256, 512), (512, 256)]
    y = {s: fa(s, ptr=G) for s in shapes}
    stream_copy(fa(shapes[0]), y[shapes[0]])
    stream_copy(fa(shapes[1]), y[shapes[1]])
    stream_copy(fa(shapes[0]), y[shapes[0]])  # shapes[0] used last: shapes[1] is the least recent
    stream_copy(fa(shapes[2]), y[shapes[2]])  # evicts shapes[1]
    assert plan_cache_info()["size"] == 2
    stream_copy(fa(shapes[0]), y[shapes[0]])
    assert offline[4] is offline[0]
    stream_copy(fa(shapes[1]), y[shapes[1]])
    assert offline[5] is not offline[1]
    assert plan_cache_size() == 2 and plan_cache_size(1) == 1 and plan_cache_info()["size"] == 1


def test_clear_plan_cache_and_size_zero(offline):
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    stream_copy(x, y)
    clear_plan_cache()
    assert plan_cache_info()["size"] == 0
    stream_copy(x, y)
    assert offline[1] is not offline[0]
    plan_cache_size(0)  # caching off
    stream_copy(x, y)
    stream_copy(x, y)
    assert offline[3] is not offline[2] and plan_cache_info()["size"] == 0
    with pytest.raises(ValueError):
        plan_cache_size(-1)


def test_plans_that_opt_out_are_built_every_call(offline, monkeypatch):
    class Fixed(Plan):
        rebindable = False
        kernel = None

        def __init__(self, x):
            self.x = x

        output = property(lambda self: self.x)

    x = fa((16, 16))
    assert _plan.run(Fixed, x) is x
    _plan.run(Fixed, x)
    assert plan_cache_info()["uncached"] == 2 and plan_cache_info()["size"] == 0


def test_attention_without_lse_is_cached_and_each_call_gets_its_own_lse(offline, monkeypatch):
    """attention(q, k, v, o) allocates lse (Plan.owned_output): the plan is cached all the same, and a hit makes a
    new lse (Plan.fresh_outputs), also when the arrays move."""
    from numba import cuda

    made = []

    def device_array(shape, dtype):
        made.append(fa(shape, dtype, ptr=(1 << 38) + len(made) * (1 << 24)))
        return made[-1]

    monkeypatch.setattr(cuda, "device_array", device_array)
    h = np.float16
    qkvo = [tuple(fa((1, 2, 128, 64), h, ptr=(i + 1) * (1 << 30) + s) for i in range(4)) for s in (0, D1)]
    outs = [attention(*qkvo[0]), attention(*qkvo[0]), attention(*qkvo[1])]
    plan = offline[0]
    assert offline == [plan] * 3 and plan.cacheable
    assert plan_cache_info()["hits"] == 2 and plan_cache_info()["size"] == 1
    assert [lse for _, lse in outs] == made and len({id(a) for a in made}) == 3
    assert outs[2][0] is qkvo[1][3] and plan.lse is made[2] and plan.output == (qkvo[1][3], made[2])
    assert plan.args[4] is made[2] and plan.q_map._layout.ptr == (1 << 30) + D1
    # a plan built directly: fresh_outputs() is the same hook
    direct = Attention(*qkvo[0])
    first = direct.lse
    assert direct.fresh_outputs() is direct and direct.lse is made[-1] and direct.lse is not first
    given = Attention(*qkvo[0], fa((1, 2, 128), np.float32, ptr=1 << 36))
    assert given._owned == () and given.fresh_outputs().lse is given._user_arrays[4]


# -- rebind: the same as a plan built on the new arrays -----------------------------------------------------------
D1, D2, D3, D4, D5 = 1 << 24, 3 << 22, 5 << 23, 7 << 21, 1 << 25  # multiples of 1024: one alignment class


def _make(name, shift=(0, 0, 0, 0, 0)):
    """The plan ``name`` and its arguments, every array moved by its ``shift``."""
    s = shift
    h = np.float16
    cases = {
        "StreamCopy": lambda: (StreamCopy, (fa((512, 512), ptr=(1 << 20) + s[0]), fa((512, 512), ptr=G + s[1])), {}),
        "StreamCopy3d": lambda: (StreamCopy, (fa((4, 64, 96), ptr=(1 << 20) + s[0]),
                                              fa((4, 64, 96), ptr=G + s[1])), {}),
        "Axpy": lambda: (Axpy, (2.0, fa((512, 512), ptr=(1 << 20) + s[0]), fa((512, 512), ptr=(1 << 30) + s[1]),
                                fa((512, 512), ptr=G + s[2])), {}),
        "TmaCopy": lambda: (TmaCopy, (fa((100, 1001), ptr=(1 << 20) + s[0], strides=(4016, 4)),
                                      fa((100, 1001), ptr=G + s[1], strides=(4016, 4))), {}),
        "Transpose": lambda: (Transpose, (fa((512, 256), ptr=(1 << 20) + s[0]), fa((256, 512), ptr=G + s[1])), {}),
        "RowSum": lambda: (RowSum, (fa((8, 100, 1000), ptr=(1 << 20) + s[0]), fa((8, 100), ptr=G + s[1])), {}),
        "Softmax": lambda: (Softmax, (fa((1000, 1000), ptr=(1 << 20) + s[0]), fa((1000, 1000), ptr=G + s[1])), {}),
        "SoftmaxTail": lambda: (Softmax, (fa((64, 1001), ptr=(1 << 20) + s[0], strides=(4016, 4)),
                                          fa((64, 1001), ptr=G + s[1], strides=(4016, 4))), {"mode": "chunked"}),
        "Laplacian5": lambda: (Laplacian5, (fa((512, 512), ptr=(1 << 20) + s[0]), fa((512, 512), ptr=G + s[1])), {}),
        "Gemm": lambda: (Gemm, (fa((256, 128), h, ptr=(1 << 20) + s[0]), fa((128, 128), h, ptr=(1 << 30) + s[1]),
                                fa((256, 128), h, ptr=G + s[2])), {}),
        "GemmBeta": lambda: (Gemm, (fa((256, 128), h, ptr=(1 << 20) + s[0]), fa((128, 128), h, ptr=(1 << 30) + s[1]),
                                    fa((256, 128), np.float32, ptr=G + s[2])), {"beta": 0.5}),
        "Attention": lambda: (Attention, tuple(fa((1, 2, 128, 64), h, ptr=(i + 1) * (1 << 30) + s[i])
                                               for i in range(4)) + (fa((1, 2, 128), np.float32,
                                                                        ptr=(1 << 36) + s[4]),), {}),
        "AttentionBshd": lambda: (Attention, tuple(fa((1, 128, 2, 64), h, ptr=(i + 1) * (1 << 30) + s[i])
                                                   for i in range(4)) + (fa((1, 2, 128), np.float32,
                                                                            ptr=(1 << 36) + s[4]),),
                                  {"layout": "bshd", "causal": True}),
    }
    return cases[name]()


def _tensormaps(obj, found=None, seen=None):
    """Every TensorMap reachable from a plan (attributes, helper objects, containers), once each."""
    found = {} if found is None else found
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return found
    seen.add(id(obj))
    if isinstance(obj, TensorMap):
        found[id(obj)] = obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensormaps(x, found, seen)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensormaps(x, found, seen)
    elif type(obj).__module__.startswith("numbatma.kernels") and hasattr(obj, "__dict__"):
        for name, x in vars(obj).items():
            if name not in ("_user_arrays", "_prepared_launch"):
                _tensormaps(x, found, seen)
    return found


def _same_arg(a, b):
    if isinstance(a, TensorMap):
        return isinstance(b, TensorMap) and a._layout == b._layout and a.box == b.box and a.swizzle == b.swizzle
    if isinstance(a, DeviceView):
        return isinstance(b, DeviceView) and a.layout == b.layout
    if isinstance(a, FakeCudaArray):
        return a is b
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", ["StreamCopy", "StreamCopy3d", "Axpy", "TmaCopy", "Transpose", "RowSum", "Softmax",
                                  "SoftmaxTail", "Laplacian5", "Gemm", "GemmBeta", "Attention", "AttentionBshd"])
def test_rebind_equals_a_fresh_plan(name):
    shift = (D1, D2, D3, D4, D5)
    cls, old_args, options = _make(name)
    _, new_args, _ = _make(name, shift)
    plan = cls(*old_args, **options)
    plan.__dict__["_stale"] = False  # (as after a launch)
    maps = _tensormaps(plan)
    assert maps
    before = {k: tm._layout.ptr for k, tm in maps.items()}
    assert plan.rebind(*new_args) is plan

    # every TensorMap moved by exactly the delta of the array it lies in
    deltas = {}
    for o, n in zip(old_args, new_args):
        if not isinstance(o, float):
            lo = array_layout(o)
            deltas[(lo.ptr, lo.ptr + max(1, lo.strides[0] * lo.shape[0]))] = array_layout(n).ptr - lo.ptr
    for k, tm in maps.items():
        (delta,) = [d for (lo, hi), d in deltas.items() if lo <= before[k] < hi]
        assert tm._layout.ptr - before[k] == delta

    fresh = cls(*new_args, **options)
    assert len(plan.args) == len(fresh.args)
    for i, (a, b) in enumerate(zip(plan.args, fresh.args)):
        assert _same_arg(a, b), (name, i, a, b)
    out = plan.output if isinstance(plan.output, tuple) else (plan.output,)
    fresh_out = fresh.output if isinstance(fresh.output, tuple) else (fresh.output,)
    assert all(a is b for a, b in zip(out, fresh_out))  # the output is the new array
    assert plan._user_arrays == new_args
    assert plan._stale  # (the next launch compares its arguments and patches the moved ones in)
    assert not any(o in vars(plan).values() for o in old_args if isinstance(o, FakeCudaArray))


def test_gemm_without_beta_repoints_its_shared_store_map_once():
    cls, old_args, options = _make("Gemm")
    plan = cls(*old_args, **options)
    assert plan.c_load is plan.c_map is plan.out.map
    plan.rebind(*_make("Gemm", (D1, D2, D3, 0, 0))[1])
    assert plan.c_map._layout.ptr == G + D3  # (moved once, not twice)


def test_rebind_refuses_what_it_cannot_do():
    cls, old_args, options = _make("Softmax")
    with pytest.raises(_plan.NotRebindable):
        cls(*old_args).rebind(fa((1000, 1000)), fa((1000, 500), ptr=G))  # a different layout
    with pytest.raises(_plan.NotRebindable):
        cls(*old_args).rebind(old_args[0])  # a different number of arguments
    # an address inside two arguments that moved differently
    x = fa((1000, 1000))
    plan = Softmax(x, x)
    with pytest.raises(_plan.NotRebindable):
        plan.rebind(fa((1000, 1000), ptr=1 << 30), fa((1000, 1000), ptr=G))


def test_a_failed_rebind_builds_a_new_plan(offline, monkeypatch):
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    stream_copy(x, y)

    def refuse(self, *arrays, **kw):
        raise _plan.NotRebindable("test")

    monkeypatch.setattr(Plan, "_repoint", refuse)  # (what rebind and the cache's re-pointing do)
    y2 = fa((256, 256), ptr=G + D1)
    assert stream_copy(fa((256, 256), ptr=1 << 30), y2) is y2
    assert offline[1] is not offline[0] and offline[1].dst is y2 and plan_cache_info()["size"] == 1


def test_gemm_function_form_is_cached(offline):
    h = np.float16
    c1, c2 = fa((256, 128), h, ptr=G), fa((256, 128), h, ptr=G + D1)
    assert gemm(fa((256, 128), h), fa((128, 128), h, ptr=1 << 30), c1) is c1
    assert gemm(fa((256, 128), h, ptr=(1 << 20) + D2), fa((128, 128), h, ptr=(1 << 30) + D3), c2) is c2
    assert offline[0] is offline[1] and offline[1].c is c2
    assert numbatma.kernels.plan_cache_info()["hits"] == 1


# -- the fast paths: array intake, the same arrays again, re-pointing by map, the prepared launch ------------------
@pytest.fixture
def torch_like(monkeypatch):
    """A stand-in torch module (tests/fakes.py) loaded, the intake's per-class readers forgotten."""
    from numbatma import _intake

    module = fakes.fake_torch()
    monkeypatch.setitem(sys.modules, "torch", module)
    monkeypatch.setattr(_intake, "_READERS", {})
    return module


def tt(shape, dtype="float32", ptr=1 << 20, strides=None, **kw):
    return fakes.FakeTorchTensor(shape, dtype, ptr=ptr, strides=strides, **kw)


@pytest.mark.parametrize("shape, dtype, strides", [
    ((64, 64), "float32", None), ((64, 64), "float32", (128, 1)), ((64, 64), "float32", (1, 64)),
    ((1, 1, 128, 64), "bfloat16", None), ((1, 4, 1, 64), "float16", (9999, 64, 7, 1)), ((3, 16), "bool", None),
    ((8,), "int64", None), ((2, 3, 4), "float64", (48, 4, 1))])
def test_torch_tensors_are_read_through_their_methods_as_their_interface_says(torch_like, monkeypatch, shape, dtype,
                                                                             strides):
    from numbatma import _intake

    t = tt(shape, dtype, ptr=(1 << 30) + 512, strides=strides)
    expected = _intake._general_facts(t)  # (through torch's __cuda_array_interface__)
    monkeypatch.setattr(fakes.FakeTorchTensor, "__cuda_array_interface__", property(lambda self: 1 / 0))
    assert numbatma.layout_facts(t) == expected and numbatma.layout_facts(t) == expected  # (the second: remembered)
    assert array_layout(t) == numbatma.ArrayLayout(*expected)


@pytest.mark.parametrize("case", ["requires_grad", "cpu", "empty", "complex", "subclass"])
def test_torch_tensors_off_the_fast_path_read_as_before(torch_like, case):
    from numbatma import _intake

    class Sub(fakes.FakeTorchTensor):
        pass

    t = {"requires_grad": lambda: tt((4, 4), requires_grad=True), "cpu": lambda: tt((4, 4), device=None),
         "empty": lambda: tt((0, 4)), "complex": lambda: tt((4, 4), "complex64"),
         "subclass": lambda: Sub((4, 4), "float32")}[case]()
    try:
        expected = _intake._general_facts(t)
    except Exception as exc:  # noqa: BLE001
        with pytest.raises(type(exc), match=re.escape(str(exc)[:40])):
            numbatma.layout_facts(t)
    else:
        assert numbatma.layout_facts(t) == expected


def test_numba_device_arrays_are_read_through_their_attributes():
    import ctypes

    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    from numbatma import _intake

    memory = types.SimpleNamespace(device_ctypes_pointer=ctypes.c_void_p(1 << 30))  # (no driver needed)
    for shape, strides in [((64, 32), (128, 4)), ((1, 64, 3), (5, 12, 4)), ((64, 3), (4, 256))]:
        a = DeviceNDArray(shape, strides, np.float32, gpu_data=memory)
        assert numbatma.layout_facts(a) == _intake._general_facts(a) == (1 << 30, shape, _intake.
                                                                                  _unit_dims_strides(shape, strides, 4),
                                                                                  np.dtype(np.float32))
    assert _intake._reader_for(DeviceNDArray) is _intake._numba_record


class _Prepared:
    """What prepare_launch returns, recorded: launches, and ``update`` (the patching a GPU prepared launch does)."""

    def __init__(self, log, args):
        self.log, self.args = log, tuple(args)

    def __call__(self, stream=0):
        self.log["launches"].append((self, self.args, stream))

    def update(self, args):
        self.log["updates"].append(tuple(args))
        self.args = tuple(args)
        return True


@pytest.fixture
def launches(monkeypatch):
    """The plans' real launch with prepare_launch recorded (and the map walks counted)."""
    log = {"prepared": [], "updates": [], "launches": [], "maps": 0}

    def prepare(kernel, args, grid, block, shared_mem=0, **kw):
        log["prepared"].append(_Prepared(log, args))
        return log["prepared"][-1]

    walk = _plan.rebind_map

    def counted(*a, **kw):
        log["maps"] += 1
        return walk(*a, **kw)

    monkeypatch.setattr(_plan, "prepare_launch", prepare)
    monkeypatch.setattr(_plan, "rebind_map", counted)
    for cls in PLAN_CLASSES:  # (the offline fixture's recorder out: the plans' own launch)
        if OWN_LAUNCH[cls] is None:
            monkeypatch.delattr(cls, "launch")
        else:
            monkeypatch.setattr(cls, "launch", OWN_LAUNCH[cls])
    return log


def _plans():
    return _plan_cache.cached_plans()


def test_same_arrays_then_new_arrays_then_the_first_again(torch_like, launches):
    x1, y1 = tt((256, 256), ptr=1 << 30), tt((256, 256), ptr=1 << 31)
    x2, y2 = tt((256, 256), ptr=(1 << 32) + D1), tt((256, 256), ptr=(1 << 33) + D2)
    assert stream_copy(x1, y1) is y1
    (plan,) = _plans()
    prepared = plan._prepared_launch
    assert stream_copy(x1, y1) is y1  # the same objects: nothing re-pointed, nothing compared
    assert plan._prepared_launch is prepared and launches["updates"] == [] and launches["maps"] == 0
    assert stream_copy(x2, y2) is y2
    assert launches["maps"] == 1 and len(launches["updates"]) == 1 and len(launches["prepared"]) == 1
    assert (plan.src_map._layout.ptr, plan.dst_map._layout.ptr, plan.dst) == ((1 << 32) + D1, (1 << 33) + D2, y2)
    assert stream_copy(x1, y1) is y1
    assert launches["maps"] == 1 and len(launches["updates"]) == 2  # (the map replayed, not walked again)
    fresh = StreamCopy(x1, y1)
    assert all(_same_arg(a, b) for a, b in zip(plan.args, fresh.args))
    assert [args for _, args, _ in launches["launches"]] == [prepared[3]] * 2 + list(launches["updates"])
    assert _plans() == [plan] and (plan_cache_info()["hits"], plan_cache_info()["misses"]) == (3, 1)


def test_same_pointer_other_layout_never_reuses_a_plan(torch_like, launches):
    x, y = tt((64, 64), ptr=1 << 30), tt((64, 64), ptr=1 << 31)
    stream_copy(x, y)
    (first,) = _plans()
    x_wide, y_wide = tt((32, 128), ptr=1 << 30), tt((32, 128), ptr=1 << 31)  # (the same memory, another shape)
    stream_copy(x_wide, y_wide)
    assert len(_plans()) == 2 and plan_cache_info()["misses"] == 2
    wide = next(p for p in _plans() if p is not first)
    assert wide.src_map.shape == (32, 128)
    # the same objects, changed in place (torch's set_ / resize_): another layout -> the other plan, re-pointed
    x.set_(shape=(32, 128)), y.set_(shape=(32, 128))
    assert stream_copy(x, y) is y and wide.dst is y and wide.src_map.array is x
    # the same objects moved in place, same layout and alignment: the plan is re-pointed (not taken as it is)
    x.set_(ptr=(1 << 30) + D1)
    stream_copy(x, y)
    assert wide.src_map._layout.ptr == (1 << 30) + D1 and plan_cache_info()["hits"] == 2
    # moved to another alignment class: another plan
    x.set_(ptr=(1 << 30) + 16)
    stream_copy(x, y)
    assert len(_plans()) == 3


def test_a_launch_looks_at_args_only_after_an_assignment(launches):
    seen = []

    class Scaled(Plan):
        kernel = object()
        grid, block = 1, 32
        settable = {"a": None, "kernel": None}  # (what a built Scaled lets its user assign)

        def __init__(self, x):
            self.x, self.a = x, 2.0

        @property
        def args(self):
            seen.append(self.a)
            return (self.x, self.a)

        output = property(lambda self: self.x)

    plan = Scaled(fa((16, 16)))
    for _ in range(3):
        plan.launch()
    assert seen == [2.0] and len(launches["prepared"]) == 1 and launches["updates"] == []
    plan.a = 3.0
    plan.launch(), plan.launch()
    assert seen == [2.0, 3.0] and launches["updates"] == [(plan.x, 3.0)] and len(launches["prepared"]) == 1
    plan.kernel = object()  # (another kernel: prepared again)
    plan.launch()
    assert len(launches["prepared"]) == 2 and len(launches["launches"]) == 6


def test_a_plan_changed_behind_its_map_is_refused_and_rebuilt(launches):
    x1, y1 = fa((256, 256)), fa((256, 256), ptr=G)
    stream_copy(x1, y1)
    stream_copy(fa((256, 256), ptr=(1 << 20) + D1), fa((256, 256), ptr=G + D2))  # (maps the plan)
    (plan,) = _plans()
    assert plan._rebind_map is not None
    plan.out.tail = numbatma.DeviceView(array_layout(fa((1, 1), ptr=1 << 40)), x1)  # (a helper changed in place)
    assert stream_copy(x1, y1) is y1
    assert plan_cache_info()["rebind_failed"] == 1 and _plans()[0] is not plan and _plans()[0].dst is y1
    plan._some_setting = 1  # (assigning a plan attribute forgets the map: walked again next time)
    assert plan._rebind_map is None and plan._stale


def test_overlapping_arguments_are_re_pointed_together(launches):
    x = fa((256, 256))
    softmax(x, x)
    y = fa((256, 256), ptr=(1 << 20) + D3)
    softmax(y, y)
    (plan,) = _plans()
    assert plan_cache_info()["hits"] == 1
    assert all(_same_arg(a, b) for a, b in zip(plan.args, Softmax(y, y).args))
    with pytest.raises(_plan.NotRebindable, match="moved by different amounts"):
        plan.rebind(fa((256, 256), ptr=1 << 30), fa((256, 256), ptr=1 << 32))


def test_owned_outputs_are_made_again_and_what_views_them_follows():
    made = []

    class Own(Plan):
        kernel = None

        def __init__(self, x):
            self.x = x
            self.buf = self.owned_output(lambda: made.append(fa((64, 64), ptr=(1 << 36) + len(made) * D1)) or made[-1])
            self.buf_map = TensorMap(self.buf, (16, 16))
            self.view = numbatma.kernel_view(array_layout(self.buf).columns(0, 8), self.buf)

        output = property(lambda self: self.buf)

    plan = Own(fa((64, 64)))
    assert plan.fresh_outputs() is plan and plan.buf is made[1] and plan.output is made[1]
    assert plan.buf_map.array is made[1] and plan.view.layout.ptr == (1 << 36) + D1
    _plan.run(Own, plan.x)
    _plan.run(Own, plan.x)
    assert len(made) == 4 and plan_cache_info()["hits"] == 1


def test_the_device_in_the_key_comes_from_the_arrays(monkeypatch):
    """The key's device is the arrays' (numbatma.array_device), not the current context's: tests/test_devices_cpu.py
    has the rest (several devices, peer access, the plans' devices)."""
    from numbatma import devices

    monkeypatch.setattr(devices, "_COUNT", [2])  # (a process that sees two devices; with one the key has none)
    monkeypatch.setattr(devices, "pointer_device", lambda ptr: 3 if ptr < G else 5)
    monkeypatch.setattr(devices, "current_device", lambda: 0)
    assert _plan_cache.cache_key(StreamCopy, (fa((64, 64)), fa((64, 64), ptr=2 << 20)), {})[-1] == 3
    assert _plan_cache.cache_key(StreamCopy, (fa((64, 64), ptr=G), fa((64, 64), ptr=G + (1 << 20))), {})[-1] == 5


# -- the last call's key, reused for the very same arguments ----------------------------------------------------
def _counting_keys(monkeypatch):
    built = []
    full = _plan_cache._key_and_facts

    def counted(*args):
        built.append(args[0].__name__)
        return full(*args)

    monkeypatch.setattr(_plan_cache, "_key_and_facts", counted)
    return built


def test_the_same_arguments_reuse_the_last_key(offline, monkeypatch):
    built = _counting_keys(monkeypatch)
    x, y, out = fakes.FakeTorchTensor((64, 64)), fakes.FakeTorchTensor((64, 64), ptr=G), \
        fakes.FakeTorchTensor((64, 64), ptr=2 * G)
    for _ in range(3):
        axpy(2.0, x, y, out)
    assert built == ["Axpy"] and len(offline) == 3 and offline[0] is offline[2]
    assert plan_cache_info()["hits"] == 2 and plan_cache_info()["misses"] == 1
    axpy(2.0, x, out, y)  # (other arguments: the full key)
    axpy(3.0, x, y, out)  # (another scalar value: the full key)
    axpy(np.float32(3.0), x, y, out)  # (another scalar type)
    axpy(3.0, x, y, out, stages=2)  # (an option)
    axpy(3.0, x, y, out, stages=2)  # (the same again: reused)
    assert built == ["Axpy"] * 5
    clear_plan_cache()
    axpy(3.0, x, y, out, stages=2)
    assert built == ["Axpy"] * 6  # (cleared with the cache)


def test_a_tensor_changed_in_place_is_read_again(offline, monkeypatch):
    """The same tensor object with another address, shape or strides (torch's set_, resize_, as_strided_): the full
    key, so a plan of the old layout is never launched on it."""
    built = _counting_keys(monkeypatch)
    x, y = fakes.FakeTorchTensor((64, 64)), fakes.FakeTorchTensor((64, 64), ptr=G)
    stream_copy(x, y)
    stream_copy(x, y)
    x._ptr = 1 << 30  # (moved)
    stream_copy(x, y)
    assert offline[2].src_map._layout.ptr == 1 << 30
    y.shape, y._strides = (32, 128), (128, 1)  # (reshaped in place: another layout)
    x.shape, x._strides = (32, 128), (128, 1)
    stream_copy(x, y)
    assert built == ["StreamCopy"] * 3 and offline[3].dst_map.shape == (32, 128)
    assert plan_cache_info()["misses"] == 2  # (the first layout, then the reshaped one)


def test_options_of_another_type_are_not_the_same_call(offline, monkeypatch):
    built = _counting_keys(monkeypatch)
    x, y = fakes.FakeTorchTensor((64, 64)), fakes.FakeTorchTensor((64, 64), ptr=G)
    stream_copy(x, y, stages=2)
    with pytest.raises(numbatma.TensorMapError):
        stream_copy(x, y, stages=2.0)  # (== 2, but a float: the full key, and the plan refuses it)
    assert built == ["StreamCopy", "StreamCopy"]


def test_a_repeated_scalar_must_be_the_same_object_unless_an_int(offline, monkeypatch):
    """-0.0 == 0.0 (and hashes alike), so a float of another object takes the keyed path, whose key tells the sign
    of a zero (a plan keeps the scalar it was built with); equal ints are the same value."""
    built = _counting_keys(monkeypatch)
    x, y, out = fa((64, 64)), fa((64, 64), ptr=G), fa((64, 64), ptr=2 * G)
    axpy(0.0, x, y, out)
    axpy(-0.0, x, y, out)
    axpy(np.float32(-0.0), x, y, out)
    assert built == ["Axpy"] * 3 and len({id(p) for p in offline}) == 3
    assert [bool(np.signbit(p.a)) for p in offline] == [False, True, True]
    axpy(-0.0, x, y, out)  # (the keyed path, found in the cache)
    assert offline[3] is offline[1] and plan_cache_info()["misses"] == 3
    big = 10 ** 30
    axpy(big, x, y, out)
    axpy(int(str(big)), x, y, out)  # (another int object of the same value: the repeated call)
    assert built == ["Axpy"] * 5 and offline[5] is offline[4]


def test_the_lru_order_spans_every_plan_class(offline):
    """Each plan class's last plan is kept apart (the repeated-call path); the bound and the use order cover all."""
    plan_cache_size(2)
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    x2, y2 = fa((256, 512)), fa((256, 512), ptr=G)
    stream_copy(x, y)  # A
    softmax(x, y)  # B
    stream_copy(x2, y2)  # C: A is the least recently used, so it goes (not B, though B is its class's last)
    assert _plans() == [offline[1], offline[2]]
    softmax(x, y)
    assert offline[3] is offline[1]
    stream_copy(x, y)  # (A again: built anew; C is now the least recent)
    assert offline[4] is not offline[0] and _plans() == [offline[1], offline[4]]
    assert plan_cache_info()["size"] == 2 and plan_cache_info()["hits"] == 1 and plan_cache_info()["misses"] == 4


@pytest.mark.parametrize("during", ["clear", "size zero"])
def test_a_cache_cleared_during_a_launch_stays_clear(offline, monkeypatch, during):
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    stream_copy(x, y)
    calls = []

    def launch(self, stream=None):
        calls.append(self)
        clear_plan_cache() if during == "clear" else plan_cache_size(0)
        return self.output

    monkeypatch.setattr(StreamCopy, "launch", launch)
    assert stream_copy(x, y) is y and calls == [offline[0]]  # (the repeated call: the plan was taken, then dropped)
    assert plan_cache_info()["size"] == 0 and _plans() == []


def test_a_repeated_call_counts_its_hits(offline):
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    for _ in range(4):
        softmax(x, y)
    assert (plan_cache_info()["hits"], plan_cache_info()["misses"]) == (3, 1)
    stream_copy(x, y)  # (another class: softmax's entry stays its class's last call)
    softmax(fa((256, 256), ptr=1 << 30), y)  # (other arrays: softmax's plan re-pointed)
    assert (plan_cache_info()["hits"], plan_cache_info()["misses"]) == (4, 2) and len(_plans()) == 2


@pytest.mark.parametrize("new", [3.0, -0.0, np.float32(0.0), 0], ids=["value", "sign", "type", "int"])
def test_rebind_refuses_another_scalar(new):
    x, y, out = fa((64, 64)), fa((64, 64), ptr=G), fa((64, 64), ptr=2 * G)
    plan = Axpy(0.0, x, y, out)
    with pytest.raises(_plan.NotRebindable, match="scalar argument 0.0 became"):
        plan.rebind(new, x, y, out)
    assert plan.rebind(float("0.0"), x, y, out) is plan  # (the same value and type: another object is fine)


def test_one_rule_for_the_same_scalar():
    """numbatma.launch.same_scalar: what Plan.rebind accepts, what a prepared launch without ``update`` keeps (and
    what PreparedLaunch.update does not write again: tests/test_numba_internals.py)."""
    from numbatma.launch import same_scalar

    nan = float("nan")
    assert same_scalar(2.0, float("2.0")) and same_scalar(7, int("7")) and same_scalar(nan, nan)
    assert not same_scalar(0.0, -0.0) and not same_scalar(np.float32(0), np.float32(-0.0))
    assert not same_scalar(2.0, np.float64(2.0)) and not same_scalar(2, 2.0) and not same_scalar(nan, float("nan"))
    assert _plan._same_arguments((float("1.5"), 3), (1.5, 3)) and not _plan._same_arguments((-0.0,), (0.0,))


# -- the plan-cache contract: the cache uses a plan through its public methods only --------------------------------
def _private_plan_uses(source):
    """Where ``source`` touches a plan's private state: ``<...plan>._name`` (a name or attribute called ``plan``, or
    a variable bound from ``<...>.plan``), ``getattr(plan, "_name")`` / ``setattr``, and any ``.__dict__``."""
    import ast

    tree = ast.parse(source)
    plan_names = {"plan"}
    for node in ast.walk(tree):  # (plan = entry.plan, p = plan_class(...): every name bound from a plan-ish value)
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Attribute, ast.Call)):
            value = node.value.func if isinstance(node.value, ast.Call) else node.value
            if isinstance(value, ast.Attribute) and value.attr == "plan" or \
                    isinstance(value, ast.Name) and value.id in ("plan_class", "cls"):
                plan_names.update(t.id for t in node.targets if isinstance(t, ast.Name))

    def is_plan(expr):
        return isinstance(expr, ast.Name) and expr.id in plan_names or \
            isinstance(expr, ast.Attribute) and expr.attr == "plan"

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == "__dict__" or node.attr.startswith("_") and is_plan(node.value):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "setattr", "hasattr", "delattr", "vars") and node.args:
            name = node.args[1] if len(node.args) > 1 else None
            if node.func.id == "vars" and is_plan(node.args[0]) or is_plan(node.args[0]) and \
                    isinstance(name, ast.Constant) and str(name.value).startswith("_"):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_plan_cache_uses_no_private_attribute_of_a_plan():
    """kernels/_plan_cache.py reaches a plan only through the contract Plan documents (reuse, owned_outputs,
    cacheable, launch): no ``plan._x``, no ``__dict__``, no getattr of an underscore name."""
    import inspect

    assert _private_plan_uses(inspect.getsource(_plan_cache)) == []


@pytest.mark.parametrize("planted", [
    "def f(entry):\n    plan = entry.plan\n    return plan._owned\n",
    "def f(entry):\n    entry.plan._repoint(1, 2)\n",
    "def f(plan, facts):\n    plan.__dict__['_user_facts'] = facts\n",
    "def f(plan_class):\n    p = plan_class()\n    return p._written\n",
    "def f(plan):\n    return getattr(plan, '_facts')()\n",
    "def f(plan):\n    return vars(plan)\n",
])
def test_the_contract_scan_finds_planted_private_uses(planted):
    assert len(_private_plan_uses(planted)) == 1, planted
    assert _private_plan_uses("def f(plan):\n    return plan.reuse((1,), facts=None).owned_outputs\n") == []


def test_reuse_same_arrays_does_nothing_new_arrays_repoint():
    """Plan.reuse: the same arrays -> the plan as it is (nothing re-pointed, no re-walk); other arrays of the layout
    -> the plan moves to them (its descriptors by the arrays' delta); facts=None -> rebind's checks too."""
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    plan = StreamCopy(x, y)
    before = [t._layout.ptr for t in _tensormaps(plan).values()]
    assert plan.reuse((x, y)) is plan and plan.dst is y
    assert [t._layout.ptr for t in _tensormaps(plan).values()] == before
    x2, y2 = fa((256, 256), ptr=(1 << 30)), fa((256, 256), ptr=G + D1)
    assert plan.reuse((x2, y2), facts=(numbatma.layout_facts(x2), numbatma.layout_facts(y2)), overlap=()) is plan
    assert plan.dst is y2
    moved = sorted(t._layout.ptr for t in _tensormaps(plan).values())
    assert moved == sorted(a + ((1 << 30) - (1 << 20) if a < G else D1) for a in before)
    with pytest.raises(_plan.NotRebindable, match="not the layout the plan was built for"):
        plan.reuse((fa((256, 128)), y2))


def test_reuse_refuses_what_the_argument_rules_refuse_and_changes_nothing():
    """An overlap of the written array with the read one (the key admits it: the pairs) is a TensorMapError from
    reuse, raised before anything moves: the plan still points at its last arrays and works for others."""
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    plan = StreamCopy(x, y)
    a = fa((256, 256), ptr=1 << 30)
    b = fa((256, 256), ptr=(1 << 30) + 4 * 256 * 128)  # (half of a)
    with pytest.raises(numbatma.TensorMapError, match="dst overlaps src"):
        plan.reuse((a, b), facts=(numbatma.layout_facts(a), numbatma.layout_facts(b)), overlap=((0, 1),))
    assert plan.dst is y and sorted(t._layout.ptr for t in _tensormaps(plan).values()) == [1 << 20, G]
    y2 = fa((256, 256), ptr=G + D1)
    assert plan.reuse((a, y2)).dst is y2


def test_reuse_wraps_a_failed_repoint_in_not_rebindable(monkeypatch):
    """Whatever makes a re-point fail (here a driver-like RuntimeError) comes out of reuse as NotRebindable with the
    original as its cause: the one exception a cache drops the plan for."""
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    plan = StreamCopy(x, y)

    def broken(self, *a, **k):
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(TensorMap, "_moved", broken)  # (what a re-point calls on each descriptor)
    with pytest.raises(_plan.NotRebindable) as info:
        plan.reuse((fa((256, 256), ptr=1 << 30), fa((256, 256), ptr=G + D1)))
    assert isinstance(info.value.__cause__, RuntimeError) and "re-pointing the plan failed" in str(info.value)


def test_a_new_plan_records_its_arrays_layout_facts():
    """A plan records its arguments' layout facts as it checks them (one read): a later reuse moves it from where
    the arrays were then, even when one of them has since moved in place (a torch tensor's set_)."""
    x, y = fa((256, 256)), fa((256, 256), ptr=G)
    plan = StreamCopy(x, y)
    before = sorted(t._layout.ptr for t in _tensormaps(plan).values())
    x.__cuda_array_interface__["data"] = (1 << 31, False)  # (moved in place after the plan was built)
    assert numbatma.layout_facts(x)[0] == 1 << 31
    plan.reuse((x, y))
    after = sorted(t._layout.ptr for t in _tensormaps(plan).values())
    assert after == sorted(a + ((1 << 31) - (1 << 20) if a < G else 0) for a in before)
