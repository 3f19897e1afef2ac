"""GPU tests (marker ``gpu``): every kernel of numbatma.kernels writes its output view inside a
sentinel-filled parent array and not one byte outside it, on every side (tests/exact_store_cases.py).

The hardware rule behind it (re-verified in CUDA C++ on an H100): a TMA tile store writes whole 16-byte units
of each row, so rows whose byte length is not a multiple of 16 must get their last elements by ordinary
stores. Widths below end 1..15 bytes short of a unit, exactly on one, or hold no whole unit at all."""
import pytest

from exact_store_cases import run

pytestmark = pytest.mark.gpu

INT_AND_FLOAT = ["uint8", "int16", "float16", "float32", "int32", "float64", "uint64"]


def cases():
    out = []
    for dtype in INT_AND_FLOAT:
        out.append(dict(kernel="tma_copy", shape=(300, 1003), box=(32, 64), dtype=dtype))
        out.append(dict(kernel="stream_copy", shape=(257, 1001), dtype=dtype))
    for rank, (shape, box) in enumerate([((1001,), (256,)), ((33, 70), (8, 16)), ((5, 9, 37), (2, 4, 16)),
                                         ((3, 4, 5, 30), (2, 2, 2, 8)), ((2, 3, 4, 5, 19), (1, 2, 2, 4, 8))], 1):
        out.append(dict(kernel="tma_copy", shape=shape, box=box, dtype="float32"))
    for swizzle, dtype in [(32, "float32"), (64, "float16"), (128, "uint8"), (128, "float64")]:
        item = {"float32": 4, "float16": 2, "uint8": 1, "float64": 8}[dtype]
        out.append(dict(kernel="tma_copy", shape=(70, 3 * swizzle // item - 1), box=(16, swizzle // item),
                        dtype=dtype, options=dict(swizzle=swizzle)))
    out += [
        dict(kernel="tma_copy", shape=(64, 3), box=(16, 4)),  # no whole 16-byte unit in a row
        dict(kernel="stream_copy", shape=(100001,)),
        dict(kernel="stream_copy", shape=(4099, 2), dtype="float32"),
        dict(kernel="stream_copy", shape=(513, 998), options=dict(stages=1)),
        dict(kernel="stream_copy", shape=(513, 998), options=dict(two_roles=True)),
        dict(kernel="stream_copy", shape=(513, 998), options=dict(evict_first=True)),
        dict(kernel="axpy", shape=(333, 1003)),
        dict(kernel="axpy", shape=(100, 1001), dtype="float64"),
        dict(kernel="axpy", shape=(1000, 3)),
        dict(kernel="transpose", shape=(1003, 517)),
        dict(kernel="transpose", shape=(517, 1003), options=dict(order="src")),
        dict(kernel="transpose", shape=(1001, 999), dtype="float16"),
        dict(kernel="transpose", shape=(999, 1003), dtype="float64"),
        dict(kernel="transpose", shape=(300, 7), dtype="int16"),
        dict(kernel="laplacian5", shape=(300, 1003)),
        dict(kernel="laplacian5", shape=(301, 999), dtype="float64"),
        dict(kernel="laplacian5", shape=(64, 3)),
        dict(kernel="softmax", shape=(333, 1001)),
        dict(kernel="softmax", shape=(100, 1003), dtype="float16"),
        dict(kernel="softmax", shape=(17, 20001), options=dict(mode="chunked")),
        dict(kernel="softmax", shape=(1000, 3)),
        dict(kernel="row_sum", shape=(333, 1001)),
    ]
    return out


def case_id(c):
    return f"{c['kernel']}-{'x'.join(map(str, c['shape']))}-{c.get('dtype', 'float32')}" + (
        "-" + "-".join(f"{k}{v}" for k, v in c.get("options", {}).items()) if c.get("options") else "")


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_output_view_written_exactly(case):
    run(case)


@pytest.mark.parametrize("backend", ["cupy", "torch"])
@pytest.mark.parametrize("case", [
    dict(kernel="stream_copy", shape=(257, 1001)),
    dict(kernel="transpose", shape=(1001, 999), dtype="float16"),
    dict(kernel="softmax", shape=(99, 1003)),
    dict(kernel="laplacian5", shape=(99, 1003)),
], ids=case_id)
def test_other_libraries(case, backend):
    pytest.importorskip(backend)
    run(case, backend)


@pytest.mark.parametrize("case", [
    dict(kernel="softmax", shape=(100, 1003), dtype="bfloat16"),
    dict(kernel="stream_copy", shape=(100, 1003), dtype="bfloat16"),
    dict(kernel="transpose", shape=(100, 1003), dtype="bfloat16"),
], ids=case_id)
def test_bfloat16_through_torch(case):
    pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    run(case, "torch")
