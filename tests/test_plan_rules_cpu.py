"""The plan rules of numbatma.kernels, offline (no GPU): overlap of written arguments, read-only outputs, attributes
that may change after building, option types and ranges, scalar arguments, empty arrays of any strides."""
import numpy as np
import re

import pytest

import numbatma.devices
from numbatma import TensorMapError
from numbatma.kernels import (Axpy, Gemm, Laplacian5, RowSum, Softmax, StreamCopy, Transpose, _launch, _plan,
                              _plan_cache, axpy, clear_plan_cache, gemm, laplacian5, plan_cache_info, row_sum, softmax,
                              stream_copy, transpose)
from numbatma.kernels._options import OptionTypeError, bool_option, choice_option, int_option, scalar_option

from fakes import FakeCudaArray

MB = 1 << 20


def fa(shape, dtype=np.float32, ptr=MB, strides=None, readonly=False):
    a = FakeCudaArray(shape, dtype, strides=strides, ptr=ptr)
    if readonly:
        a.__cuda_array_interface__["data"] = (ptr, True)
    return a


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """SM count fixed, launches recorded instead of made."""
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 132)
    log = []

    class Prepared:
        def __init__(self, args):
            self.args = args

        def __call__(self, stream=0):
            log.append(self.args)

        def update(self, args):
            self.args = tuple(args)
            return True

    monkeypatch.setattr(_plan, "prepare_launch", lambda kernel, args, *g, **k: Prepared(tuple(args)))
    clear_plan_cache()
    yield log
    clear_plan_cache()


# -- overlap ---------------------------------------------------------------------------------------------------------
def test_transpose_in_place_is_refused_naming_both_arguments():
    a = fa((64, 64))
    with pytest.raises(TensorMapError, match=r"Transpose: dst overlaps exactly .* src .*Transpose: none"):
        transpose(a, a)


def test_gemm_c_is_a_is_refused():
    a = fa((128, 128), np.float16)
    with pytest.raises(TensorMapError, match="Gemm: c overlaps"):
        Gemm(a, fa((128, 128), np.float16, ptr=1 << 30), fa((128, 128), np.float16, ptr=MB))


def test_gemm_inputs_may_overlap_each_other():
    a = fa((128, 128), np.float16)
    plan = Gemm(a, a, fa((128, 128), np.float32, ptr=1 << 30))
    assert plan.c is not a


@pytest.mark.parametrize("shift", [16, 256, 4096])
def test_stream_copy_partial_overlap_is_refused(shift):
    with pytest.raises(TensorMapError, match="StreamCopy: dst overlaps src"):
        stream_copy(fa((64, 64)), fa((64, 64), ptr=MB + shift))


def test_column_blocks_of_one_matrix_do_not_overlap():
    """Two column blocks of one (64, 128) float32 matrix: their byte spans interleave, their elements do not; a copy
    from one to the other is accepted, a block shifted by one column into the other is refused."""
    left = fa((64, 64), strides=(512, 4))
    right = fa((64, 64), strides=(512, 4), ptr=MB + 256)
    assert stream_copy(left, right) is right
    assert softmax(left, right) is right
    with pytest.raises(TensorMapError, match="StreamCopy: dst overlaps src"):
        stream_copy(left, fa((64, 64), strides=(512, 4), ptr=MB + 240))


def test_elements_overlap_is_exact_for_strided_views_and_safe_when_too_hard():
    f32 = np.dtype(np.float32)
    rows = lambda ptr, shape=(64, 64), strides=(512, 4): (ptr, shape, strides, f32)  # noqa: E731
    assert not _launch.elements_overlap(rows(MB), rows(MB + 256))
    assert _launch.elements_overlap(rows(MB), rows(MB + 252))
    assert _launch.elements_overlap(rows(MB), rows(MB + 2))  # (a byte of an element, not element-aligned)
    assert not _launch.elements_overlap(rows(MB), rows(MB + 64 * 512))  # (spans apart)
    hard = (MB, (1000, 1000, 1000), (4000003, 4001, 4), f32)
    assert _launch.elements_overlap(hard, (MB + 4001 * 7 + 4, (1000, 1000, 1000), (4000003, 4001, 4), f32),
                                    max_work=1)  # (too hard within max_work: counted as overlapping)


def test_stream_copy_exact_alias_is_allowed():
    a = fa((64, 64))
    assert stream_copy(a, a) is a


@pytest.mark.parametrize("which", ["x", "y"])
def test_axpy_out_may_be_x_or_y(which):
    x, y = fa((64, 64)), fa((64, 64), ptr=1 << 30)
    out = {"x": x, "y": y}[which]
    assert axpy(2.0, x, y, out) is out


def test_axpy_partial_overlap_of_out_and_y_is_refused():
    x, y = fa((64, 64)), fa((64, 64), ptr=1 << 30)
    with pytest.raises(TensorMapError, match="Axpy: out overlaps y"):
        axpy(2.0, x, y, fa((64, 64), ptr=(1 << 30) + 256))


def test_axpy_out_aliasing_with_another_layout_is_refused():
    x, y = fa((64, 64)), fa((64, 64), ptr=1 << 30)
    with pytest.raises(TensorMapError, match="Axpy: out overlaps y"):
        Axpy(2.0, x, y, fa((64, 64), ptr=1 << 30, strides=(512, 4)))


def test_softmax_in_place_allowed_partial_refused():
    x = fa((32, 64))
    assert softmax(x, x) is x
    with pytest.raises(TensorMapError, match="Softmax: out overlaps x"):
        softmax(x, fa((32, 64), ptr=MB + 256))


def test_row_sum_out_inside_x_is_refused():
    with pytest.raises(TensorMapError, match="RowSum: out overlaps x"):
        RowSum(fa((32, 64)), fa((32,), ptr=MB + 64))


def test_laplacian_keeps_its_reason():
    a = fa((8, 32))
    with pytest.raises(TensorMapError, match="overlap.*neighbours of every element"):
        laplacian5(a, a)


def test_two_inputs_overlapping_are_fine():
    x = fa((64, 64))
    out = fa((64, 64), ptr=1 << 30)
    assert axpy(1.0, x, x, out) is out


def test_rebind_to_overlapping_arrays_is_refused():
    plan = StreamCopy(fa((64, 64)), fa((64, 64), ptr=1 << 30))
    with pytest.raises(TensorMapError, match="StreamCopy: dst overlaps src"):
        plan.rebind(fa((64, 64), ptr=1 << 32), fa((64, 64), ptr=(1 << 32) + 1024))


def test_cached_plan_is_not_reused_for_overlapping_arguments():
    stream_copy(fa((64, 64)), fa((64, 64), ptr=1 << 30))
    with pytest.raises(TensorMapError, match="dst overlaps src"):
        stream_copy(fa((64, 64), ptr=1 << 32), fa((64, 64), ptr=(1 << 32) + 1024))


def test_cached_exact_alias_plan_refuses_a_partial_overlap_of_the_same_key():
    x = fa((64, 64), ptr=1 << 32)
    softmax(x, x)  # (key: out overlaps x)
    x2 = fa((64, 64), ptr=1 << 33)
    with pytest.raises(TensorMapError, match="Softmax: out overlaps x"):
        softmax(x2, fa((64, 64), ptr=(1 << 33) + 1024))  # (the same key: re-point refused)
    assert softmax(x2, x2) is x2 and plan_cache_info()["hits"] >= 1


def test_read_only_output_is_refused_read_only_input_is_fine():
    with pytest.raises(TensorMapError, match="StreamCopy: dst is read-only"):
        StreamCopy(fa((64, 64)), fa((64, 64), ptr=1 << 30, readonly=True))
    out = fa((64, 64), ptr=1 << 30)
    assert StreamCopy(fa((64, 64), readonly=True), out).output is out


def test_read_only_output_through_rebind_is_refused():
    plan = StreamCopy(fa((64, 64)), fa((64, 64), ptr=1 << 30))
    with pytest.raises(TensorMapError, match="dst is read-only"):
        plan.rebind(fa((64, 64)), fa((64, 64), ptr=1 << 31, readonly=True))


# -- attributes after building ---------------------------------------------------------------------------------------
def gemm_plan(beta=0.0):
    return Gemm(fa((128, 128), np.float16), fa((128, 128), np.float16, ptr=1 << 30),
                fa((128, 128), np.float32, ptr=1 << 31), beta=beta)


@pytest.mark.parametrize("built, new", [(0.0, 1.0), (1.0, 0.0), (0.0, -0.0 + 1e-30)])
def test_gemm_beta_cannot_change_its_zeroness(built, new):
    plan = gemm_plan(built)
    with pytest.raises(ValueError, match="Gemm: beta cannot change"):
        plan.beta = new
    assert plan.beta == built


def test_gemm_alpha_and_nonzero_beta_take_effect(offline):
    plan = gemm_plan(1.0)
    plan.launch()
    plan.alpha, plan.beta = 3.0, 0.5
    plan.launch()
    assert offline[-1][-2:] == (np.float32(3.0), np.float32(0.5))


@pytest.mark.parametrize("name", ["bn", "kernel", "shape", "c", "some_typo"])
def test_gemm_other_attributes_are_refused(name):
    plan = gemm_plan()
    with pytest.raises(AttributeError, match=f"Gemm: {name} cannot be assigned.*build a new plan"):
        setattr(plan, name, 1)


def test_axpy_a_assignment_is_read_by_the_next_launch(offline):
    plan = Axpy(2.0, fa((64, 64)), fa((64, 64), ptr=1 << 30), fa((64, 64), ptr=1 << 31))
    plan.launch()
    plan.a = 0.25
    plan.launch()
    assert offline[0][0] == np.float32(2.0) and offline[-1][0] == np.float32(0.25)
    assert type(plan.a) is np.float32
    with pytest.raises(OptionTypeError, match="Axpy: a must be a real number"):
        plan.a = "x"


@pytest.mark.parametrize("cls, args, name", [
    (StreamCopy, lambda: (fa((64, 64)), fa((64, 64), ptr=1 << 30)), "stages"),
    (Transpose, lambda: (fa((64, 64)), fa((64, 64), ptr=1 << 30)), "tile"),
    (Softmax, lambda: (fa((64, 64)), fa((64, 64), ptr=1 << 30)), "out"),
    (Laplacian5, lambda: (fa((64, 64)), fa((64, 64), ptr=1 << 30)), "tile"),
])
def test_plans_refuse_attributes_they_cannot_honour(cls, args, name):
    plan = cls(*args())
    with pytest.raises(AttributeError, match=f"{cls.__name__}: {name} cannot be assigned"):
        setattr(plan, name, 1)


# -- options ---------------------------------------------------------------------------------------------------------
def gemm_arrays():
    return fa((256, 256), np.float16), fa((256, 256), np.float16, ptr=1 << 30), fa((256, 256), np.float32, ptr=1 << 31)


@pytest.mark.parametrize("options, words", [
    (dict(group_m=-1), "group_m must be an integer in 1..65536, got -1"),
    (dict(group_m=0), "group_m must be an integer in 1..65536, got 0"),
    (dict(grid=0), "grid .* got 0"),
    (dict(grid=-1), "grid .* got -1"),
    (dict(grid=1.5), "grid .* got 1.5"),
    (dict(bn="128"), "bn must be 64, 128, 192 or 256.*'128'"),
    (dict(alpha=None), "alpha must be a real number"),
    (dict(beta="1"), "beta must be a real number"),
])
def test_gemm_bad_options(options, words):
    with pytest.raises(TensorMapError, match=words):
        Gemm(*gemm_arrays(), **options)


@pytest.mark.parametrize("value", [1, False])
def test_gemm_refuses_the_retired_warp_specialized_option(value):
    """warp_specialized is no longer an option (issue 23): a TypeError naming it, the value and where the multistage
    kernel lives now - for the plan and the function form alike."""
    words = (f"Gemm: warp_specialized is no longer an option, got warp_specialized={value!r}: "
             f".*benchmarks/gemm_multistage.py")
    with pytest.raises(TypeError, match=words):
        Gemm(*gemm_arrays(), warp_specialized=value)
    with pytest.raises(TypeError, match=words):
        gemm(*gemm_arrays(), warp_specialized=value)


@pytest.mark.parametrize("cls, options, words", [
    (StreamCopy, dict(tile_bytes="big"), "tile_bytes must be an integer"),
    (StreamCopy, dict(stages=True), "stages must be an integer in 1..32, got True"),
    (StreamCopy, dict(two_roles="yes"), "two_roles must be True or False"),
    (StreamCopy, dict(ctas_per_sm=0), "ctas_per_sm must be an integer in 1..32, got 0"),
    (Transpose, dict(grid=0), "grid .* got 0"),
    (Transpose, dict(ctas_per_sm=2.0), "ctas_per_sm must be an integer"),
    (Softmax, dict(store_lag="1"), "store_lag must be an integer"),
    (Softmax, dict(rows_per_stage=0), "rows_per_stage must be an integer >= 1"),
    (Softmax, dict(fastmath=None), "fastmath must be True or False"),
    (RowSum, dict(stage_bytes=1.5e4), "stage_bytes must be an integer"),
    (Laplacian5, dict(consumer_warps=0), "consumer_warps must be an integer in 1..31"),
    (Laplacian5, dict(walk="cols"), "walk must be 'strips' or 'rows'"),
])
def test_bad_options_name_the_option_and_the_value(cls, options, words):
    x = fa((64, 64))
    out = fa((64,) if cls is RowSum else (64, 64), ptr=1 << 30)
    with pytest.raises(TensorMapError, match=words):
        cls(x, out, **options)


def test_option_helpers():
    assert int_option("Op", "n", np.int32(3), 1, 4) == 3 and type(int_option("Op", "n", np.int32(3))) is int
    assert int_option("Op", "n", None, none_ok=True) is None
    assert bool_option("Op", "f", np.bool_(True)) is True
    assert choice_option("Op", "m", "rows", ("rows", "chunked")) == "rows"
    with pytest.raises(TensorMapError, match="m must be 'rows' or 'chunked', got 1"):
        choice_option("Op", "m", 1, ("rows", "chunked"))
    with pytest.raises(TypeError):  # (OptionTypeError is a TypeError too)
        int_option("Op", "n", "3")


def test_plan_cache_size_refuses_a_string():
    with pytest.raises(TensorMapError, match="plan_cache_size: n must be an integer >= 0, got 'abc'"):
        _plan_cache.plan_cache_size("abc")


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True])
def test_sm_count_refuses_a_bad_device(bad):
    with pytest.raises(ValueError, match=f"sm_count: device_id must be .*got {re.escape(repr(bad))}"):
        numbatma.devices.sm_count(bad)


# -- scalars ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, words", [
    (np.array(2.0, np.float32), "a must be a Python or NumPy scalar, got an array.*float\\(a\\)"),
    (fa(()), "a must be a Python or NumPy scalar, got an array"),
    (None, "a must be a real number"),
    ("2", "a must be a real number"),
    (True, "a must be a real number"),
    (1 + 2j, "a must be a real number"),
])
def test_axpy_refuses_non_numbers_and_arrays_as_a(a, words):
    with pytest.raises(TensorMapError, match=words):
        axpy(a, fa((64, 64)), fa((64, 64), ptr=1 << 30), fa((64, 64), ptr=1 << 31))


@pytest.mark.parametrize("a", [float("nan"), float("inf"), np.float64(-0.0), 3])
def test_axpy_takes_ieee_scalars(a, offline):
    out = fa((64, 64), ptr=1 << 31)
    assert axpy(a, fa((64, 64)), fa((64, 64), ptr=1 << 30), out) is out
    got = offline[-1][0]
    assert type(got) is np.float32 and (np.isnan(got) if a != a else got == np.float32(a))


# -- empty arrays ----------------------------------------------------------------------------------------------------
EMPTY_STRIDES = [None, (0, 0), (4, 4)]


@pytest.mark.parametrize("strides", EMPTY_STRIDES)
@pytest.mark.parametrize("form", ["stream_copy", "axpy", "transpose", "softmax", "row_sum", "laplacian5", "gemm"])
def test_empty_arrays_of_any_strides_launch_nothing(form, strides, offline):
    def e(shape, ptr, dtype=np.float32):
        return fa(shape, dtype, ptr=ptr, strides=strides)

    if form == "stream_copy":
        out = e((0, 8), 1 << 30)
        assert stream_copy(e((0, 8), MB), out) is out
    elif form == "axpy":
        out = e((0, 8), 1 << 31)
        assert axpy(2.0, e((0, 8), MB), e((0, 8), 1 << 30), out) is out
    elif form == "transpose":
        out = e((8, 0), 1 << 30)
        assert transpose(e((0, 8), MB), out) is out
    elif form == "softmax":
        out = e((0, 8), 1 << 30)
        assert softmax(e((0, 8), MB), out) is out
    elif form == "row_sum":
        out = fa((0,), ptr=1 << 30, strides=None if strides is None else strides[:1])
        assert row_sum(e((0, 8), MB), out) is out
    elif form == "laplacian5":
        out = e((0, 8), 1 << 30)
        assert laplacian5(e((0, 8), MB), out) is out
    else:
        out = e((0, 8), 1 << 31)
        assert gemm(e((0, 16), MB, np.float16), fa((16, 8), np.float16, ptr=1 << 30), out) is out
    assert offline == []


def test_an_array_whose_interface_raises_is_still_an_array():
    """torch raises RuntimeError (not AttributeError) for the CUDA Array Interface of a tensor that requires grad: the
    plans' argument check must not turn that into a crash of its own (numbatma.kernels.torch's ops met it)."""
    from numbatma.kernels._rebind import _looks_like_array

    class Refusing:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")

    class InstanceInterface:
        def __init__(self):
            self.__cuda_array_interface__ = {"shape": (1,)}

    assert _looks_like_array(Refusing()) and _looks_like_array(InstanceInterface())
    assert not _looks_like_array(3.0) and not _looks_like_array("bhsd")
