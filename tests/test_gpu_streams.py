"""GPU tests (marker ``gpu``): numbatma plans launch on every kind of stream (numba, torch, CuPy, cuda.core, a raw
handle), default to torch's current stream for torch tensors (ordered with the torch ops around them, no
synchronisation in between), and are captured into CUDA graphs whose replays see new input data."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from numba import cuda  # noqa: E402

from numbatma.kernels import Attention, Gemm, StreamCopy, stream_copy  # noqa: E402


def fresh(shape=(1000, 1024)):
    return torch.randn(shape, device="cuda"), torch.full(shape, float("nan"), device="cuda")


def _streams():
    s = torch.cuda.Stream()
    kinds = [("torch", s, s), ("raw handle", s.cuda_stream, s), ("numba", cuda.external_stream(s.cuda_stream), s)]
    try:
        from cuda.core import Device

        core = Device().create_stream()
        kinds.append(("cuda.core", core, torch.cuda.ExternalStream(int(core.handle))))
    except Exception:  # noqa: BLE001 - (cuda.core too old for create_stream: skip that kind)
        pass
    try:
        import cupy

        cs = cupy.cuda.Stream(non_blocking=True)
        kinds.append(("cupy", cs, torch.cuda.ExternalStream(cs.ptr)))
    except ImportError:
        pass
    return kinds


@pytest.mark.parametrize("kind", range(5))
def test_every_kind_of_stream(kind):
    kinds = _streams()
    if kind >= len(kinds):
        pytest.skip("that library is not installed")
    name, stream, as_torch = kinds[kind]
    src, dst = fresh()
    torch.cuda.synchronize()
    with torch.cuda.stream(as_torch):
        src.mul_(2.0)  # queued on that stream: the copy below must see it
    StreamCopy(src, dst).launch(stream)
    as_torch.synchronize()
    assert torch.equal(dst, src), name


def test_default_is_torchs_current_stream():
    src, dst = fresh()
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        src.add_(1.0)  # a torch op on s ...
        stream_copy(src, dst)  # ... the copy on s after it, no stream named ...
        out = dst * 3.0  # ... and a torch op on s reading what the copy wrote
    s.synchronize()
    assert torch.equal(out, src * 3.0)


def test_graph_capture_replays_with_new_data():
    src, dst = fresh((512, 1024))
    plan = StreamCopy(src, dst)
    plan.launch()  # compile and prepare outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.launch()  # (torch's capture stream is the current stream)
    for _ in range(3):
        src.copy_(torch.randn_like(src))
        dst.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(dst, src)


def test_graph_capture_of_gemm_and_attention():
    a, b = torch.randn((256, 128), device="cuda").bfloat16(), torch.randn((128, 192), device="cuda").bfloat16()
    c = torch.full((256, 192), float("nan"), device="cuda").bfloat16()
    q, k, v = (torch.randn((1, 2, 200, 64), device="cuda").bfloat16() for _ in range(3))
    o = torch.full_like(q, float("nan"))
    gemm, att = Gemm(a, b, c), Attention(q, k, v, o)
    gemm.launch()
    att.launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm.launch()
        att.launch()
    a.copy_(torch.randn_like(a))
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert (c.float() - (a.float() @ b.float())).abs().max() <= 0.05 * (a.float().abs() @ b.float().abs()).max()
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert (o.float() - ref).abs().max() <= 2 * 2.0 ** -7 * v.float().abs().max()
    assert not np.isnan(c.float().cpu().numpy()).any()


def test_function_forms_cached_plans_same_new_and_first_arrays_again():
    """The plan cache's paths on the GPU with torch tensors: the same tensors (launched as prepared), new tensors of
    the same layout (descriptors re-pointed, the prepared launch patched: views' addresses, a new lse), and the first
    tensors again; every output NaN-poisoned first and checked."""
    from numbatma.kernels import attention, clear_plan_cache, gemm, plan_cache_info, softmax

    clear_plan_cache()
    sets = [fresh((64, 1008)) for _ in range(2)]  # (rows of 1003 of 1008 floats: softmax's output tail is a view)
    mats = [(torch.randn((128, 128), device="cuda").bfloat16(), torch.randn((128, 64), device="cuda").bfloat16(),
             torch.empty((128, 64), device="cuda").bfloat16()) for _ in range(2)]
    qkvo = [tuple(torch.randn((1, 2, 128, 64), device="cuda").bfloat16() for _ in range(4)) for _ in range(2)]
    lses = []
    for i in (0, 0, 1, 0):
        x, y = (t[:, :1003] for t in sets[i])  # (new view objects each call: re-pointed by 0 bytes)
        y.fill_(float("nan"))
        assert softmax(x, y) is y
        a, b, c = mats[i]
        c.fill_(float("nan"))
        gemm(a, b, c)
        q, k, v, o = qkvo[i]
        o.fill_(float("nan"))
        lses.append(attention(q, k, v, o)[1])
        torch.cuda.synchronize()
        assert torch.allclose(y, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
        assert (c.float() - a.float() @ b.float()).abs().max() <= 0.05 * (a.float().abs() @ b.float().abs()).max()
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        assert (o.float() - ref).abs().max() <= 2 * 2.0 ** -7 * v.float().abs().max()
    assert len({id(lse) for lse in lses}) == 4  # (each call its own lse)
    info = plan_cache_info()
    # (a key holds each array's address % 1024: the second set of tensors is a second key of a form - a miss - where
    # torch's allocator placed it at another offset; every other call is a hit)
    keys = sum(len({tuple(t.data_ptr() % 1024 for t in group(i)) for i in (0, 1)}) for group in (
        lambda i: sets[i], lambda i: mats[i], lambda i: qkvo[i]))
    assert (info["hits"], info["misses"], info["rebind_failed"]) == (12 - keys, keys, 0)
    clear_plan_cache()
