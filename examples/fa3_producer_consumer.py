"""FlashAttention-3-style warp specialization: one producer warpgroup that gives registers away
(``setmaxnreg_dec``) and two consumer warpgroups that take them (``setmaxnreg_inc``), ping-ponging tiles.

    python examples/fa3_producer_consumer.py

The work is per-block int8 quantization, the kind of pass that precedes an FP8/int8 GEMM: for every row
and every block of 128 columns of an 8192 x 8192 float32 array X (256 MiB),

    scale = max|x| / 127,      q = rint(x * (127 / max|x|))   (int8; all zero where max|x| = 0)

Q (int8, same shape as X) and the scales S (float32, stored transposed: ``S[col_block, row]``, so that one
tile's 64 scales are 256 contiguous bytes, TMA-storable) are checked exactly against NumPy; the script
prints the bandwidth (bytes read + written per second).

Layout (384 threads, three warpgroups, persistent over 64 x 128 tiles):

* Warpgroup 0, producer: ``setmaxnreg_dec(PRODUCER_REGS)``; one elected lane of its first warp TMA-loads
  tile ``i`` of the block into ``pipe0`` (``i`` even) or ``pipe1`` (``i`` odd): two 2-stage Pipelines, one
  per consumer.
* Warpgroups 1 and 2, consumers: ``setmaxnreg_inc(CONSUMER_REGS)``; consumer ``c`` takes tiles
  ``c, c + 2, ...`` (ping-pong). Each warp reads its 16 rows x 128 columns into registers (64 floats per
  thread, which is what the extra registers are for), releases the stage at once (the producer refills it
  while the consumer computes), reduces each row with warp shuffles, quantizes into a shared int8 tile and
  a 64-float scale tile, fences, meets its own warpgroup at a named barrier and one thread TMA-stores
  both tiles. The output tiles are double-buffered per consumer (``bulk_wait_group_read(0)`` before the
  barrier frees the other buffer).
* Registers: the kernel is compiled with ``max_registers=MAX_REGISTERS`` (168: 168 x 384 threads fill the
  64 K register file); the producer gives back (168 - 40) x 128 registers and each consumer warpgroup
  takes (232 - 168) x 128 of them: 40 x 128 + 232 x 256 = 168 x 384. ptxas keeps ``setmaxnreg``
  (SASS ``USETMAXREG``) only with such a cap (else "C7508 ... unable to determine register count at
  entry") and only when it sees the whole kernel: numba-cuda links with LTO by default when nvJitLink is
  present, which does; a plain PTX link through nvJitLink assembles the PTX as a separate compilation
  unit and drops it ("C7504"). It needs sm_90a / sm_100a, which numba-cuda targets on such GPUs. If the
  capped kernel cannot be built, the script says so and runs the same layout without ``setmaxnreg``.

Dynamic shared memory: 4 input stages x 32 KiB + 4 int8 tiles x 8 KiB + 4 scale tiles x 256 B = 161 KiB.

Needs an NVIDIA GPU with TMA (compute capability 9.0+) and 161 KiB of shared memory per block (H100, H200,
B200).
"""
import sys

import numpy as np
from numba import cuda, types

import numbatma
from numbatma.utils import fill_uniform, gpu_or_simulator, median_ms, small_problem
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    elect_one_sync,
    fence_proxy_async_shared_cta,
    named_barrier_sync,
    setmaxnreg_dec,
    setmaxnreg_inc,
    tma_store,
)

ROWS, COLS = ((8192, 8192) if not small_problem() else (128, 256))  # X: 256 MiB of float32 (small: sim, sanitizer)
BM, BN = 64, 128  # tile: 64 rows x 128 columns; one row of a tile = one quantization block
TILE = BM * BN  # 8192 elements: 32 KiB of float32, 8 KiB of int8
QMAX = 127.0
STAGES = 2  # per consumer pipeline
WARPGROUP = 128
THREADS = 3 * WARPGROUP  # producer, consumer 0, consumer 1
ROWS_PER_WARP = BM // 4  # 16 rows per consumer warp
VALS = BN // 32  # 4 values per lane per row
MAX_REGISTERS = 168  # registers per thread at launch: 168 x 384 = 64512 <= 65536
PRODUCER_REGS = 40
CONSUMER_REGS = 232  # 40 x 128 + 232 x 256 = 168 x 384
# Dynamic shared memory, offsets in bytes: input stages, then int8 tiles, then scale tiles.
IN_BYTES = 2 * STAGES * TILE * 4  # 2 pipelines x STAGES x 32 KiB
Q_OFFSET = IN_BYTES
S_OFFSET = Q_OFFSET + 2 * 2 * TILE  # 2 consumers x 2 buffers x 8 KiB
SMEM_BYTES = S_OFFSET + 2 * 2 * BM * 4  # 2 consumers x 2 buffers x 64 floats


@cuda.jit(device=True, inline="always")
def _consume(pipe, fdyn, bdyn, c, q_map, s_map, first, step, mine):
    """Consumer warpgroup ``c`` (0 or 1): tiles c, c + 2, ... of this block."""
    ct = cuda.threadIdx.x - WARPGROUP * (c + 1)  # 0..127 within the warpgroup
    warp = ct // 32
    lane = ct % 32
    tiles_per_row = COLS // BN
    v = cuda.local.array((ROWS_PER_WARP, VALS), np.float32)  # stays in registers (constant indices)
    n = 0  # this consumer's tile count: output buffer n & 1
    for i in range(c, mine, 2):
        t = first + i * step
        rb = t // tiles_per_row
        cb = t - rb * tiles_per_row
        s = pipe.consumer_wait()
        x = fdyn[(c * STAGES + s) * TILE:(c * STAGES + s + 1) * TILE]
        for r in range(ROWS_PER_WARP):  # 64 independent shared loads; lane + 32 m: no bank conflicts
            for m in range(VALS):
                v[r, m] = x[(warp * ROWS_PER_WARP + r) * BN + lane + 32 * m]
        pipe.consumer_release()  # the tile is in registers: the producer may refill the stage now

        b = 2 * c + (n & 1)
        q = bdyn[Q_OFFSET + b * TILE:Q_OFFSET + (b + 1) * TILE]
        sc = fdyn[S_OFFSET // 4 + b * BM:S_OFFSET // 4 + (b + 1) * BM]
        for r in range(ROWS_PER_WARP):
            amax = abs(v[r, 0])
            for m in range(1, VALS):
                amax = max(amax, abs(v[r, m]))
            for d in (16, 8, 4, 2, 1):  # warp-wide max: every lane ends with the row's max
                amax = max(amax, cuda.shfl_xor_sync(0xFFFFFFFF, amax, d))
            inv = np.float32(0.0)
            if amax > np.float32(0.0):
                inv = np.float32(QMAX) / amax
            row = warp * ROWS_PER_WARP + r
            for m in range(VALS):
                q[row * BN + lane + 32 * m] = np.int8(cuda.libdevice.rintf(v[r, m] * inv))
            if lane == 0:
                sc[row] = amax / np.float32(QMAX)

        fence_proxy_async_shared_cta()  # my q / sc writes -> visible to the TMA store
        if ct == 0:
            bulk_wait_group_read(0)  # my previous store has read buffer (n + 1) & 1: reusable next time
        named_barrier_sync(1 + c, WARPGROUP)  # this warpgroup only (the other one runs its own tile)
        if ct == 0:
            tma_store(q_map, (rb * BM, cb * BN), q)
            tma_store(s_map, (cb, rb * BM), sc)
            bulk_commit_group()
        n += 1
    if ct == 0:
        bulk_wait_group(0)


def make_kernel(use_setmaxnreg):
    """The kernel, with or without the register hand-over (the layout is the same)."""

    def quantize_kernel(x_map, q_map, s_map, ntiles):
        fdyn = cuda.shared.array(0, np.float32, alignment=1024)  # both views start at the dynamic base
        bdyn = cuda.shared.array(0, np.int8, alignment=1024)
        pipe0 = Pipeline(STAGES, 1, WARPGROUP)  # producer -> consumer 0 (even tiles of the block)
        pipe1 = Pipeline(STAGES, 1, WARPGROUP)  # producer -> consumer 1 (odd tiles)

        wg = cuda.threadIdx.x // WARPGROUP
        tiles_per_row = COLS // BN
        first = cuda.blockIdx.x
        step = cuda.gridDim.x
        mine = (ntiles - first + step - 1) // step

        if wg == 0:
            if use_setmaxnreg:
                setmaxnreg_dec(PRODUCER_REGS)  # all 128 threads of the warpgroup
            if cuda.threadIdx.x < 32:
                if elect_one_sync():
                    for i in range(mine):
                        t = first + i * step
                        rb = t // tiles_per_row
                        coords = (rb * BM, (t - rb * tiles_per_row) * BN)
                        if i % 2 == 0:
                            s = pipe0.producer_acquire()
                            pipe0.load(fdyn[s * TILE:(s + 1) * TILE], x_map, coords)
                            pipe0.producer_commit()
                        else:
                            s = pipe1.producer_acquire()
                            pipe1.load(fdyn[(STAGES + s) * TILE:(STAGES + s + 1) * TILE], x_map, coords)
                            pipe1.producer_commit()
        else:
            if use_setmaxnreg:
                setmaxnreg_inc(CONSUMER_REGS)
            if wg == 1:
                _consume(pipe0, fdyn, bdyn, 0, q_map, s_map, first, step, mine)
            else:
                _consume(pipe1, fdyn, bdyn, 1, q_map, s_map, first, step, mine)

    return quantize_kernel


# The register cap: ptxas keeps setmaxnreg only when it knows the register count at kernel entry. (The CUDA
# simulator's jit has no max_registers; it cannot run this kernel anyway.)
_CAP = {} if numbatma.SIMULATING else {"max_registers": MAX_REGISTERS}
fa3_kernel = cuda.jit(**_CAP)(make_kernel(True))
fa3_kernel_plain = cuda.jit(make_kernel(False))  # fallback: same layout, no register hand-over


def reference(hx):
    """NumPy: the same float32 operations, in the same order, as the kernel."""
    blocks = hx.reshape(ROWS, COLS // BN, BN)
    amax = np.abs(blocks).max(axis=2)  # (ROWS, COLS // BN)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(QMAX) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(blocks * inv[:, :, None]).astype(np.int8).reshape(ROWS, COLS)
    scales = (amax / np.float32(QMAX)).astype(np.float32).T.copy()  # (COLS // BN, ROWS)
    return q, scales


def build_kernel(sig):
    """The setmaxnreg kernel, built now (PTX -> cubin, loaded) so that a toolchain refusing setmaxnreg is
    caught here; else the same layout without the register hand-over. Returns (kernel, description)."""
    try:
        regs = fa3_kernel.compile(sig).regs_per_thread
        kernel, how = fa3_kernel, f"setmaxnreg {PRODUCER_REGS}/{CONSUMER_REGS}, {regs} registers at launch"
    except Exception as exc:
        kernel, how = fa3_kernel_plain, "no setmaxnreg"
        print(f"note: the setmaxnreg kernel did not build ({type(exc).__name__}: {exc}); running the same "
              f"layout without the register hand-over.")
    if kernel is fa3_kernel and not fa3_kernel.targetoptions.get("lto"):
        # Without LTO, nvJitLink assembles the PTX as a separate compilation unit and ptxas drops setmaxnreg
        # ("C7504 ... ignored to maintain compatibility across compilation units"); the kernel is still right.
        how = "setmaxnreg requested, but likely dropped by ptxas: numba-cuda links without LTO here"
        print("note: numba-cuda is not using LTO (nvJitLink missing?), so ptxas probably ignores setmaxnreg; "
              "the layout and the results are the same.")
    return kernel, how


def main():
    gpu_or_simulator("fa3_producer_consumer.py", shared_bytes=SMEM_BYTES)
    x = cuda.device_array((ROWS, COLS), np.float32)
    q = cuda.device_array((ROWS, COLS), np.int8)
    s = cuda.device_array((COLS // BN, ROWS), np.float32)
    fill_uniform(x, 7)
    x_map = numbatma.TensorMap(x, (BM, BN))
    q_map = numbatma.TensorMap(q, (BM, BN))
    s_map = numbatma.TensorMap(s, (1, BM))
    ntiles = (ROWS // BM) * (COLS // BN)
    grid = min(ntiles, cuda.get_current_device().MULTIPROCESSOR_COUNT)  # one 384-thread block per SM

    if numbatma.SIMULATING:  # setmaxnreg is a no-op there; the same code runs
        kernel, how = fa3_kernel, "simulated: setmaxnreg has no effect"
    else:
        kernel, how = build_kernel((x_map.numba_type, q_map.numba_type, s_map.numba_type, types.int64))

    def launch():
        kernel[grid, THREADS, 0, SMEM_BYTES](x_map, q_map, s_map, ntiles)

    launch()
    cuda.synchronize()
    ref_q, ref_s = reference(x.copy_to_host())
    got_q, got_s = q.copy_to_host(), s.copy_to_host()
    if not np.array_equal(got_s, ref_s):
        bad = np.argwhere(got_s != ref_s)
        b, r = bad[0]
        print(f"FAILED: {len(bad)} scales differ from NumPy; first S[{b}, {r}]: got {got_s[b, r]}, "
              f"expected {ref_s[b, r]}")
        return 1
    if not np.array_equal(got_q, ref_q):
        bad = np.argwhere(got_q != ref_q)
        r, c = bad[0]
        print(f"FAILED: {len(bad)} quantized values differ from NumPy; first Q[{r}, {c}]: got {got_q[r, c]}, "
              f"expected {ref_q[r, c]}")
        return 1
    ms = None if numbatma.SIMULATING else median_ms(launch)  # the simulator's times mean nothing
    nbytes = x.nbytes + q.nbytes + s.nbytes
    print(f"int8 quantization (1x{BN} blocks) of {ROWS}x{COLS} float32 ({x.nbytes >> 20} MiB in), {BM}x{BN} "
          f"tiles, 1 producer + 2 consumer warpgroups ({how}), {grid} blocks: OK (Q and S match NumPy)")
    if ms is None:
        print("(CUDA simulator: a small problem, no timing)")
    else:
        print(f"median {ms:.3f} ms -> {nbytes / ms / 1e6:.1f} GB/s (bytes read + written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
