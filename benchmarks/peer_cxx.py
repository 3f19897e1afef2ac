"""CUDA C++ peer of numbatma's StreamCopy: the same persistent TMA streaming copy, written in CUDA C++ with
inline PTX and compiled at run time with NVRTC through ``cupy.RawModule``.

Algorithm (one warp per CTA, lane 0 issues everything; persistent grid of ``ctas_per_sm`` CTAs per SM):
  * CTA ``b`` of ``G`` copies tiles ``b, b+G, b+2G, ...`` of a 2-D array (tiles numbered row-major).
  * A ring of ``stages`` tiles in dynamic shared memory, one mbarrier per stage (``mbarrier.init`` count 1,
    ``fence.mbarrier_init``). A load is ``mbarrier.arrive.expect_tx`` + ``cp.async.bulk.tensor.2d.shared::cluster.
    global.tile.mbarrier::complete_tx::bytes``; the tile is consumed after ``mbarrier.try_wait.parity`` (parity
    = use count of the stage mod 2).
  * Prologue: fill every stage. Iteration ``i``: wait for tile ``i``, store it with ``cp.async.bulk.tensor.2d.
    global.shared::cta.tile.bulk_group`` + ``commit_group``, then refill the stage of tile ``i-1`` (``i`` when
    stages == 1) with tile ``i-1+stages`` once ``cp.async.bulk.wait_group.read 1`` (``0``) says the store of
    that stage has finished reading shared memory. ``cp.async.bulk.wait_group 0`` before exit.

Descriptors: 128 bytes from ``numbatma.TensorMap(array, box).to_bytes()``. By default they reach the kernel
BY VALUE as ``const __grid_constant__`` parameters: CuPy passes a NumPy array of size one by value, copying
``sizeof(param)`` bytes from its data pointer (CuPy "Custom user types" docs, cupy PR #4829), so a structured
dtype of 128 bytes matches ``struct TmaDesc { unsigned long long v[16]; }``. ``desc_mode="gmem"`` is the
fallback: both descriptors in a CuPy device array, passed by pointer, with
``fence.proxy.tensormap::generic.acquire.gpu`` before first use.

Arch: ``-arch=sm_90a`` on a CC 9.0 device, else (or if NVRTC rejects the duplicate of CuPy's own
``-arch=sm_<cc>``, cupy issue #3292) the device's ``sm_XX`` that CuPy picks. Everything used here is plain
sm_90 PTX (no wgmma / setmaxnreg), so the code is the same either way.

Run as a script for a self-test (correctness on ragged shapes, both descriptor modes, a 1 GiB bandwidth
figure): ``python benchmarks/peer_cxx.py [--mib 1024]``. Needs CuPy and numbatma (and a Hopper+ GPU).
"""
from __future__ import annotations

import argparse
import importlib
import sys

# Mirrors numbatma's StreamCopy defaults (kernels/stream.py: stages=4, tile_bytes=32768, ctas_per_sm=1, tile =
# rows of at most 256 elements (16-byte multiple) and enough rows for tile_bytes, slots padded to 128 bytes,
# no L2 promotion); bandwidth.py also copies stages/tile from the numbatma plan it compares against.
DEFAULT_STAGES = 4
DEFAULT_TILE_BYTES = 32 * 1024
DEFAULT_CTAS_PER_SM = 1
MAX_BOX = 256
MAX_DYNAMIC_SMEM = 227 * 1024  # per block on sm_90 (232448 bytes)
WARP = 32

CUDA_SOURCE = r"""
// 128-byte TMA descriptor (same size/alignment as CUtensorMap in cuda.h; no headers needed under NVRTC).
struct __align__(64) TmaDesc { unsigned long long v[16]; };

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait_parity(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, unsigned long long desc, int c0, int c1, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(dst), "l"(desc), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_store_2d(unsigned long long desc, int c0, int c1, unsigned src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];"
                 :: "l"(desc), "r"(c0), "r"(c1), "r"(src) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read(int allowed) {
    if (allowed) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    else         asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void prefetch_desc(unsigned long long desc) {
    asm volatile("prefetch.tensormap [%0];" :: "l"(desc) : "memory");
}
__device__ __forceinline__ void acquire_desc(unsigned long long desc) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(desc) : "memory");
}

// Coordinates (innermost first, as TMA wants them) of this CTA's k-th tile.
__device__ __forceinline__ void tile_coords(long long k, int tiles_c, int box_r, int box_c, int& c0, int& c1) {
    long long t = (long long)blockIdx.x + k * (long long)gridDim.x;
    c0 = (int)(t % tiles_c) * box_c;
    c1 = (int)(t / tiles_c) * box_r;
}

__device__ __forceinline__ void stream_copy(unsigned char* smem, unsigned long long sdesc, unsigned long long ddesc,
                                            int tiles_r, int tiles_c, int box_r, int box_c, int stages,
                                            unsigned tile_bytes, unsigned slot_bytes) {
    const long long ntiles = (long long)tiles_r * tiles_c;
    if ((long long)blockIdx.x >= ntiles) return;
    const long long n = (ntiles - blockIdx.x + gridDim.x - 1) / gridDim.x;  // tiles of this CTA
    const unsigned base = smem_u32(smem);
    const unsigned bars = base + (unsigned)stages * slot_bytes;  // slots are 128-byte multiples (TMA alignment)
    for (int s = 0; s < stages; ++s) mbar_init(bars + 8u * s, 1u);
    fence_mbar_init();
    prefetch_desc(sdesc);
    prefetch_desc(ddesc);
    int c0, c1;
    for (long long k = 0; k < stages && k < n; ++k) {  // prologue: fill the ring
        tile_coords(k, tiles_c, box_r, box_c, c0, c1);
        mbar_expect_tx(bars + 8u * (unsigned)k, tile_bytes);
        tma_load_2d(base + (unsigned)k * slot_bytes, sdesc, c0, c1, bars + 8u * (unsigned)k);
    }
    const int lag = stages > 1 ? 1 : 0;
    for (long long i = 0; i < n; ++i) {
        const unsigned s = (unsigned)(i % stages);
        mbar_wait_parity(bars + 8u * s, (unsigned)((i / stages) & 1));
        tile_coords(i, tiles_c, box_r, box_c, c0, c1);
        tma_store_2d(ddesc, c0, c1, base + s * slot_bytes);
        bulk_commit();
        const long long j = i - lag;           // the stage whose store is older than the newest `lag` stores
        if (j >= 0 && j + stages < n) {
            const unsigned sj = (unsigned)(j % stages);
            bulk_wait_read(lag);               // that store has finished reading shared memory
            tile_coords(j + stages, tiles_c, box_r, box_c, c0, c1);
            mbar_expect_tx(bars + 8u * sj, tile_bytes);
            tma_load_2d(base + sj * slot_bytes, sdesc, c0, c1, bars + 8u * sj);
        }
    }
    bulk_wait_all();
}

extern "C" __global__ void __launch_bounds__(32)
tma_stream_copy_param(const __grid_constant__ TmaDesc src, const __grid_constant__ TmaDesc dst,
                      int tiles_r, int tiles_c, int box_r, int box_c, int stages, unsigned tile_bytes,
                      unsigned slot_bytes) {
    extern __shared__ __align__(1024) unsigned char smem[];
    if (threadIdx.x != 0) return;
    stream_copy(smem, reinterpret_cast<unsigned long long>(&src), reinterpret_cast<unsigned long long>(&dst),
                tiles_r, tiles_c, box_r, box_c, stages, tile_bytes, slot_bytes);
}

extern "C" __global__ void __launch_bounds__(32)
tma_stream_copy_gmem(const TmaDesc* src, const TmaDesc* dst,
                     int tiles_r, int tiles_c, int box_r, int box_c, int stages, unsigned tile_bytes,
                     unsigned slot_bytes) {
    extern __shared__ __align__(1024) unsigned char smem[];
    if (threadIdx.x != 0) return;
    const unsigned long long s = reinterpret_cast<unsigned long long>(src);
    const unsigned long long d = reinterpret_cast<unsigned long long>(dst);
    acquire_desc(s);
    acquire_desc(d);
    stream_copy(smem, s, d, tiles_r, tiles_c, box_r, box_c, stages, tile_bytes, slot_bytes);
}
"""

DESC_MODES = {
    "param": "by value: const __grid_constant__ 128-byte kernel parameter (NumPy structured scalar via CuPy)",
    "gmem": "global memory: 128 bytes in a CuPy array, passed by pointer, fence.proxy.tensormap acquire",
}

_module_cache = {}


def _module():
    """Compile once per process; returns (RawModule, options used)."""
    if "mod" not in _module_cache:
        import cupy

        last = None
        # CuPy appends its own -arch=sm_<cc> after these options. NVRTC 13.5 accepts the duplicate and keeps the
        # first (seen offline: the cubin says "-arch sm_90a"); older NVRTCs rejected a second -arch (cupy#3292),
        # hence the fallback without one. Everything used here is plain sm_90 PTX, so both give the same code.
        tries = [("-std=c++17",), ()]
        if cupy.cuda.Device().compute_capability == "90":
            tries.insert(0, ("-std=c++17", "-arch=sm_90a"))
        for opts in tries:
            try:
                mod = cupy.RawModule(code=CUDA_SOURCE, options=opts)
                mod.get_function("tma_stream_copy_param")  # forces compilation
                _module_cache["mod"] = (mod, opts)
                break
            except Exception as e:  # noqa: BLE001 - report the last one
                last = e
        else:
            raise RuntimeError(f"NVRTC compilation of the C++ TMA copy failed: {last}")
    return _module_cache["mod"]


def default_box(shape, itemsize, tile_bytes=DEFAULT_TILE_BYTES):
    """(rows, cols) box: rows of at most 256 elements (16-byte multiple), enough rows for ~tile_bytes."""
    rows, cols = shape
    unit = max(1, 16 // itemsize)
    inner = min(MAX_BOX, -(-cols // unit) * unit)
    inner = max(unit, inner - inner % unit)
    outer = max(1, min(MAX_BOX, rows, tile_bytes // (inner * itemsize)))
    return (outer, inner)


def _sm_count():
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def _tmap_dtype():
    import numpy as np

    return np.dtype({"names": ["opaque"], "formats": [(np.uint64, (16,))], "itemsize": 128})


class CxxStreamCopy:
    """Plan for the C++ TMA streaming copy ``dst[...] = src`` of two 2-D CUDA arrays of one shape and dtype.

    ``box``: (rows, cols) TMA box (default: :func:`default_box`); ``stages``: shared-memory ring depth;
    ``ctas_per_sm``: persistent CTAs per SM; ``desc_mode``: ``"param"`` (by value, default) or ``"gmem"``.
    Launch with :meth:`launch` (default stream, like torch and numbatma).
    """

    def __init__(self, src, dst, stages=DEFAULT_STAGES, box=None, ctas_per_sm=DEFAULT_CTAS_PER_SM,
                 desc_mode="param", tile_bytes=DEFAULT_TILE_BYTES, **tensormap_kwargs):
        import cupy
        import numpy as np

        import numbatma

        ls, ld = numbatma.array_layout(src), numbatma.array_layout(dst)
        if ls.shape != ld.shape or ls.dtype != ld.dtype:
            raise ValueError(f"CxxStreamCopy: src is {ls.name}, dst is {ld.name}; they must match.")
        if len(ls.shape) != 2:
            raise ValueError(f"CxxStreamCopy: 2-D arrays only, got {ls.name}.")
        if desc_mode not in DESC_MODES:
            raise ValueError(f"CxxStreamCopy: desc_mode must be one of {sorted(DESC_MODES)}, got {desc_mode!r}.")
        stages = int(stages)
        if not 1 <= stages <= 64:
            raise ValueError(f"CxxStreamCopy: stages must be in 1..64, got {stages}.")
        self.shape = ls.shape
        self.dtype = ls.dtype
        self.box = tuple(int(b) for b in (box if box is not None else default_box(ls.shape, ls.dtype.itemsize,
                                                                                    tile_bytes)))
        self.stages = stages
        self.ctas_per_sm = int(ctas_per_sm)
        self.desc_mode = desc_mode
        self.tile_bytes = self.box[0] * self.box[1] * ls.dtype.itemsize
        self.slot_bytes = -(-self.tile_bytes // 128) * 128
        self.smem_bytes = stages * self.slot_bytes + 8 * stages
        if self.smem_bytes > MAX_DYNAMIC_SMEM:
            raise ValueError(f"CxxStreamCopy: {stages} stages of {self.tile_bytes} B need {self.smem_bytes} B of "
                             f"shared memory, more than {MAX_DYNAMIC_SMEM} B.")
        self._src_map = numbatma.TensorMap(src, self.box, **tensormap_kwargs)
        self._dst_map = numbatma.TensorMap(dst, self.box, **tensormap_kwargs)
        raw = self._src_map.to_bytes() + self._dst_map.to_bytes()
        if len(raw) != 256:
            raise RuntimeError(f"TensorMap.to_bytes() gave {len(raw) // 2} bytes per descriptor, expected 128.")
        self.tiles = (-(-ls.shape[0] // self.box[0]), -(-ls.shape[1] // self.box[1]))
        ntiles = self.tiles[0] * self.tiles[1]
        self.grid = max(1, min(ntiles, _sm_count() * self.ctas_per_sm))
        mod, self.compile_options = _module()
        self._kernel = mod.get_function(f"tma_stream_copy_{desc_mode}")
        if self.smem_bytes > 48 * 1024 and self._kernel.max_dynamic_shared_size_bytes < self.smem_bytes:
            self._kernel.max_dynamic_shared_size_bytes = self.smem_bytes
        if desc_mode == "param":
            words = np.frombuffer(raw, dtype=np.uint64)
            self._desc_args = (words[:16].copy().view(_tmap_dtype()), words[16:].copy().view(_tmap_dtype()))
        else:
            self._desc_dev = cupy.asarray(np.frombuffer(raw, dtype=np.uint8))  # 256-byte aligned allocation
            if self._desc_dev.data.ptr % 64:
                raise RuntimeError("CxxStreamCopy: descriptor buffer is not 64-byte aligned.")
            self._desc_args = (self._desc_dev[:128], self._desc_dev[128:])  # passed as pointers
        self._args = self._desc_args + (
            np.int32(self.tiles[0]), np.int32(self.tiles[1]), np.int32(self.box[0]), np.int32(self.box[1]),
            np.int32(stages), np.uint32(self.tile_bytes), np.uint32(self.slot_bytes),
        )
        self._keep = (src, dst)

    @property
    def desc_passing(self):
        return DESC_MODES[self.desc_mode]

    def describe(self):
        return dict(stages=self.stages, box=list(self.box), tile_bytes=self.tile_bytes,
                    ctas_per_sm=self.ctas_per_sm, grid=self.grid, smem_bytes=self.smem_bytes,
                    desc_mode=self.desc_mode, desc_passing=self.desc_passing,
                    nvrtc_options=list(self.compile_options))

    def launch(self, stream=0):
        import cupy

        s = None if stream in (0, None) else cupy.cuda.ExternalStream(int(stream))
        self._kernel((self.grid,), (WARP,), self._args, shared_mem=self.smem_bytes, stream=s)


# -- self-test ---------------------------------------------------------------------------------------------
def _check(cupy, shape, dtype, desc_mode, **kw):
    src = (cupy.random.random(shape) * 100).astype(dtype)
    dst = cupy.full(shape, 7, dtype=dtype)
    plan = CxxStreamCopy(src, dst, desc_mode=desc_mode, **kw)
    plan.launch()
    cupy.cuda.Device().synchronize()
    ok = bool(cupy.array_equal(src.view(cupy.uint8), dst.view(cupy.uint8)))
    return ok, plan


def _bandwidth(cupy, plan, nbytes, reps=7, per_block=10):
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(3):
        plan.launch()
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(per_block):
            plan.launch()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / per_block)
    times.sort()
    ms = times[len(times) // 2]
    return 2 * nbytes / (ms * 1e-3) / 1e12, ms


def main(argv=None):
    ap = argparse.ArgumentParser(description="Self-test of the CUDA C++ TMA streaming-copy peer.")
    ap.add_argument("--mib", type=int, default=1024, help="array size for the bandwidth figure (MiB, float32)")
    args = ap.parse_args(argv)
    try:
        import cupy
    except ImportError as e:
        print(f"SKIP peer_cxx: CuPy not importable ({e})")
        return 0
    try:
        importlib.import_module("numbatma")
    except Exception as e:  # noqa: BLE001
        print(f"SKIP peer_cxx: numbatma not importable ({e})")
        return 0
    fails = 0
    for mode in ("param", "gmem"):
        for shape, dtype, kw in (
            # ragged edges and several tiles per CTA, so the ring wraps (parity flips) in every case
            ((5000, 1000), "float32", {}),
            ((5000, 1000), "float32", dict(stages=3)),
            ((2053, 4100), "float32", dict(stages=1)),
            ((4097, 96), "uint8", dict(stages=2)),
            ((4096, 4096), "float16", dict(stages=2, ctas_per_sm=2)),
        ):
            try:
                ok, plan = _check(cupy, shape, dtype, mode, **kw)
                print(f"{'ok  ' if ok else 'FAIL'} C++ TMA copy {dtype}{shape} desc={mode} "
                      f"box={plan.box} stages={plan.stages} grid={plan.grid}")
                fails += not ok
            except Exception as e:  # noqa: BLE001
                print(f"FAIL C++ TMA copy {dtype}{shape} desc={mode}: {type(e).__name__}: {e}")
                fails += 1
    n = args.mib * (1 << 20) // 4
    rows = 1 << ((n.bit_length() - 1) // 2)
    shape = (rows, n // rows)
    src = cupy.random.random(shape, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    nbytes = src.nbytes
    for mode in ("param", "gmem"):
        try:
            plan = CxxStreamCopy(src, dst, desc_mode=mode)
            tbps, ms = _bandwidth(cupy, plan, nbytes)
            print(f"C++ TMA copy {args.mib} MiB float32{shape}: {tbps:.3f} TB/s ({ms * 1e3:.1f} us) "
                  f"[{plan.desc_passing}; box={plan.box}, stages={plan.stages}, grid={plan.grid}, "
                  f"nvrtc options={plan.compile_options}]")
        except Exception as e:  # noqa: BLE001
            print(f"FAIL C++ TMA copy bandwidth desc={mode}: {type(e).__name__}: {e}")
            fails += 1

    class _CupyCopy:
        def launch(self):
            cupy.copyto(dst, src)

    tbps, ms = _bandwidth(cupy, _CupyCopy(), nbytes)
    print(f"cupy.copyto      {args.mib} MiB float32{shape}: {tbps:.3f} TB/s ({ms * 1e3:.1f} us)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
