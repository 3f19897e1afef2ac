"""Probe (GPU): (1) tile-reduce inc/dec with several CTAs reducing the same tile into overlapping boxes:
is the result the sequential one, and is it the same from run to run? (2) which 64-bit bitwise tile
reduces run. Each case runs in its own process (a fault poisons the context)."""
import subprocess
import sys

import numpy as np


def overlap(kind, blocks, seed):
    sys.path.insert(0, "tests")
    from numba import cuda

    import numbatma
    import tma_ops_kernels as K

    rng = np.random.default_rng(seed)
    shape, box = K.SHAPES[2], K.BOXES[2]
    coords = np.zeros((blocks, 2), np.int32)  # every block: the same box at the origin
    src, src_coords, tiles = K.source_tiles(rng, kind, "uint32", box, blocks, same=True)
    dst = K.random_data(rng, kind, "uint32", shape)
    want = K.reference(kind, dst, tiles, coords)
    d_dst = cuda.to_device(dst)
    s = numbatma.TensorMap(cuda.to_device(src), box)
    d = numbatma.TensorMap(d_dst, box)
    K.reduce_kernel(kind, s.shared_shape, "uint32", 2)[blocks, 32](s, d, cuda.to_device(src_coords),
                                                                   cuda.to_device(coords))
    got = d_dst.copy_to_host()
    print(f"mismatches {int((got != want).sum())} of {got.size}; sum(got - want) {int(got.astype(np.int64).sum() - want.astype(np.int64).sum())}")


def bitwise(kind, dtype):
    sys.path.insert(0, "tests")
    from numba import cuda

    import numbatma
    import tma_ops_kernels as K

    shape, box = K.SHAPES[2], K.BOXES[2]
    src = np.full(box, 6, dtype)
    dst = np.full(shape, 3, dtype)
    d_dst = cuda.to_device(dst)
    s = numbatma.TensorMap(cuda.to_device(src), box)
    d = numbatma.TensorMap(d_dst, box)
    K.reduce_kernel(kind, s.shared_shape, dtype, 2)[1, 32](s, d, cuda.to_device(np.zeros((1, 2), np.int32)),
                                                           cuda.to_device(np.zeros((1, 2), np.int32)))
    got = d_dst.copy_to_host()
    print("ok, corner", got[0, 0], "elsewhere", got[-1, -1])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        if sys.argv[1] == "overlap":
            overlap(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        else:
            bitwise(sys.argv[2], sys.argv[3])
    else:
        runs = [["overlap", k, str(b), str(seed)] for k in ("inc", "dec", "add") for b in (1, 2, 8) for seed in (1, 1)]
        runs += [["bitwise", k, d] for k in ("and", "or", "xor") for d in ("int64", "uint64", "int32")]
        for args in runs:
            r = subprocess.run([sys.executable, __file__] + args, capture_output=True, text=True)
            last = (r.stdout.strip().splitlines() or [""])[-1]
            err = [ln for ln in r.stderr.splitlines() if "CUDA_ERROR" in ln][-1:]
            print(" ".join(args), "->", last if r.returncode == 0 else f"FAIL {err}")
