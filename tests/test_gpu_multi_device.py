"""GPU tests (marker ``gpu``; two GPUs, else skipped): numbatma launches go to the device that holds their arrays.

* every kernel of numbatma.kernels on device 1 while device 0 is current, from torch tensors on ``cuda:1`` and from
  numba arrays made under ``with cuda.gpus[1]:`` (fresh random data, outputs NaN-poisoned, compared with references;
  a second call with other tensors re-points the cached plan); a cluster configuration and > 48 KiB of shared
  memory on both devices; a non-default torch stream of device 1;
* a plan of device 0's arrays launched while device 1 is current runs on device 0;
* a TensorMap of device 0's memory launched on device 1 is refused (numba's own launch, a prepared launch, a plan);
  with ``numbatma.enable_peer_access(1, 0)`` a TMA copy on device 1 reads device 0's memory over NVLink;
* an example (examples/tma_copy.py, which takes no device option) run with device 1 current and under
  ``CUDA_VISIBLE_DEVICES=1``;
* two processes, one per GPU as torch.distributed launches them, running the kernels concurrently
  (tests/multi_device_worker.py).

Every test starts with device 0 current and checks that it still is afterwards (a launch that switched devices
switched back)."""
import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numba import cuda  # noqa: E402

import numbatma  # noqa: E402
from numbatma import TensorMap, TensorMapError, devices  # noqa: E402
from numbatma.intrinsics import (  # noqa: E402
    bulk_commit_group,
    bulk_wait_group,
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load,
    tma_store,
)
from numbatma.kernels import (  # noqa: E402
    StreamCopy,
    TmaCopy,
    attention,
    axpy,
    clear_plan_cache,
    gemm,
    laplacian5,
    plan_cache_info,
    row_sum,
    softmax,
    stream_copy,
    tma_copy,
    transpose,
)

import multi_device_checks as checks  # noqa: E402
import multi_device_worker as worker  # noqa: E402
from attention_reference import attention_reference  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _gpu_count():
    try:
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no driver
        return 0


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpu_count() < 2, reason="needs two GPUs")]
rng = np.random.default_rng()


def _long(test):
    """Subprocesses that compile kernels: over the suite's default per-test limit (pytest-timeout), where it runs."""
    return pytest.mark.timeout(1000)(test) if importlib.util.find_spec("pytest_timeout") else test


@pytest.fixture(scope="module", autouse=True)
def numba_knows_both_devices():
    """numba-cuda's first ``with cuda.gpus[i]:`` in a process replaces the current context while it makes its own object
    for device i's primary context (seen with scripts/probe_context_stack.py: after that first block no context is
    current, whatever was before), so each device is entered once here, before the tests check that they leave device
    0 current."""
    for device in (1, 0):
        with cuda.gpus[device]:
            pass


@pytest.fixture(autouse=True)
def device_0_current():
    torch.cuda.set_device(0)
    torch.empty(1, device="cuda:0")  # (torch initialises lazily: this makes device 0's context current, so that a
    # test's first `with cuda.gpus[1]:` returns to it rather than to no context at all)
    assert devices.current_device() == 0
    clear_plan_cache()
    yield
    assert torch.cuda.current_device() == 0 and devices.current_device() == 0, "a launch left another device current"
    clear_plan_cache()


# -- every kernel on device 1, from torch tensors on cuda:1, while device 0 is current ----------------------------------
@pytest.mark.parametrize("name", sorted(worker.CASES))
def test_every_kernel_on_device_1_from_torch_tensors(name):
    first, second = worker.CASES[name]("cuda:1"), worker.CASES[name]("cuda:1")
    for call, check in (first, second, first):  # (built; re-pointed at other tensors; back)
        call()
        torch.cuda.synchronize(1)
        err, bound = check()
        assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g}"
    if name == "tma_copy":  # (builds its plan every call: no cache)
        return
    info = plan_cache_info()
    # (the second set of tensors may differ from the first in address % 1024, part of the key: then a second miss;
    # the third call, the first tensors again, must hit)
    assert info["misses"] in (1, 2) and info["hits"] == 3 - info["misses"] and info["rebind_failed"] == 0, info
    checks.check_cached_on(1, info["misses"])


def test_numbatma_reads_each_arrays_device():
    x1 = torch.zeros(16, device="cuda:1")
    assert numbatma.array_device(x1) == 1 and numbatma.array_device(torch.zeros(16, device="cuda:0")) == 0
    assert numbatma.array_device(cuda.as_cuda_array(x1)) == 1  # (made while device 0 is current: its owner's)
    with cuda.gpus[1]:
        d = cuda.to_device(np.zeros(16, np.float32))
    assert numbatma.array_device(d) == 1 and numbatma.array_device(d[4:]) == 1
    assert numbatma.array_device(numbatma.DeviceView(numbatma.array_layout(x1), None)) == 1  # (the driver's answer)
    try:
        import cupy
    except ImportError:
        return
    with cupy.cuda.Device(1):
        c = cupy.zeros(16, cupy.float32)
    assert numbatma.array_device(c) == 1


# -- every kernel on device 1, from numba arrays made under `with cuda.gpus[1]` -----------------------------------------
def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _laplacian(a):
    p = np.pad(a.astype(np.float64), 1)
    return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * p[1:-1, 1:-1]


def _numba_case(name):
    """(inputs (NumPy), output shape and dtype, call(device arrays...), reference(inputs), tolerance)."""
    x = rng.standard_normal((300, 1000)).astype(np.float32)
    y = rng.standard_normal((300, 1000)).astype(np.float32)
    f32 = np.float32
    if name == "stream_copy":
        return (x,), (x.shape, f32), lambda a, o: stream_copy(a, o), lambda a: a, 0
    if name == "stream_copy_two_roles":
        return (x,), (x.shape, f32), lambda a, o: StreamCopy(a, o, two_roles=True).launch(), lambda a: a, 0
    if name == "tma_copy":
        return (x,), (x.shape, f32), lambda a, o: tma_copy(a, o), lambda a: a, 0
    if name == "axpy":
        return (x, y), (x.shape, f32), lambda a, b, o: axpy(2.5, a, b, o), lambda a, b: 2.5 * a.astype(float) + b, 1e-5
    if name == "transpose":
        x = x[:, :520].copy()
        return (x,), ((520, 300), f32), lambda a, o: transpose(a, o), lambda a: a.T, 0
    if name == "row_sum":
        return (x,), ((300,), f32), lambda a, o: row_sum(a, o), lambda a: a.astype(float).sum(-1), 1e-3
    if name == "softmax":
        return (x,), (x.shape, f32), lambda a, o: softmax(a, o), lambda a: _softmax(a.astype(float)), 1e-6
    if name == "laplacian5":
        return (x,), (x.shape, f32), lambda a, o: laplacian5(a, o), _laplacian, 1e-4
    if name in ("gemm", "gemm_cluster"):
        m, n, k = (256, 320, 192) if name == "gemm" else (512, 512, 256)
        a = rng.standard_normal((m, k)).astype(np.float16)
        b = rng.standard_normal((k, n)).astype(np.float16)
        options = {} if name == "gemm" else {"cluster_m": 2}
        return ((a, b), ((m, n), f32), lambda a, b, o: gemm(a, b, o, **options),
                lambda a, b: a.astype(float) @ b.astype(float), k * 2.0 ** -18)
    if name == "attention":
        q, k, v = (rng.standard_normal((1, 2, 200, 64)).astype(np.float16) for _ in range(3))
        scale = 1 / 8.0
        return ((q, k, v), (q.shape, np.float16), lambda q, k, v, o: attention(q, k, v, o),
                lambda q, k, v: attention_reference(q, k, v, False, scale)[0], 2 * 2.0 ** -10 * np.abs(v).max())
    raise KeyError(name)


@pytest.mark.parametrize("name", sorted(worker.CASES))
def test_every_kernel_on_device_1_from_numba_arrays(name):
    inputs, (shape, dtype), call, reference, tol = _numba_case(name)
    with cuda.gpus[1]:
        d_in = [cuda.to_device(a) for a in inputs]
        d_out = cuda.to_device(np.full(shape, np.nan, dtype))
        call(*d_in, d_out)
        cuda.synchronize()
        got = d_out.copy_to_host()
    assert all(numbatma.array_device(a) == 1 for a in d_in + [d_out])
    assert not np.isnan(got).any(), f"{name}: {int(np.isnan(got).sum())} outputs never written"
    np.testing.assert_allclose(got.astype(float), reference(*inputs), rtol=0, atol=tol)


def test_clusters_and_large_shared_memory_on_both_devices():
    """The same cluster Gemm kernel on device 0 and on device 1: its > 48 KiB shared-memory limit is raised on each
    device (numba loads the kernel once per device)."""
    for dev in ("cuda:0", "cuda:1"):
        call, check = worker.case_gemm(dev, m=512, n=512, k=256, cluster_m=2)
        call()
        torch.cuda.synchronize(dev)
        err, bound = check()
        assert err <= bound, f"{dev}: {err:.3g} > {bound:.3g}"
    plans = checks.plans_by_device()
    assert [p.device for p in plans] == [0, 1] and plans[0].kernel is plans[1].kernel
    assert plans[0].shared_mem > 48 * 1024 and plans[0].config.cluster_m == 2
    checks.check_shared_memory_granted(plans[0], {0, 1})


def test_a_non_default_stream_of_device_1():
    src, dst = torch.randn(1000, 1024, device="cuda:1"), torch.full((1000, 1024), float("nan"), device="cuda:1")
    s = torch.cuda.Stream(device=1)
    torch.cuda.synchronize(1)
    with torch.cuda.stream(s):
        src.mul_(2.0)  # (queued on s: the copies below must see it)
    StreamCopy(src, dst).launch(s)
    s.synchronize()
    assert torch.equal(dst, src)
    dst.fill_(float("nan"))
    stream_copy(src, dst, stream=s)
    s.synchronize()
    assert torch.equal(dst, src)
    with torch.cuda.stream(s):  # (no stream named: torch's current stream of device 1, which is s here)
        src.add_(1.0)
        stream_copy(src, dst)
        out = dst * 3.0
    s.synchronize()
    torch.cuda.set_device(0)
    assert torch.equal(out, src * 3.0)
    with pytest.raises(ValueError, match="the stream belongs to device 0 but the plan runs on device 1"):
        StreamCopy(src, dst).launch(torch.cuda.Stream(device=0))


def test_a_plan_of_device_0_launched_while_device_1_is_current_runs_on_device_0():
    src, dst = torch.randn(1000, 1024, device="cuda:0"), torch.full((1000, 1024), float("nan"), device="cuda:0")
    plan = StreamCopy(src, dst)
    with torch.cuda.device(1):  # (prepared there too: on its own device)
        plan.launch()
        assert torch.cuda.current_device() == 1
    torch.cuda.synchronize(0)
    assert torch.equal(dst, src)
    checks.check_runs_on(plan, 0)
    for enter in (lambda: torch.cuda.device(1), lambda: cuda.gpus[1]):
        dst.fill_(float("nan"))
        src.copy_(torch.randn_like(src))
        torch.cuda.synchronize(0)
        with enter():
            plan.launch()
            assert devices.current_device() == 1
        torch.cuda.synchronize(0)
        assert torch.equal(dst, src)
    with torch.cuda.device(1):  # (the function form: the same)
        dst.fill_(float("nan"))
        stream_copy(src, dst)
    torch.cuda.synchronize(0)
    assert torch.equal(dst, src)


# -- descriptors of another device ------------------------------------------------------------------------------------------
BM, BN = 64, 32


@cuda.jit
def tile_copy(src, dst):
    tile = cuda.shared.array((BM, BN), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    row, col = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (row, col), bar)
        mbarrier_wait_parity(bar, 0)
        tma_store(dst, (row, col), tile)
        bulk_commit_group()
        bulk_wait_group(0)


def _maps(rows=300, cols=1000):
    src0 = torch.randn(rows, cols, device="cuda:0")
    dst1 = torch.full((rows, cols), float("nan"), device="cuda:1")
    grid = (-(-cols // BN), -(-rows // BM))
    return src0, dst1, TensorMap(src0, (BM, BN)), TensorMap(dst1, (BM, BN)), grid


def test_a_tensormap_of_device_0_launched_on_device_1_is_refused(monkeypatch):
    monkeypatch.setattr(devices, "_PEERS", set())  # (whatever an earlier test enabled: not for numbatma here)
    src0, dst1, src_map, dst_map, grid = _maps()
    with cuda.gpus[1]:
        with pytest.raises(TensorMapError, match="this TensorMap describes memory of device 0, but the kernel "
                                                 "launches on device 1"):
            tile_copy[grid, 32](src_map, dst_map)
        with pytest.raises(TensorMapError, match="describes memory of device 0, but the prepared launch runs on "
                                                 "device 1.*enable_peer_access\\(1, 0\\)"):
            numbatma.prepare_launch(tile_copy, (src_map, dst_map), grid, 32)
    assert numbatma.array_device(src_map) == 0 and numbatma.array_device(dst_map) == 1
    with pytest.raises(TensorMapError, match=r"the arrays are on different devices \(argument 0 on device 0, "
                                             r"argument 1 on device 1\)"):
        StreamCopy(src0, dst1)
    with pytest.raises(TensorMapError, match="different devices"):
        stream_copy(src0, dst1)
    with pytest.raises(TensorMapError, match="TensorMap.repoint: the new array is on device 1"):
        src_map.repoint(torch.randn(300, 1000, device="cuda:1"))


def _peer_or_skip():
    if not torch.cuda.can_device_access_peer(1, 0):
        pytest.skip("device 1 cannot access device 0's memory (no peer path)")
    numbatma.enable_peer_access(1, 0)
    assert numbatma.peer_access_enabled(1, 0)


def test_with_peer_access_tma_on_device_1_reads_device_0s_memory():
    _peer_or_skip()
    src0, dst1, src_map, dst_map, grid = _maps()
    with cuda.gpus[1]:
        run = numbatma.prepare_launch(tile_copy, (src_map, dst_map), grid, 32)
        run()
        cuda.synchronize()
        with pytest.raises(TensorMapError, match="launch through numbatma.prepare_launch"):
            tile_copy[grid, 32](src_map, dst_map)  # (numba's own launch: cuda.core's descriptor is device 0's)
    assert torch.equal(dst1, src0.to("cuda:1"))
    with torch.cuda.device(1):  # (plans: the arrays of two devices, the plan device 1's)
        for make in (lambda s, d: StreamCopy(s, d), lambda s, d: TmaCopy(s, d)):
            dst1.fill_(float("nan"))
            plan = make(src0, dst1)
            assert plan.device == 1
            plan.launch()
            torch.cuda.synchronize(1)
            assert torch.equal(dst1, src0.to("cuda:1"))
        dst1.fill_(float("nan"))
        stream_copy(src0, dst1)  # (the function form: keyed by both devices and the current one)
        torch.cuda.synchronize(1)
    assert torch.equal(dst1, src0.to("cuda:1"))


# -- an example, run on device 1 -----------------------------------------------------------------------------------------
EXAMPLE = ROOT / "examples" / "tma_copy.py"
ON_DEVICE_1 = ("from numba import cuda; import runpy, sys; cuda.gpus[1].__enter__(); "
               f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')")


@_long
@pytest.mark.parametrize("how", ["cuda.gpus[1]", "CUDA_VISIBLE_DEVICES=1"])
def test_an_example_on_device_1(how):
    """examples/tma_copy.py takes no device option: run with device 1 current (numba's ``cuda.gpus[1]``, in a
    process that sees both GPUs) and alone in a process that sees only GPU 1."""
    env = dict(os.environ)
    if how == "cuda.gpus[1]":
        command = [sys.executable, "-c", ON_DEVICE_1]
    else:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[1] if visible else "1"
        command = [sys.executable, str(EXAMPLE)]
    done = subprocess.run(command, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "OK, matches NumPy" in done.stdout and "simulator" not in done.stdout, (
        done.stdout + done.stderr)


# -- two processes, one GPU each ---------------------------------------------------------------------------------------
@_long
@pytest.mark.parametrize("mode", ["CUDA_VISIBLE_DEVICES", "set_device"])
def test_two_processes_one_gpu_each_run_concurrently(tmp_path, mode):
    """As torch.distributed launches them: each process sees its own GPU (``CUDA_VISIBLE_DEVICES=rank``), or sees
    both and makes its own current (``torch.cuda.set_device(rank)``). Both run every kernel in a loop at the same
    time (they wait for each other after their first calls) and check every result."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    procs = []
    for rank in (0, 1):
        env = dict(os.environ)
        command = [sys.executable, str(pathlib.Path(worker.__file__).resolve()), "--rank", str(rank), "--world", "2",
                   "--rendezvous", str(tmp_path), "--iterations", "10"]
        if mode == "set_device":
            command.append("--set-device")
        else:
            env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[rank] if visible else str(rank)
        procs.append(subprocess.Popen(command, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=900)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and out.rstrip().endswith("ok"), f"rank {rank} ({mode}):\n{out[-6000:]}"
