"""Host-side validation of TensorMap (numbatma/tensormap.py). No GPU or driver needed: every rule is checked in
Python before the descriptor is encoded, so these tests build descriptors for fake CUDA arrays.

Each rejection must name the rule and the user's own values (shape, dtype, stride, box), so most checks below
assert several substrings of the message at once (see ``msg``).
"""
import math
import re

import numpy as np
import pytest

import numbatma
from numbatma import (
    SUPPORTED_DTYPES,
    Interleave,
    L2Promotion,
    OOBFill,
    Swizzle,
    TensorMap,
    TensorMapArray,
    TensorMapError,
    array_layout,
)

BASE = 1 << 20  # a 1 MiB-aligned fake device address


class FakeCudaArray:
    """Just enough of the CUDA Array Interface: pointer, shape, byte strides (row-major, None = C-contiguous)."""

    def __init__(self, shape, dtype, strides=None, ptr=BASE):
        self.__cuda_array_interface__ = {
            "data": (ptr, False),
            "shape": tuple(shape),
            "strides": None if strides is None else tuple(strides),
            "typestr": np.dtype(dtype).str,
            "version": 3,
        }


def msg(*parts):
    """A ``match=`` regex that requires every part (literally, in any order) somewhere in the message."""
    return "(?s)" + "".join(f"(?=.*{re.escape(str(p))})" for p in parts)


def f32(shape, **kw):
    return FakeCudaArray(shape, np.float32, **kw)


# -- rank ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_ranks_1_to_5_accepted(rank):
    shape = (4,) * (rank - 1) + (64,)
    box = (2,) * (rank - 1) + (8,)
    tm = TensorMap(f32(shape), box)
    assert tm.rank == rank
    assert tm.numba_type.rank == rank
    assert tm.box == box == tm.numba_type.box
    assert tm.shared_shape == box == tm.numba_type.shared_shape
    assert tm.box_bytes == 2 ** (rank - 1) * 8 * 4 == tm.numba_type.box_bytes
    assert tm.tma_dtype == "FLOAT32"
    assert tm.array is not None


@pytest.mark.parametrize(
    "shape, box",
    [((), ()), ((2, 2, 2, 2, 2, 32), (1, 1, 1, 1, 1, 8))],
    ids=["rank0", "rank6"],
)
def test_rank_out_of_range_rejected(shape, box):
    name = "shape ()" if not shape else "shape (2, 2, 2, 2, 2, 32)"
    with pytest.raises(TensorMapError, match=msg(f"rank {len(shape)}", name, "float32", "rank 1 to 5")):
        TensorMap(f32(shape), box)


def test_rank0_with_scalar_box_gives_tensormap_error():
    with pytest.raises(TensorMapError, match=msg("rank 0")):
        TensorMap(f32(()), 8)


# -- global memory layout --------------------------------------------------------------------------------------


def test_innermost_dimension_must_be_contiguous():
    # A transposed (64, 32) view of a (32, 64) float32 array: the last axis steps 256 bytes.
    arr = f32((64, 32), strides=(4, 256))
    with pytest.raises(TensorMapError, match=msg("innermost", "stride of 256 bytes", "contiguous", "(64, 32)",
                                                 "4 bytes, one float32")):
        TensorMap(arr, (8, 8))


def test_global_address_16_byte_aligned():
    with pytest.raises(TensorMapError, match=msg("0x100008", "not 16-byte aligned", "(64, 64)", "float32")):
        TensorMap(f32((64, 64), ptr=BASE + 8), (8, 8))


def test_interleave_b32_needs_32_byte_address():
    arr = f32((4, 8, 8), ptr=BASE + 16)  # 16-byte aligned, not 32
    TensorMap(arr, (2, 8, 8))  # fine without interleave
    with pytest.raises(TensorMapError, match=msg("0x100010", "not 32-byte aligned", "multiple of 32 bytes")):
        TensorMap(arr, (2, 8, 8), interleave=Interleave.B32, swizzle=Swizzle.B32)
    TensorMap(f32((4, 8, 8), ptr=BASE + 32), (2, 8, 8), interleave=Interleave.B32, swizzle=Swizzle.B32)


def test_row_stride_multiple_of_16_with_padding_hint():
    with pytest.raises(TensorMapError, match=msg("row stride", "(1000, 1001)", "4004 bytes", "multiple of 16",
                                                 "Pad the rows to 1004 elements")):
        TensorMap(f32((1000, 1001)), (8, 8))
    TensorMap(f32((1000, 1001), strides=(1004 * 4, 4)), (8, 8))  # the suggested padding is accepted


def test_outer_stride_multiple_of_16():
    # rank 3, float16 rows of 8 elements: row stride 16 is fine, the dimension-0 stride of 56 bytes is not.
    arr = FakeCudaArray((4, 3, 8), np.float16, strides=(56, 16, 2))
    with pytest.raises(TensorMapError, match=msg("stride of dimension 0", "56 bytes", "multiple of 16")):
        TensorMap(arr, (1, 1, 8))


def test_interleave_b32_strides_multiple_of_32():
    arr = f32((4, 4, 4))  # strides (64, 16, 4): 16 is not a multiple of 32
    with pytest.raises(TensorMapError, match=msg("row stride", "16 bytes", "multiple of 32 bytes")):
        TensorMap(arr, (1, 4, 4), interleave=Interleave.B32, swizzle=Swizzle.B32)


@pytest.mark.parametrize("stride", [0, -256])
def test_outer_strides_positive(stride):
    with pytest.raises(TensorMapError, match=msg(f"is {stride} bytes", "positive strides")):
        TensorMap(f32((4, 64), strides=(stride, 4)), (2, 8))


def test_stride_below_2_pow_40():
    big = 1 << 40
    with pytest.raises(TensorMapError, match=msg(f"{big} bytes", "2**40", "row stride")):
        TensorMap(f32((2, 16), strides=(big, 4)), (1, 8))
    TensorMap(f32((2, 16), strides=(big - 16, 4)), (1, 8))


@pytest.mark.parametrize("shape, axis, bad", [((0, 16), 0, 0), ((16, 0), 1, 0), ((2**31 + 1, 16), 0, 2**31 + 1),
                                               ((2**32, 16), 0, 2**32)])
def test_dims_in_1_to_2_pow_31(shape, axis, bad):
    # (the driver takes extents up to 2**32, but TMA coordinates are signed 32-bit: numbatma's rule is 1..2**31)
    with pytest.raises(TensorMapError, match=msg(f"dimension {axis}", f"is {bad}", "1..2**31")):
        TensorMap(f32(shape), (1, 4))


def test_dim_2_pow_31_accepted():
    TensorMap(f32((2**31, 4)), (1, 4))


# -- box -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("box, axis, bad", [((0, 8), 0, 0), ((257, 8), 0, 257), ((8, 0), 1, 0)])
def test_box_dims_1_to_256(box, axis, bad):
    with pytest.raises(TensorMapError, match=msg(f"box ({box[0]}, {box[1]})", f"has {bad} along dimension {axis}",
                                                 "1..256")):
        TensorMap(f32((1024, 1024)), box)


def test_box_256_accepted():
    tm = TensorMap(FakeCudaArray((1024, 1024), np.uint8), (256, 256))
    assert tm.box_bytes == 256 * 256


@pytest.mark.parametrize("box, n", [((8,), 1), ((2, 8, 8), 3)])
def test_box_wrong_number_of_entries(box, n):
    expected_box = "(8,)" if n == 1 else "(2, 8, 8)"
    with pytest.raises(TensorMapError, match=msg(f"box {expected_box}", f"{n} entries", "2 dimensions",
                                                 "float32 array with shape (64, 64)")):
        TensorMap(f32((64, 64)), box)


@pytest.mark.parametrize("box", [(8.0, 8), (8, "8"), (True, 8), None])
def test_box_must_be_integers(box):
    with pytest.raises(TensorMapError, match=msg("box must be a tuple of integers", repr(box))):
        TensorMap(f32((64, 64)), box)


def test_box_numpy_integers_accepted():
    tm = TensorMap(f32((64, 64)), np.array([8, 16]))
    assert tm.box == (8, 16) and all(type(b) is int for b in tm.box)


def test_innermost_box_bytes_multiple_of_16():
    with pytest.raises(TensorMapError, match=msg("3 float32 elements = 12 bytes", "multiple of 16 bytes",
                                                 "(4 float32 elements)")):
        TensorMap(f32((64, 64)), (8, 3))


# -- swizzle -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "box, swizzle, inner, span, max_elems",
    [((8, 64), Swizzle.B128, 256, 128, 32), ((8, 16), Swizzle.B32, 64, 32, 8), ((8, 32), Swizzle.B64, 128, 64, 16)],
)
def test_swizzle_span_limits_inner_box(box, swizzle, inner, span, max_elems):
    with pytest.raises(TensorMapError, match=msg(f"{box[1]} float32 elements = {inner} bytes", f"{span}-byte span",
                                                 f"swizzle={swizzle.name}", f"box[-1] <= {max_elems}")):
        TensorMap(f32((256, 256)), box, swizzle=swizzle)


@pytest.mark.parametrize(
    "box, swizzle", [((8, 32), Swizzle.B128), ((8, 8), Swizzle.B32), ((8, 16), Swizzle.B64), ((8, 256), Swizzle.NONE)]
)
def test_swizzle_fitting_box_accepted(box, swizzle):
    tm = TensorMap(f32((256, 256)), box, swizzle=swizzle)
    assert tm.swizzle is swizzle
    assert tm.numba_type.swizzle == int(swizzle)
    assert tm.shared_alignment == {Swizzle.B128: 1024, Swizzle.B64: 512, Swizzle.B32: 256}.get(swizzle, 128)
    assert tm.shared_shape == box and tm.box_bytes == 4 * box[0] * box[1]


@pytest.mark.parametrize("box, swizzle, shared", [
    ((16, 8), Swizzle.B64, (16, 16)), ((8, 16), Swizzle.B128, (8, 32)), ((4, 4), Swizzle.B128, (4, 32)),
    ((8, 4), Swizzle.B32, (8, 8)), ((2, 8, 4), Swizzle.B64, (2, 8, 16)),
])
def test_rows_narrower_than_the_swizzle_span_take_a_whole_span(box, swizzle, shared):
    """Observed on an H200 (scripts/probe_swizzle_pad.py): each row of such a box starts a span apart in
    shared memory; the load still delivers (and counts) only the box's bytes."""
    tm = TensorMap(f32((256, 256, 256)[:len(box)]), box, swizzle=swizzle)
    assert tm.shared_shape == shared
    assert tm.box_bytes == 4 * int(np.prod(box))
    assert tm.numba_type.shared_shape == shared and tm.numba_type.box_bytes == tm.box_bytes


@pytest.mark.parametrize("spelling", [128, "128B", "128b", "B128", Swizzle.B128])
def test_swizzle_spellings(spelling):
    assert TensorMap(f32((64, 64)), (8, 32), swizzle=spelling).swizzle is Swizzle.B128


@pytest.mark.parametrize("bad", [7, "96B", 1.5])
def test_swizzle_invalid_value(bad):
    with pytest.raises(TensorMapError, match=msg(f"swizzle {bad!r} is not one of", "Swizzle.B128")):
        TensorMap(f32((64, 64)), (8, 8), swizzle=bad)


@pytest.mark.parametrize(
    "key, value, choice",
    [("l2_promotion", 32, "L2Promotion.B64"), ("interleave", 8, "Interleave.B16"), ("oob_fill", "inf", "OOBFill.NAN")],
)
def test_other_enum_options_invalid_value(key, value, choice):
    with pytest.raises(TensorMapError, match=msg(f"{key} {value!r} is not one of", choice)):
        TensorMap(f32((64, 64, 64)), (8, 8, 8), **{key: value})


def test_l2_promotion_accepted():
    assert TensorMap(f32((64, 64)), (8, 8), l2_promotion=256).l2_promotion is L2Promotion.B256


# -- element strides -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("es, axis, bad", [((0, 1, 1), 0, 0), ((9, 1, 1), 0, 9), ((1, 9, 1), 1, 9)])
def test_element_strides_1_to_8(es, axis, bad):
    with pytest.raises(TensorMapError, match=msg(f"element_strides ({es[0]}, {es[1]}, {es[2]})",
                                                 f"has {bad} along dimension {axis}", "1..8")):
        TensorMap(f32((16, 64, 64)), (8, 8, 32), element_strides=es)


def test_element_strides_wrong_length():
    with pytest.raises(TensorMapError, match=msg("element_strides (2,)", "1 entries", "2 dimensions")):
        TensorMap(f32((64, 64)), (8, 32), element_strides=(2,))


@pytest.mark.parametrize(
    "shape, box, es, shared",
    [((64, 64), (8, 32), (2, 1), (4, 32)), ((16, 64, 64), (5, 8, 8), (2, 3, 1), (3, 3, 8))],
)
def test_element_strides_shrink_shared_tile(shape, box, es, shared):
    # Strides on outer axes only: the driver ignores the innermost element stride without interleave.
    tm = TensorMap(f32(shape), box, element_strides=es)
    assert tm.shared_shape == shared == tm.numba_type.shared_shape
    assert tm.box_bytes == math.prod(shared) * 4 == tm.numba_type.box_bytes
    assert tm.numba_type.element_strides == es


def test_innermost_element_stride_rejected_or_ignored():
    try:
        tm = TensorMap(f32((64, 64)), (8, 32), element_strides=(1, 2))
    except TensorMapError as exc:
        assert "element_strides" in str(exc)
        return
    assert tm.shared_shape == (8, 32)
    assert tm.box_bytes == 8 * 32 * 4


# -- interleave ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("interleave", [Interleave.B16, Interleave.B32])
def test_interleave_needs_rank_3(interleave):
    with pytest.raises(TensorMapError, match=msg(f"interleave={interleave.name}", "rank 3 to 5", "has rank 2",
                                                 "(64, 64)")):
        TensorMap(f32((64, 64)), (8, 8), interleave=interleave, swizzle=Swizzle.B32)


@pytest.mark.parametrize("swizzle", [Swizzle.B64, Swizzle.B128])
def test_interleave_b32_rejects_wide_swizzle(swizzle):
    with pytest.raises(TensorMapError, match=msg("interleave=B32", f"swizzle={swizzle.name}")):
        TensorMap(f32((8, 8, 64)), (2, 8, 8), interleave=Interleave.B32, swizzle=swizzle)


def test_interleave_accepted():
    tm = TensorMap(FakeCudaArray((8, 8, 16), np.float16), (2, 8, 8), interleave=Interleave.B16,
                   swizzle=Swizzle.B128)
    assert tm.numba_type.interleave == 16
    tm = TensorMap(f32((8, 8, 64)), (2, 8, 8), interleave="32B", swizzle=Swizzle.B32)
    assert tm.interleave is Interleave.B32 and tm.numba_type.interleave == 32


def test_interleave_b32_requires_swizzle_b32():
    with pytest.raises(TensorMapError, match=msg("interleave=B32", "NONE")):
        TensorMap(f32((8, 8, 64)), (2, 8, 8), interleave=Interleave.B32, swizzle=Swizzle.NONE)


# -- dtypes, OOB fill, tf32 ----------------------------------------------------------------------------------


def _dtype(name):
    if name == "bfloat16":
        return pytest.importorskip("ml_dtypes").bfloat16
    return np.dtype(name)


@pytest.mark.parametrize("name", SUPPORTED_DTYPES)
def test_every_supported_dtype(name):
    dt = np.dtype(_dtype(name))
    inner = 32 // dt.itemsize  # 32 bytes: a 16-byte multiple
    tm = TensorMap(FakeCudaArray((16, 64), dt), (4, inner))
    assert tm.dtype == dt and tm.dtype.name == name
    nt = tm.numba_type
    assert nt.itemsize == dt.itemsize == nt.dtype.bitwidth // 8
    assert nt.tma_dtype == tm.tma_dtype
    assert tm.box_bytes == 4 * 32 == nt.box_bytes
    with pytest.raises(TensorMapError, match=msg(f"{inner + 1} {name} elements", "multiple of 16 bytes")):
        TensorMap(FakeCudaArray((16, 64), dt), (4, inner + 1))


@pytest.mark.parametrize("name, tma", [("int8", "UINT8"), ("bool", "UINT8"), ("int16", "UINT16"),
                                       ("int32", "INT32"), ("float16", "FLOAT16"), ("bfloat16", "BFLOAT16")])
def test_tma_dtype_mapping(name, tma):
    assert TensorMap(FakeCudaArray((16, 64), _dtype(name)), (4, 16)).tma_dtype == tma


@pytest.mark.parametrize("name", ["int32", "uint8", "int64", "bool"])
def test_oob_nan_rejected_for_integers(name):
    with pytest.raises(TensorMapError, match=msg("oob_fill=NAN", "floating-point", f"holds {name}",
                                                 f"{name} array with shape (16, 64)")):
        TensorMap(FakeCudaArray((16, 64), name), (4, 16), oob_fill=OOBFill.NAN)


@pytest.mark.parametrize("name", ["float16", "float32", "float64", "bfloat16"])
def test_oob_nan_accepted_for_floats(name):
    tm = TensorMap(FakeCudaArray((16, 64), _dtype(name)), (4, 16), oob_fill="nan")
    assert tm.oob_fill is OOBFill.NAN


def test_unsupported_dtype_lists_supported():
    with pytest.raises(TensorMapError, match=msg("complex64", "(16, 64)", "no TMA data type", "float32", "bfloat16",
                                                 "uint8")):
        TensorMap(FakeCudaArray((16, 64), np.complex64), (4, 4))


def test_unparseable_typestr():
    arr = FakeCudaArray((16, 64), np.float32)
    arr.__cuda_array_interface__["typestr"] = "<zz"
    with pytest.raises(TensorMapError, match=msg("unsupported element type", "'<zz'")):
        TensorMap(arr, (4, 4))


def test_tf32_only_for_float32():
    tm = TensorMap(f32((16, 64)), (4, 8), tf32=True)
    assert tm.tma_dtype == "TFLOAT32" == tm.numba_type.tma_dtype
    assert tm.numba_type != TensorMap(f32((16, 64)), (4, 8)).numba_type
    for name in ("float16", "float64", "int32"):
        with pytest.raises(TensorMapError, match=msg("tf32=True", "float32", f"is {name}")):
            TensorMap(FakeCudaArray((16, 64), name), (4, 16), tf32=True)


# -- array_layout ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("obj, tname", [(object(), "object"), ([1, 2, 3], "list"), (3.0, "float")])
def test_array_layout_rejects_non_cuda_arrays(obj, tname):
    with pytest.raises(TensorMapError, match=msg("expected a CUDA array", "__cuda_array_interface__",
                                                 f"got {tname}")):
        array_layout(obj)
    with pytest.raises(TensorMapError, match=msg(f"got {tname}")):
        TensorMap(obj, (4, 4))


def test_array_layout_rejects_host_numpy_array():
    with pytest.raises(TensorMapError, match=msg("ndarray")):
        TensorMap(np.zeros((64, 64), np.float32), (8, 8))


def test_array_layout_reads_cai():
    lay = array_layout(FakeCudaArray((3, 5, 8), np.float16, ptr=BASE + 256))
    assert (lay.ptr, lay.shape, lay.strides, lay.dtype) == (BASE + 256, (3, 5, 8), (80, 16, 2), np.dtype(np.float16))
    assert array_layout(lay) is lay
    assert array_layout(f32((4, 8), strides=(64, 4))).strides == (64, 4)


# -- repoint -------------------------------------------------------------------------------------------------


def test_repoint_rejects_other_layout():
    tm = TensorMap(f32((64, 64)), (8, 8))
    with pytest.raises(TensorMapError, match=msg("repoint", "shape (64, 64)", "shape (64, 128)", "(256, 4)",
                                                 "(512, 4)")):
        tm.repoint(f32((64, 128)))
    with pytest.raises(TensorMapError, match=msg("repoint", "float32 array", "float64 array")):
        tm.repoint(FakeCudaArray((64, 64), np.float64, strides=(256, 8)))
    with pytest.raises(TensorMapError, match=msg("repoint", "(512, 4)")):
        tm.repoint(f32((64, 64), strides=(512, 4)))


def test_repoint_same_layout_updates_array():
    a, b = f32((64, 64)), f32((64, 64), ptr=BASE + 4096)
    tm = TensorMap(a, (8, 8))
    assert tm.array is a
    assert tm.repoint(b) is tm  # not encoded yet: no driver call
    assert tm.array is b and tm._driver_args()["address"] == BASE + 4096


def test_repoint_checks_alignment():
    tm = TensorMap(f32((64, 64)), (8, 8))
    with pytest.raises(TensorMapError, match=msg("0x100008", "16-byte aligned")):
        tm.repoint(f32((64, 64), ptr=BASE + 8))
    assert tm.array.__cuda_array_interface__["data"][0] == BASE


def test_driver_args_are_reversed():
    tm = TensorMap(f32((4, 16, 64)), (2, 8, 32), element_strides=(2, 1, 1))
    a = tm._driver_args()
    assert a["dims"] == (64, 16, 4)
    assert a["strides"] == (256, 4096)
    assert a["box"] == (32, 8, 2)
    assert a["element_strides"] == (1, 1, 2)
    assert a["rank"] == 3 and a["address"] == BASE


# -- TensorMapArray (type checks happen before any driver call) ---------------------------------------------------


def test_tensormap_array_rejects_mixed_layouts():
    t0 = TensorMap(f32((64, 64)), (8, 32))
    t1 = TensorMap(f32((64, 64)), (16, 32))
    with pytest.raises(TensorMapError, match=msg("same kernel type", "item 0", "item 1", "box=(8, 32)",
                                                 "box=(16, 32)")):
        TensorMapArray([t0, t1])
    t2 = TensorMap(f32((64, 64)), (8, 32), swizzle=Swizzle.B128)
    with pytest.raises(TensorMapError, match=msg("same kernel type", "item 1", "swizzle=128B")):
        TensorMapArray([t0, t2])


def test_tensormap_array_rejects_empty_and_non_tensormaps():
    with pytest.raises(TensorMapError, match=msg("at least one TensorMap")):
        TensorMapArray([])
    t0 = TensorMap(f32((64, 64)), (8, 32))
    with pytest.raises(TensorMapError, match=msg("item 1 is a str", "not a TensorMap")):
        TensorMapArray([t0, "not a descriptor"])


def test_tensormap_array_rejects_non_tensormap_first_item():
    t0 = TensorMap(f32((64, 64)), (8, 32))
    with pytest.raises(TensorMapError, match=msg("item 0 is a str", "not a TensorMap")):
        TensorMapArray(["not a descriptor", t0])


# -- Numba types ---------------------------------------------------------------------------------------------


def test_numba_type_depends_on_dtype_box_swizzle_only():
    a = TensorMap(f32((64, 64)), (8, 32), swizzle=Swizzle.B128)
    b = TensorMap(f32((128, 32), ptr=BASE + 1024), (8, 32), swizzle=128)
    assert a.numba_type == b.numba_type and hash(a.numba_type) == hash(b.numba_type)
    assert a.numba_type is a.numba_type  # cached
    others = [
        TensorMap(f32((64, 64)), (16, 32), swizzle=Swizzle.B128),  # box
        TensorMap(f32((64, 64)), (8, 32)),  # swizzle
        TensorMap(FakeCudaArray((64, 64), np.int32), (8, 32), swizzle=Swizzle.B128),  # dtype
        TensorMap(f32((64, 64)), (8, 32), swizzle=Swizzle.B128, element_strides=(2, 1)),  # element strides
    ]
    for o in others:
        assert o.numba_type != a.numba_type
    assert "box=(8, 32)" in str(a.numba_type) and "swizzle=128B" in str(a.numba_type)


def test_repr_names_layout():
    r = repr(TensorMap(f32((64, 64)), (8, 32), swizzle=Swizzle.B128))
    assert r == "TensorMap(float32(64, 64), box=(8, 32), swizzle=B128, oob_fill=ZERO)"


def test_public_exports():
    assert TensorMapError.__mro__[1] is ValueError
    assert set(numbatma.SUPPORTED_DTYPES) >= {"float32", "bfloat16", "int8"}


def test_unit_dimension_strides_are_ignored():
    """numba reports contiguous strides for extent-1 dimensions of a padded view ((1, 1) out of (1, 4)):
    those strides are never used, so they must not make the view invalid."""
    from numbatma import TensorMap, array_layout

    view = FakeCudaArray((1, 1), np.float32, strides=(4, 4))
    assert array_layout(view).strides == (16, 4)
    assert TensorMap(view, (1, 4)).strides == (16, 4)
    deep = FakeCudaArray((3, 1, 5), np.float64, strides=(320, 8, 8))
    assert array_layout(deep).strides == (320, 48, 8)
