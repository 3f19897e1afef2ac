"""GPU tests (marker ``gpu``): the plan rules of issue 22 on the hardware (their CPU side: tests/test_plan_rules_cpu.py).

* overlapping arguments that a kernel cannot handle are refused before anything is launched (the output's memory,
  poisoned first, is unchanged afterwards);
* the exact aliasings a kernel declares (``stream_copy(a, a)``, ``axpy(..., out=y)`` and ``out=x``, softmax in place,
  narrow and wide rows) give the right answer against float64 references, with sentinels around the views;
* ``Gemm``'s ``beta`` keeps its zero-ness: a non-zero beta may change and is honoured, a change to or from zero is
  refused; ``alpha`` may change;
* empty arrays through every function form launch nothing and return the output.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numbatma.kernels import (  # noqa: E402
    Axpy,
    Gemm,
    axpy,
    gemm,
    laplacian5,
    row_sum,
    softmax,
    stream_copy,
    transpose,
)

pytestmark = pytest.mark.gpu
SENTINEL = -7.25


def framed(rows, cols, dtype=torch.float32, fill=float("nan")):
    """(parent, view): a ``rows x cols`` view in the middle of a parent filled with SENTINEL, the view poisoned with
    ``fill``; the view's rows are padded (a row stride of at least cols + 16 elements, a multiple of 16 bytes)."""
    parent = torch.full((rows + 2, cols + 16 + (-cols) % 4), SENTINEL, dtype=dtype, device="cuda")
    view = parent[1:-1, 8:8 + cols]
    view.fill_(fill)
    return parent, view


def assert_frame_intact(parent, rows, cols):
    mask = torch.ones_like(parent, dtype=torch.bool)
    mask[1:-1, 8:8 + cols] = False
    outside = parent[mask]
    assert torch.all(outside == SENTINEL), f"{int((outside != SENTINEL).sum())} elements outside the view written"


# -- refused overlaps: nothing is launched -------------------------------------------------------------------------
def test_overlapping_arguments_are_refused_before_any_launch():
    a = torch.randn(256, 256, device="cuda")
    before = a.clone()
    with pytest.raises(ValueError, match="overlap"):
        transpose(a, a)
    x = torch.randn(4096, device="cuda")
    kept = x.clone()
    with pytest.raises(ValueError, match="overlap"):
        stream_copy(x[:-64], x[64:])  # (partial overlap: a copy shifted within one array)
    with pytest.raises(ValueError, match="overlap"):
        axpy(2.0, x[:-64], torch.randn(4032, device="cuda"), x[64:])
    m = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
    mk = m.clone()
    with pytest.raises(ValueError, match="overlap"):
        gemm(m, torch.randn(128, 128, device="cuda", dtype=torch.bfloat16), m)  # (C is A)
    torch.cuda.synchronize()
    assert torch.equal(a, before) and torch.equal(x, kept) and torch.equal(m, mk)


# -- declared exact aliases: right results in place ----------------------------------------------------------------
@pytest.mark.parametrize("rows,cols", [(300, 1000), (7, 4099)])
def test_stream_copy_onto_itself_changes_nothing(rows, cols):
    parent, view = framed(rows, cols, fill=0.0)
    data = torch.randn(rows, cols, device="cuda")
    view.copy_(data)
    stream_copy(view, view)
    torch.cuda.synchronize()
    assert torch.equal(view, data)
    assert_frame_intact(parent, rows, cols)


@pytest.mark.parametrize("onto", ["x", "y"])
@pytest.mark.parametrize("rows,cols", [(300, 1000), (33, 257)])
def test_axpy_in_place(onto, rows, cols):
    parent, view = framed(rows, cols, fill=0.0)
    x64 = np.random.default_rng().standard_normal((rows, cols))
    y64 = np.random.default_rng().standard_normal((rows, cols))
    other = framed(rows, cols)[1]  # (rows padded to 16 bytes, as TMA needs: a (33, 257) tensor's are not)
    other.copy_(torch.tensor(y64 if onto == "x" else x64, dtype=torch.float32))
    view.copy_(torch.tensor(x64 if onto == "x" else y64, dtype=torch.float32))
    x, y = (view, other) if onto == "x" else (other, view)
    xs, ys = x.double().cpu().numpy(), y.double().cpu().numpy()
    axpy(-1.5, x, y, view)
    torch.cuda.synchronize()
    np.testing.assert_allclose(view.double().cpu().numpy(), -1.5 * xs + ys, rtol=1e-6, atol=1e-6)
    assert_frame_intact(parent, rows, cols)


@pytest.mark.parametrize("rows,cols", [(513, 1000), (9, 70000), (64, 8)])
def test_softmax_in_place(rows, cols):
    parent, view = framed(rows, cols, fill=0.0)
    data = torch.randn(rows, cols, device="cuda") * 4
    view.copy_(data)
    want = torch.softmax(data.double(), -1)
    softmax(view, view)
    torch.cuda.synchronize()
    torch.testing.assert_close(view.double(), want, rtol=1e-5, atol=1e-7)
    assert_frame_intact(parent, rows, cols)


def test_axpy_plan_reads_a_changed_scalar_at_the_next_launch():
    x, y = torch.randn(1000, 512, device="cuda"), torch.randn(1000, 512, device="cuda")
    out = torch.full_like(x, float("nan"))
    plan = Axpy(2.0, x, y, out)
    plan.launch()
    plan.a = -3.0
    plan.launch()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.double(), -3.0 * x.double() + y.double(), rtol=1e-6, atol=1e-6)


# -- Gemm's beta ------------------------------------------------------------------------------------------------------
def _gemm_ref(a, b, c, alpha, beta):
    return alpha * (a.double() @ b.double()) + beta * c.double()


def test_gemm_beta_keeps_its_zero_ness_and_a_new_value_is_honoured():
    m, n, k = 384, 320, 256
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c0 = torch.randn(m, n, device="cuda")
    c = c0.clone()
    plan = Gemm(a, b, c, alpha=1.0, beta=1.0)
    plan.beta = 2.0
    plan.alpha = 0.5
    plan.launch()
    torch.cuda.synchronize()
    tol = k * 2.0 ** -8
    assert (c.double() - _gemm_ref(a, b, c0, 0.5, 2.0)).abs().max().item() < tol
    with pytest.raises(ValueError, match="beta"):
        plan.beta = 0.0  # (would still read C: a NaN there would propagate)
    c.fill_(float("nan"))  # (beta = 0 never reads C: NaN in C must not reach the result)
    zero = Gemm(a, b, c, beta=0.0)
    zero.launch()
    torch.cuda.synchronize()
    assert (c.double() - _gemm_ref(a, b, c0, 1.0, 0.0)).abs().max().item() < tol
    with pytest.raises(ValueError, match="beta"):
        zero.beta = 1.0  # (its kernel never reads C: the C term would be missing)


# -- empty arrays -----------------------------------------------------------------------------------------------------
def test_empty_arrays_through_every_function_form():
    e = torch.empty(0, 64, device="cuda")
    assert stream_copy(e, torch.empty_like(e)).shape == (0, 64)
    assert axpy(2.0, e, e.clone(), torch.empty_like(e)).shape == (0, 64)
    assert transpose(e, torch.empty(64, 0, device="cuda")).shape == (64, 0)
    assert row_sum(e, torch.empty(0, device="cuda")).shape == (0,)
    assert softmax(e, torch.empty_like(e)).shape == (0, 64)
    assert laplacian5(e, torch.empty_like(e)).shape == (0, 64)
    z = torch.empty(0, 128, device="cuda", dtype=torch.bfloat16)
    assert gemm(z, torch.randn(128, 64, device="cuda", dtype=torch.bfloat16),
                torch.empty(0, 64, device="cuda")).shape == (0, 64)
    torch.cuda.synchronize()
