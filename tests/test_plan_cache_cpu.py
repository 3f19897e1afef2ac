"""CPU: the function forms of numbatma.kernels cache their plans (kernels/_plan_cache.py ``run``, kernels/_rebind.py
behind ``Plan.rebind``).

Plans are built offline from FakeCudaArrays; launching needs a GPU, so every plan class's ``launch`` is replaced
by a recorder here. A rebound plan must equal a plan built fresh on the new arrays (every TensorMap, view and
array reference of its arguments), and each of its TensorMaps must have moved by exactly its array's delta."""
import numpy as np
import pytest

import numbatma
from numbatma import DeviceView, TensorMap, array_layout
from numbatma.kernels import (Attention, Axpy, Gemm, Laplacian5, Plan, RowSum, Softmax, StreamCopy, TmaCopy, Transpose,
                              _launch, _plan, _plan_cache, axpy, clear_plan_cache, gemm, plan_cache_info, plan_cache_size, softmax,
                              stream_copy)

from fakes import FakeCudaArray

G = 1 << 34
PLAN_CLASSES = (Attention, Axpy, Gemm, Laplacian5, RowSum, Softmax, StreamCopy, TmaCopy, Transpose)


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


def test_attention_with_its_own_lse_is_not_cached():
    q = fa((1, 2, 128, 64), np.float16)
    plan = Attention(q, fa((1, 2, 128, 64), np.float16, ptr=1 << 30), fa((1, 2, 128, 64), np.float16, ptr=1 << 32),
                     fa((1, 2, 128, 64), np.float16, ptr=G), fa((1, 2, 128), np.float32, ptr=1 << 36))
    assert plan.cacheable
    plan._owns_lse = True  # (what a plan that allocated lse says; allocating needs the driver)
    assert not plan.cacheable


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
    plan._prepared_launch = ("stale", None)
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
    assert plan._prepared_launch is None
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

    def refuse(self, *arrays):
        raise _plan.NotRebindable("test")

    monkeypatch.setattr(Plan, "rebind", refuse)
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
