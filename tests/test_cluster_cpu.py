"""CPU tests of thread-block clusters: every cluster intrinsic compiles to its PTX and links for each target
(all of them have clusters); the SASS has the cluster barrier and the remote arrive; typing errors; the host
side (``with_cluster`` argument checks, the launch attribute hook, the compile-time shape annotation); the GPU
test kernels compile offline."""
import re

import numpy as np
import pytest
from numba import cuda, types

import numbatma
from numbatma import _launch_hooks
from numbatma import _numba_internals as internals
from numbatma import compile as nbc
from numbatma.cluster import (
    ClusterLaunchBounds,
    cluster_kernel,
    cluster_launch_bounds,
    cluster_shape,
    with_cluster,
)
from numbatma.intrinsics import (
    all_ptx,
    barrier_cluster_arrive,
    barrier_cluster_arrive_relaxed,
    barrier_cluster_wait,
    cluster,
    cluster_ctaid,
    cluster_ctarank,
    cluster_nctaid,
    cluster_nctarank,
    cluster_sync,
    clusterid,
    fence_acq_rel_cluster,
    ld_cluster_f32,
    ld_cluster_u32,
    mapa_barrier,
    mapa_shared,
    mbarrier_arrive_cluster,
    mbarrier_arrive_cluster_cta,
    mbarrier_init,
    mbarrier_ref,
    mbarrier_wait_parity_cluster,
    nclusterid,
    st_cluster_f32,
    st_cluster_u32,
)
from numbatma.intrinsics._asm import TARGETS

import cluster_kernels as K


def every_cluster_op(out, fout):
    buf = cuda.shared.array(8, np.uint32)
    fbuf = cuda.shared.array(8, np.float32)
    bars = cuda.shared.array(2, np.uint64)
    r = cluster_ctarank()
    n = cluster_nctarank()
    cx, cy, cz = cluster_ctaid()
    nx, ny, nz = cluster_nctaid()
    ix, iy, iz = clusterid()
    mx, my, mz = nclusterid()
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 1)
    barrier_cluster_arrive_relaxed()
    barrier_cluster_wait()
    peer = (r + 1) % n
    st_cluster_u32(mapa_shared(buf, peer) + 4, r)
    st_cluster_f32(mapa_shared(fbuf, peer), 1.5)
    mbarrier_arrive_cluster(mapa_barrier(mbarrier_ref(bars, 0), peer))
    mbarrier_arrive_cluster_cta(mapa_barrier(mbarrier_ref(bars, 1), peer))
    fence_acq_rel_cluster()
    barrier_cluster_arrive()
    barrier_cluster_wait()
    mbarrier_wait_parity_cluster(bars, 0)
    out[0] = ld_cluster_u32(mapa_shared(buf, r)) + cx + cy + cz + nx + ny + nz + ix + iy + iz + mx + my + mz
    out[1] = mapa_barrier(bars, r)
    fout[0] = ld_cluster_f32(mapa_shared(fbuf, r))
    cluster_sync()


SIG = (types.uint32[::1], types.float32[::1])


@pytest.fixture(scope="module", params=TARGETS)
def compiled(request):
    ptx = nbc.compile_ptx(every_cluster_op, SIG, arch=request.param)
    return request.param, ptx, nbc.link_cubin(ptx, request.param)


def _ptx_regex(text):
    body = re.sub(r"\$\w+", "\x00", text)
    return r"[^;\n]*?".join(re.escape(p) for p in body.split("\x00")).replace(r"\ ", r"\s+")


@pytest.mark.parametrize("name", sorted(cluster.PTX))
def test_every_cluster_instruction_in_ptx(compiled, name):
    arch, ptx, _ = compiled
    assert re.search(_ptx_regex(cluster.PTX[name].text), ptx), f"{name}: {cluster.PTX[name].text!r} not in {arch}"


def test_links_for_every_target(compiled):
    arch, ptx, cubin = compiled
    assert f".target {arch}" in ptx
    assert cubin[:4] == b"\x7fELF"


def test_every_target_has_clusters():
    # sm_90a, sm_100a and sm_120a all link every cluster instruction (tests/test_target_matrix.py checks each one
    # on its own), so none is restricted and none raises UnsupportedTarget.
    assert all(p.targets is None for p in cluster.PTX.values())
    assert set(cluster.PTX) <= set(all_ptx())
    assert len(cluster.__all__) == 20
    for name in cluster.__all__:
        assert getattr(numbatma.intrinsics, name) is getattr(cluster, name)
        assert getattr(cluster, name).__doc__, name


def test_sass_has_cluster_barrier_and_remote_arrive():
    cubin = nbc.link_cubin(nbc.compile_ptx(every_cluster_op, SIG, arch="sm_90a"), "sm_90a")
    sass = nbc.sass(cubin)
    assert "UCGABAR_ARV" in sass and "UCGABAR_WAIT" in sass
    assert re.search(r"SYNCS\.ARRIVE\.TRANS64\.RED", sass)  # the remote mbarrier arrive
    assert "SR_CgaCtaId" in sass  # mapa / the cluster special registers


def _arrive_remote_cluster(out):
    bars = cuda.shared.array(1, np.uint64)
    mbarrier_arrive_cluster(mapa_barrier(bars, cluster_ctarank() ^ 1))


def _arrive_remote_cta(out):
    bars = cuda.shared.array(1, np.uint64)
    mbarrier_arrive_cluster_cta(mapa_barrier(bars, cluster_ctarank() ^ 1))


def test_remote_arrive_at_cta_scope_has_no_gpu_membar():
    """``mbarrier_arrive_cluster`` (release at cluster scope) costs ptxas a ``MEMBAR.ALL.GPU`` before the remote
    arrive; ``mbarrier_arrive_cluster_cta`` (CTA scope: a stage handed back after reading it, as
    ``Pipeline.consumer_release_remote`` does) has none - per stage in a multicast pipeline that was 38% of an
    attention kernel's time on an H100."""
    sass = {f.__name__: nbc.sass(nbc.link_cubin(nbc.compile_ptx(f, (types.uint32[::1],), arch="sm_90a"), "sm_90a"))
            for f in (_arrive_remote_cluster, _arrive_remote_cta)}
    for text in sass.values():
        assert re.search(r"SYNCS\.ARRIVE\.TRANS64\.RED", text)
    assert "MEMBAR.ALL.GPU" in sass["_arrive_remote_cluster"]
    assert "MEMBAR" not in sass["_arrive_remote_cta"]


# -- typing errors -------------------------------------------------------------------------------------------------
def _typing_error(fn, sig, match):
    with pytest.raises(Exception, match=match):
        nbc.compile_ptx(fn, sig, arch="sm_90a")


def test_mapa_shared_needs_a_shared_array():
    def k(a, out):
        out[0] = mapa_shared(a, 0)

    _typing_error(k, (types.uint32[::1], types.uint32[::1]), r"mapa_shared: the array must be a shared-memory array")


def test_mapa_rank_must_be_an_integer():
    def k(out):
        buf = cuda.shared.array(4, np.uint32)
        out[0] = mapa_shared(buf, 1.5)

    _typing_error(k, (types.uint32[::1],), r"mapa_shared: the CTA rank must be an integer")


def test_mapa_barrier_needs_a_barrier():
    def k(out):
        buf = cuda.shared.array(4, np.uint32)
        out[0] = mapa_barrier(buf, 0)

    _typing_error(k, (types.uint32[::1],), r"mapa_barrier: the mbarrier operand must be a shared uint64 array")


def test_remote_arrive_needs_a_translated_address():
    def k(out):
        bar = cuda.shared.array(1, np.uint64)
        mbarrier_arrive_cluster(bar)

    _typing_error(k, (types.uint32[::1],), r"mbarrier_arrive_cluster: the barrier address must be a shared::cluster "
                                           r"address .*mapa_barrier\(bar, rank\)")


def test_cluster_store_needs_a_number():
    def k(out):
        buf = cuda.shared.array(4, np.uint32)
        st_cluster_u32(mapa_shared(buf, 0), out)

    _typing_error(k, (types.uint32[::1],), r"st_cluster_u32: the value must be a number")


# -- host side: shapes and grids ---------------------------------------------------------------------------------------
def test_cluster_shape_normalises_and_checks():
    assert cluster_shape(2) == (2, 1, 1)
    assert cluster_shape((2, 2)) == (2, 2, 1)
    assert cluster_shape([1, 2, 4]) == (1, 2, 4)
    with pytest.raises(ValueError, match="at least 1"):
        cluster_shape((0, 1, 1))
    with pytest.raises(ValueError, match=r"holds 9 CTAs; the portable maximum is 8"):
        cluster_shape((3, 3))
    with pytest.raises(ValueError, match=r"holds 16 CTAs"):
        cluster_shape(16)
    with pytest.raises(TypeError, match="must hold ints"):
        cluster_shape((2.0, 1))
    with pytest.raises(TypeError, match="tuple of 1 to 3 ints"):
        cluster_shape((1, 1, 1, 1))
    with pytest.raises(TypeError, match="tuple of 1 to 3 ints"):
        cluster_shape(True)


def test_with_cluster_checks_grid_before_launch():
    kernel = cuda.jit(K.k_ids)
    with pytest.raises(ValueError, match=r"grid \(3, 1, 1\) \(in blocks\) is not a whole number of clusters of "
                                         r"shape \(2, 1, 1\): along x"):
        with_cluster(kernel, (2, 1, 1))[3, 32]
    with pytest.raises(ValueError, match=r"along y, z"):
        with_cluster(kernel, (1, 2, 2))[(4, 3, 3), 32]
    with pytest.raises(ValueError, match=r"\[grid, block\]"):
        with_cluster(kernel, 2)[4]
    assert callable(with_cluster(kernel, (2, 2, 1))[(4, 2), 32])
    assert callable(with_cluster(kernel, 2)[(4, 2), 32, 0, 1024])


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        return kwargs


def test_launch_config_hook_adds_the_cluster_and_counts_the_grid_in_clusters():
    rec = _Recorder()
    config = internals._clustered_launch_config(rec)
    plain = dict(grid=(8, 4, 2), block=(32, 1, 1), shmem_size=0, is_cooperative=False)
    assert config(**plain) == plain  # outside with_cluster: untouched
    with internals.cluster_launch((2, 2, 1)):
        got = config(**plain)
        assert config(**plain) == plain  # one launch per cluster_launch block
    assert got == dict(plain, grid=(4, 2, 2), cluster=(2, 2, 1))
    with internals.cluster_launch(None):
        assert config(**plain) == plain


def test_with_cluster_launch_reaches_the_launch_config(monkeypatch):
    """with_cluster -> the configured launch -> (numba-cuda's _Kernel.launch) -> dispatcher.LaunchConfig."""
    from numba.cuda import dispatcher

    rec = _Recorder()
    monkeypatch.setattr(dispatcher, "LaunchConfig", internals._clustered_launch_config(rec))
    monkeypatch.setattr(numbatma.cluster, "_require_cluster_device", lambda: None)

    class FakeKernel:
        def __getitem__(self, config):
            grid, block = config[:2]

            def call(*args):
                dispatcher.LaunchConfig(grid=grid, block=(block, 1, 1), shmem_size=config[3], is_cooperative=False)

            return call

    with_cluster(FakeKernel(), (4, 2))[(8, 4, 1), 64, 0, 96 * 1024]()
    assert rec.calls == [dict(grid=(2, 2, 1), block=(64, 1, 1), shmem_size=96 * 1024, is_cooperative=False,
                              cluster=(4, 2, 1))]
    assert getattr(_launch_hooks._cluster, "dims", None) is None


def test_launch_config_hook_is_installed():
    from cuda.core import LaunchConfig
    from numba.cuda import dispatcher

    assert dispatcher.LaunchConfig.__module__ == "numbatma._launch_hooks"
    assert dispatcher.LaunchConfig._numbatma_original is LaunchConfig


# -- compile-time shape ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", TARGETS)
def test_compile_time_shape_becomes_reqnctapercluster(arch):
    ptx = nbc.compile_ptx(K.k_ids, (types.uint32[:, ::1],), arch=arch,
                          launch_bounds=cluster_launch_bounds((2, 2), 256))
    assert re.search(r"\.reqnctapercluster\s+2,\s*2,\s*1", ptx)
    assert ".explicitcluster" in ptx
    assert re.search(r"\.maxntid\s+256", ptx)  # the ordinary launch bounds are kept
    assert nbc.link_cubin(ptx, arch)[:4] == b"\x7fELF"
    plain = nbc.compile_ptx(K.k_ids, (types.uint32[:, ::1],), arch=arch)
    assert ".reqnctapercluster" not in plain


def test_cluster_kernel_decorator():
    kernel = cluster_kernel((2, 1))(cuda.jit(launch_bounds=128)(K.k_ids))
    bounds = kernel.targetoptions["launch_bounds"]
    assert isinstance(bounds, ClusterLaunchBounds) and bounds.cluster_dims == (2, 1, 1) and tuple(bounds) == (128,)
    assert cluster_kernel(2)(kernel) is kernel  # the same shape again is fine
    with pytest.raises(ValueError, match=r"already has the cluster shape \(2, 1, 1\)"):
        cluster_kernel(4)(kernel)
    with pytest.raises(ValueError, match=r"compiled for clusters of shape \(2, 1, 1\)"):
        with_cluster(kernel, (4, 1, 1))
    with pytest.raises(ValueError, match="not a whole number of clusters"):
        with_cluster(kernel, 2)[3, 32]
    with pytest.raises(TypeError, match="not a device function"):
        cluster_kernel(2)(cuda.jit(device=True)(K.k_ids))
    with pytest.raises(TypeError, match="decorates a @cuda.jit kernel"):
        cluster_kernel(2)(K.k_ids)
    import pickle

    assert pickle.loads(pickle.dumps(bounds)).cluster_dims == (2, 1, 1)


def test_cluster_kernel_after_compilation_is_refused():
    import types as pytypes

    kernel = cuda.jit(K.k_ids)
    key = (types.uint32[:, ::1],)
    kernel.overloads[key] = pytypes.SimpleNamespace(entry_point=None)  # (what compiling leaves; no GPU here)
    try:
        with pytest.raises(ValueError, match="before the kernel is compiled"):
            cluster_kernel(2)(kernel)
    finally:
        del kernel.overloads[key]


def test_compiled_shape_grid_check_on_launch():
    class FakeKernel:
        launch_bounds = cluster_launch_bounds((2, 2))

    internals._check_compiled_cluster_grid(FakeKernel(), (4, 2, 1))
    with pytest.raises(ValueError, match=r"grid \(4, 3, 1\).*along y"):
        internals._check_compiled_cluster_grid(FakeKernel(), (4, 3, 1))
    internals._check_compiled_cluster_grid(object(), (3, 3, 3))  # no compile-time shape: nothing to check


# -- the GPU test kernels (tests/cluster_kernels.py) compile ----------------------------------------------------------
@pytest.mark.parametrize("name", sorted(K.KERNEL_SIGNATURES))
def test_gpu_kernels_compile_for_sm_90a(name):
    fn, sig = K.KERNEL_SIGNATURES[name]
    ptx = nbc.compile_ptx(fn, sig, arch="sm_90a")
    assert nbc.link_cubin(ptx, "sm_90a")[:4] == b"\x7fELF"


def test_with_cluster_is_exported_from_numbatma():
    assert numbatma.with_cluster is with_cluster, (
        "numbatma/__init__.py should have: from .cluster import cluster_kernel, cluster_launch_bounds, with_cluster")
    assert numbatma.cluster_kernel is cluster_kernel
