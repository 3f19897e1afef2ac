"""CPU: every plan of numbatma.kernels follows one contract (numbatma.kernels.Plan: kernel, grid, block,
shared_mem, args, output, launch() documented and returning the output), the function forms take ``stream=``,
and no module of kernels/ imports a private (underscore) name of numbatma."""
import ast
import inspect
import pathlib

import numpy as np
import pytest

import numbatma
from numbatma.kernels import (Axpy, Gemm, Laplacian5, Plan, RowSum, Softmax, StreamCopy, TmaCopy, Transpose, _launch,
                              axpy, gemm, laplacian5, row_sum, softmax, stream_copy, transpose)

from fakes import FakeCudaArray

KERNELS = pathlib.Path(__file__).resolve().parents[1] / "kernels"
G = 1 << 34


@pytest.fixture(autouse=True)
def fixed_sm_count(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 132)


def fa(shape, dtype=np.float32, ptr=1 << 20):
    return FakeCudaArray(shape, dtype, ptr=ptr)


PLANS = {
    "TmaCopy": lambda: TmaCopy(fa((100, 1000)), fa((100, 1000), ptr=G)),
    "StreamCopy": lambda: StreamCopy(fa((512, 512)), fa((512, 512), ptr=G)),
    "Axpy": lambda: Axpy(2.0, fa((512, 512)), fa((512, 512), ptr=1 << 30), fa((512, 512), ptr=G)),
    "Transpose": lambda: Transpose(fa((512, 256)), fa((256, 512), ptr=G)),
    "RowSum": lambda: RowSum(fa((1000, 1000)), fa((1000,), ptr=G)),
    "Softmax": lambda: Softmax(fa((1000, 1000)), fa((1000, 1000), ptr=G)),
    "Laplacian5": lambda: Laplacian5(fa((512, 512)), fa((512, 512), ptr=G)),
    "Gemm": lambda: Gemm(fa((256, 128), np.float16), fa((128, 128), np.float16, ptr=1 << 30),
                         fa((256, 128), np.float16, ptr=G)),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_plan_follows_the_contract(name):
    plan = PLANS[name]()
    assert isinstance(plan, Plan)
    assert plan.kernel is not None and hasattr(plan.kernel, "py_func")
    for attr in ("grid", "block", "shared_mem"):
        value = getattr(plan, attr)
        assert isinstance(value, (int, np.integer)) and value >= 0, (attr, value)
    assert plan.grid >= 1 and plan.block % 32 == 0
    assert isinstance(plan.args, tuple) and callable(plan.launch_args)  # (launch_args needs the driver)
    assert plan.output is not None
    doc = inspect.getdoc(type(plan).launch)
    assert doc and "stream" in doc


def test_earlier_attribute_names_still_work():
    s = PLANS["StreamCopy"]()
    assert (s.threads, s.smem) == (s.block, s.shared_mem)
    t = PLANS["Transpose"]()
    assert (t.threads, t.smem) == (t.block, t.shared_mem)
    lap = PLANS["Laplacian5"]()
    assert lap.smem_bytes == lap.shared_mem and lap.grid() == lap.grid  # grid was a method
    r = PLANS["RowSum"]()
    assert r.threads == r.block
    assert PLANS["Gemm"]().threads == 384
    assert PLANS["Axpy"]().smem == PLANS["Axpy"]().shared_mem


@pytest.mark.parametrize("fn", [stream_copy, axpy, transpose, row_sum, softmax, laplacian5, gemm])
def test_function_forms_take_a_stream(fn):
    assert "stream" in (inspect.getdoc(fn) or "") + str(inspect.signature(fn))


def test_rows_module_still_exports_its_names():
    from numbatma.kernels import rows

    assert rows.RowSum is RowSum and rows.Softmax is Softmax and rows.row_sum is row_sum
    assert rows.RowsConfig.__name__ == "RowsConfig"


def _private_numbatma_imports(path):
    """(line, name) of every private numbatma name a module imports or reaches as an attribute."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "numbatma":
            if any(part.startswith("_") for part in node.module.split(".")):
                found.append((node.lineno, node.module))
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.startswith("numbatma") and any(p.startswith("_") for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id == "numbatma":
                found.append((node.lineno, node.attr))
    return found


@pytest.mark.parametrize("path", sorted(KERNELS.glob("*.py")), ids=lambda p: p.name)
def test_kernels_use_only_public_numbatma_names(path):
    assert _private_numbatma_imports(path) == []


def test_the_views_kernels_need_are_public():
    for name in ("ArrayLayout", "DeviceView", "kernel_view", "layout_view", "launch_argument"):
        assert name in numbatma.__all__
        assert getattr(numbatma, name).__doc__
