"""Issue 22, the host layer: numbatma refuses what TMA cannot do (and what is not what it claims to be) in the user's
terms, before any driver call, and accepts what is valid. No GPU or driver needed: descriptors are validated (not
encoded) for fake CUDA arrays (tests/fakes.py) and fake CUDA Array Interface dicts.

Every refusal asserts the exception type and that the FIRST line of the message names the rule and the user's own
value (see ``refused``). The options' spellings that are valid are accepted (``accepted`` cases), so a rule that
refused too much would fail here as well.
"""
import types

import numpy as np
import pytest

import numbatma
from numbatma import (
    ArrayLayout,
    DeviceView,
    Im2colTensorMap,
    Interleave,
    L2Promotion,
    OOBFill,
    Swizzle,
    TensorMap,
    TensorMapError,
    array_layout,
    is_readonly,
)
from numbatma import devices, streams

from fakes import FakeCudaArray

BASE = 1 << 20


def f32(shape, **kw):
    return FakeCudaArray(shape, np.float32, ptr=kw.pop("ptr", BASE), **kw)


def cai_array(**fields):
    """An object whose CUDA Array Interface is a valid (16, 64) float32 one with ``fields`` replaced (a value of
    ``...`` removes the field)."""
    cai = {"data": (BASE, False), "shape": (16, 64), "strides": None, "typestr": "<f4", "version": 3}
    for key, value in fields.items():
        if value is ...:
            cai.pop(key)
        else:
            cai[key] = value
    return types.SimpleNamespace(__cuda_array_interface__=cai)


def refused(exc_type, call, *words):
    """``call()`` raises ``exc_type`` whose first line contains every one of ``words``."""
    with pytest.raises(exc_type) as info:
        call()
    first = str(info.value).splitlines()[0]
    for w in words:
        assert str(w) in first, f"{w!r} not on the first line: {first!r}"
    return first


def im2col(array=None, **kw):
    options = dict(channels_per_pixel=16, pixels_per_column=32)
    options.update(kw)
    return Im2colTensorMap(FakeCudaArray((2, 8, 8, 16), np.float32) if array is None else array, **options)


# -- boolean options: True / False only ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["no", "False", 1, 0, None, 1.0, [True]])
def test_tf32_takes_only_a_bool(value):
    # ("no" was encoded as tf32: a truthy string. 0 and 1 are not booleans either.)
    refused(TensorMapError, lambda: TensorMap(f32((16, 64)), (8, 8), tf32=value),
            "TensorMap: tf32 must be True or False", f"got {value!r}")


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_allow_store_overhang_takes_only_a_bool(value):
    refused(TensorMapError, lambda: TensorMap(f32((16, 60)), (8, 4), allow_store_overhang=value),
            "allow_store_overhang must be True or False", f"got {value!r}")


@pytest.mark.parametrize("value", ["no", 1, None])
def test_im2col_tf32_takes_only_a_bool(value):
    refused(TensorMapError, lambda: im2col(tf32=value), "Im2colTensorMap: tf32 must be True or False",
            f"got {value!r}")


@pytest.mark.parametrize("value, tma", [(True, "TFLOAT32"), (False, "FLOAT32"), (np.bool_(True), "TFLOAT32"),
                                        (np.bool_(False), "FLOAT32")])
def test_bools_and_numpy_bools_accepted(value, tma):
    tm = TensorMap(f32((16, 64)), (8, 8), tf32=value)
    assert tm.tf32 is bool(value) and tm.tma_dtype == tma
    assert TensorMap(f32((16, 60)), (8, 4), allow_store_overhang=value).allow_store_overhang is bool(value)
    assert im2col(tf32=value).tma_dtype == tma


# -- enum options ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value, choice", [
    ("swizzle", True, "Swizzle.B128"), ("swizzle", False, "Swizzle.NONE"), ("swizzle", 128.0, "Swizzle.B64"),
    ("swizzle", "no", "Swizzle.B32"), ("swizzle", None, "Swizzle.NONE"),
    ("oob_fill", True, "OOBFill.ZERO"), ("oob_fill", 0, "OOBFill.NAN"), ("oob_fill", "inf", "OOBFill.NAN"),
    ("l2_promotion", False, "L2Promotion.B64"), ("l2_promotion", 64.0, "L2Promotion.B256"),
    ("l2_promotion", "big", "L2Promotion.NONE"),
    ("interleave", True, "Interleave.B16"), ("interleave", 16.0, "Interleave.B32"), ("interleave", "x", "Interleave.NONE"),
])
def test_enum_options_refuse_bools_floats_and_unknown_names(key, value, choice):
    # (False == 0 and 128.0 == 128 to Python: swizzle=False was Swizzle.NONE, 128.0 was B128)
    refused(TensorMapError, lambda: TensorMap(f32((8, 16, 64)), (2, 8, 8), **{key: value}),
            f"TensorMap: {key} {value!r} is not one of", choice)


@pytest.mark.parametrize("key, value", [("swizzle", True), ("oob_fill", 1.0), ("l2_promotion", "512B")])
def test_im2col_enum_options_refused(key, value):
    refused(TensorMapError, lambda: im2col(**{key: value}), f"Im2colTensorMap: {key} {value!r} is not one of")


@pytest.mark.parametrize("key, value, member", [
    ("swizzle", np.int64(64), Swizzle.B64), ("swizzle", "32B", Swizzle.B32), ("oob_fill", "nan", OOBFill.NAN),
    ("l2_promotion", np.int32(128), L2Promotion.B128), ("interleave", 0, Interleave.NONE)])
def test_enum_spellings_still_accepted(key, value, member):
    assert getattr(TensorMap(f32((8, 16, 64)), (2, 8, 8), **{key: value}), key) is member


@pytest.mark.parametrize("value", [1, b"e4m3", ["e4m3"], "E4M3"])
def test_element_must_be_a_float8_name(value):
    refused(TensorMapError, lambda: TensorMap(FakeCudaArray((16, 64), np.uint8), (8, 16), element=value),
            "element must be 'e4m3' or 'e5m2'", f"got {value!r}")


# -- numeric options: ints, not bools, floats or strings --------------------------------------------------------------
@pytest.mark.parametrize("name, value", [("box", (8.0, 8)), ("box", ("8", 8)), ("box", True), ("box", None),
                                         ("box", "88"), ("element_strides", (1, 1.0)),
                                         ("element_strides", (np.bool_(True), 1))])
def test_box_and_element_strides_take_ints(name, value):
    args = {"box": (8, 8)}
    args[name] = value
    refused(TensorMapError, lambda: TensorMap(f32((16, 64)), args.pop("box"), **args),
            f"TensorMap: {name} must be a tuple of integers, got {value!r}")


@pytest.mark.parametrize("name, value", [("channels_per_pixel", 16.0), ("channels_per_pixel", True),
                                         ("channels_per_pixel", "16"), ("pixels_per_column", np.bool_(True)),
                                         ("pixels_per_column", None)])
def test_im2col_counts_take_ints(name, value):
    refused(TensorMapError, lambda: im2col(**{name: value}), f"Im2colTensorMap: {name} must be an integer",
            f"got {value!r}")


def test_im2col_corners_take_ints():
    refused(TensorMapError, lambda: im2col(pixel_box_lower_corner=(0.5, 0)),
            "pixel_box_lower_corner must be a tuple of integers, got (0.5, 0)")


# -- extents: TMA coordinates are signed 32-bit ------------------------------------------------------------------------
def test_more_than_2_pow_31_rows_refused():
    rows = 2**31 + 1
    first = refused(TensorMapError, lambda: TensorMap(f32((rows, 16)), (8, 16)),
                    f"dimension 0 of the float32 array with shape ({rows}, 16) is {rows}", "1..2**31")
    assert "signed 32-bit" in first


def test_more_than_2_pow_31_pixels_refused_for_im2col():
    w = 2**31 + 16
    refused(TensorMapError, lambda: im2col(FakeCudaArray((1, 1, w, 16), np.float32)),
            "Im2colTensorMap: dimension 2", f"is {w}", "1..2**31")


def test_2_pow_31_elements_along_an_axis_accepted():
    assert TensorMap(f32((2**31, 16)), (8, 16)).shape == (2**31, 16)
    assert TensorMap(FakeCudaArray((2**31,), np.uint8), (256,)).shape == (2**31,)


# -- byte order ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("typestr", [">f4", ">i2", ">f8", ">V2"])
def test_big_endian_elements_refused(typestr):
    # ('>V2': the byte order of bfloat16's typestr, which NumPy's void dtype would not keep)
    refused(TensorMapError, lambda: TensorMap(cai_array(typestr=typestr), (8, 16)),
            "big-endian", repr(typestr))
    refused(TensorMapError, lambda: array_layout(cai_array(typestr=typestr)), "big-endian", repr(typestr))


def test_big_endian_layout_given_directly_refused():
    layout = ArrayLayout(BASE, (16, 64), (256, 4), np.dtype(">f4"))
    refused(TensorMapError, lambda: TensorMap(layout, (8, 8)), "TensorMap:", "big-endian", "'>f4'")
    refused(TensorMapError, lambda: im2col(ArrayLayout(BASE, (2, 8, 8, 16), (4096, 512, 64, 4), np.dtype(">f4"))),
            "Im2colTensorMap:", "big-endian", "'>f4'")


@pytest.mark.parametrize("typestr", ["|u1", "<f4", "<u2", "|b1"])
def test_little_endian_and_byte_elements_accepted(typestr):
    assert array_layout(cai_array(typestr=typestr)).dtype == np.dtype(typestr)


# -- strides ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strides, words", [
    ((-256, 4), ("row stride", "is -256 bytes", "positive strides")),  # (negative: TMA cannot step backwards)
    ((0, 4), ("row stride", "is 0 bytes", "positive strides")),  # (broadcast: a zero stride is not encodable)
    ((256, -4), ("stride of -4 bytes", "contiguous")),
    ((258, 4), ("stride of dimension 0", "is 258 bytes", "not a multiple of the itemsize (4 bytes)")),
    ((256, 2), ("stride of dimension 1", "is 2 bytes", "not a multiple of the itemsize")),
    ((256, 4, 4), ("'strides' (256, 4, 4) has 3 entries", "'shape' (16, 64) has 2")),
    ((256,), ("'strides' (256,) has 1 entries",)),
    ((256.0, 4), ("'strides' must be None or a tuple of ints", "(256.0, 4)")),
    ("256,4", ("'strides' must be None or a tuple of ints", "'256,4'")),
    ((True, 4), ("'strides' must be None or a tuple of ints", "(True, 4)")),
])
def test_malformed_strides_refused(strides, words):
    refused(TensorMapError, lambda: TensorMap(cai_array(strides=strides), (8, 16)), *words)


def test_a_unit_dimension_takes_any_stride():
    # (the stride of an extent-1 axis is never used: exporters report anything there)
    arr = cai_array(shape=(1, 64), strides=(3, 4))
    assert array_layout(arr).strides == (256, 4)


# -- the CUDA Array Interface's fields -------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["shape", "typestr", "data"])
def test_a_missing_interface_field_is_named(field):
    refused(TensorMapError, lambda: array_layout(cai_array(**{field: ...})), f"has no {field!r} entry")


@pytest.mark.parametrize("field, value, rule", [
    ("shape", "16,64", "a tuple of ints >= 0"), ("shape", (16.0, 64), "a tuple of ints >= 0"),
    ("shape", (-1, 64), "a tuple of ints >= 0"), ("shape", (True, 64), "a tuple of ints >= 0"),
    ("shape", None, "a tuple of ints >= 0"),
    ("typestr", np.float32, "a NumPy type string"), ("typestr", 4, "a NumPy type string"),
    ("data", None, "a pair (pointer"), ("data", (BASE,), "a pair (pointer"),
    ("data", (str(BASE), False), "a pair (pointer"), ("data", (BASE, 0), "read-only flag: a bool"),
    ("data", (-16, False), "an int >= 0"), ("data", (float(BASE), False), "a pair (pointer"),
])
def test_an_ill_typed_interface_field_is_named(field, value, rule):
    refused(TensorMapError, lambda: TensorMap(cai_array(**{field: value}), (8, 16)),
            "__cuda_array_interface__", f"'{field}' must be", rule, f"got {value!r}")


@pytest.mark.parametrize("typestr", ["<zz", "", "f4x", "<f4,<f4("])
def test_a_malformed_typestr_is_named(typestr):
    refused(TensorMapError, lambda: array_layout(cai_array(typestr=typestr)), "unsupported element type",
            repr(typestr))


def test_a_mask_is_refused():
    refused(TensorMapError, lambda: array_layout(cai_array(mask=object())), "masked array", "'mask'")


def test_an_interface_that_is_not_a_dict_is_refused():
    arr = types.SimpleNamespace(__cuda_array_interface__=[("shape", (4,))])
    refused(TensorMapError, lambda: array_layout(arr), "the interface must be a dict")


# -- read-only memory ------------------------------------------------------------------------------------------------
def test_the_read_only_flag_is_recorded():
    ro, rw = cai_array(data=(BASE, True)), cai_array(data=(BASE, False))
    assert is_readonly(ro) is True and array_layout(ro).readonly is True
    assert is_readonly(rw) is False and array_layout(rw).readonly is False
    assert is_readonly(cai_array(data=(BASE, np.bool_(True)))) is True
    assert numbatma.is_readonly is is_readonly and "is_readonly" in numbatma.__all__
    # (loads from read-only memory are fine: a descriptor of it is built; plans refuse it as an output)
    assert TensorMap(ro, (8, 16)).shape == (16, 64)


def test_read_only_travels_with_layouts_and_views():
    lay = array_layout(cai_array(data=(BASE, True)))
    assert lay.columns(0, 16).readonly and lay._shifted(256).readonly and is_readonly(lay)
    assert is_readonly(ArrayLayout(BASE, (4,), (4,), np.dtype(np.float32))) is False
    view = DeviceView(array_layout(f32((16, 64))), cai_array(data=(BASE, True)))  # (its owner is read-only)
    assert view.readonly and is_readonly(view) and view.__cuda_array_interface__["data"] == (BASE, True)
    free = DeviceView(array_layout(f32((16, 64))), f32((16, 64)))
    assert not is_readonly(free) and free.__cuda_array_interface__["data"] == (BASE, False)


@pytest.mark.parametrize("obj", [object(), 3.0, np.zeros((4, 4), np.float32)])
def test_is_readonly_refuses_what_is_not_a_cuda_array(obj):
    refused(TensorMapError, lambda: is_readonly(obj), "TensorMap:")


# -- streams ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, words", [
    ("s", ("cannot use 's' (a str) as a CUDA stream",)), (1.5, ("cannot use 1.5 (a float)",)),
    (b"x", ("cannot use b'x' (a bytes)",)), (-1, ("non-negative integer", "got -1")),
    (True, ("not a bool", "got True")), (object(), ("builtins.object", "got <object object")),
])
def test_bad_stream_values_are_named(bad, words):
    refused(TypeError, lambda: streams.as_stream(bad), *words)


def test_good_streams_are_accepted():
    assert streams.as_stream(None) == 0 and streams.as_stream(0) == 0
    assert streams.stream_handle(types.SimpleNamespace(__cuda_stream__=lambda: (0, 0x40))) == 0x40


# -- device ordinals -------------------------------------------------------------------------------------------------
@pytest.fixture
def two_devices(monkeypatch):
    """A process that sees two devices (a stand-in driver: the checks happen before it is asked anything)."""
    monkeypatch.setattr(devices, "driver", lambda: types.SimpleNamespace())
    monkeypatch.setattr(devices, "_COUNT", [2])
    monkeypatch.setattr(devices, "_PEERS", set())


@pytest.mark.parametrize("device, peer, words", [
    (-1, 0, ("device must be a device ordinal (an int >= 0), got -1",)),
    ("0", 1, ("device must be a device ordinal", "got '0'")),
    (0, 1.0, ("peer must be a device ordinal", "got 1.0")),
    (True, 0, ("device must be a device ordinal", "got True")),
    (0, 99, ("peer 99 is not a device of this process", "sees 2 devices", "0..1")),
    (7, 0, ("device 7 is not a device of this process",)),
])
def test_enable_peer_access_names_a_bad_device(two_devices, device, peer, words):
    refused(ValueError, lambda: numbatma.enable_peer_access(device, peer), "enable_peer_access:", *words)
    assert not devices._PEERS


@pytest.mark.parametrize("device, peer, bad", [("0", 0, "'0'"), (0, -1, "-1"), (None, 1, "None")])
def test_peer_access_enabled_names_a_bad_device(device, peer, bad):
    refused(ValueError, lambda: numbatma.peer_access_enabled(device, peer), "peer_access_enabled:",
            "must be a device ordinal", f"got {bad}")


def test_peer_access_enabled_takes_numpy_ordinals():
    assert numbatma.peer_access_enabled(np.int64(1), 1) and not numbatma.peer_access_enabled(0, np.int32(1))


@pytest.mark.parametrize("bad", [-1, "0", 1.5])
def test_enter_device_names_a_bad_device(bad):
    # (cuda.gpus[-1] would silently be the last device)
    refused(ValueError, lambda: devices.enter_device(bad), "enter_device: device must be a device ordinal",
            f"got {bad!r}")


def test_enter_device_names_a_device_that_does_not_exist(two_devices, monkeypatch):
    monkeypatch.setattr(devices, "_DRIVER", types.SimpleNamespace())
    monkeypatch.setattr(devices, "current_device", lambda: 0)
    refused(ValueError, lambda: devices.enter_device(5), "enter_device: device 5 is not a device of this process")
