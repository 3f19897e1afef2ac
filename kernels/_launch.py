"""Host-side helpers shared by the ready-made kernels: device facts, persistent grids, array checks."""
from __future__ import annotations

import functools

from numbatma import TensorMapError, array_layout

# Shared memory on H100/H200 (and B200): per-block opt-in maximum (static + dynamic), and per SM (the
# system keeps 1 KiB of it per resident CTA).
SMEM_PER_BLOCK = 227 * 1024
SMEM_PER_SM = 228 * 1024


@functools.lru_cache(maxsize=None)
def sm_count(device_id=None):
    """Number of SMs of the current device (a persistent grid launches a multiple of it)."""
    from numba import cuda

    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def persistent_grid(ntiles, ctas_per_sm=1):
    """Blocks for a persistent kernel: enough to fill the GPU, never more than there are tiles."""
    return max(1, min(ntiles, sm_count() * ctas_per_sm))


def ceil_div(a, b):
    return -(-a // b)


def same_layout(op, *arrays):
    """Check that arrays share shape and dtype; return the layout of the first."""
    layouts = [array_layout(a) for a in arrays]
    first = layouts[0]
    for i, lay in enumerate(layouts[1:], 1):
        if lay.shape != first.shape or lay.dtype != first.dtype:
            raise TensorMapError(
                f"{op}: argument {i} is a {lay.name} but argument 0 is a {first.name}; they must match."
            )
    return first


def require_rank(op, layout, ranks, what="array"):
    if len(layout.shape) not in ranks:
        raise TensorMapError(
            f"{op}: the {what} is a {layout.name}; this kernel takes rank {' or '.join(map(str, ranks))}."
        )


def require_dtype(op, layout, dtypes, what="array"):
    if layout.dtype.name not in dtypes:
        raise TensorMapError(f"{op}: the {what} is a {layout.name}; supported dtypes: {', '.join(dtypes)}.")


def require_store_target(op, tmap, what="the output"):
    """Reject a TMA-store destination whose last row does not end on a 16-byte boundary unless a row stride
    leaves room for it: a tile store completes the row to the next 16-byte unit
    (``TensorMap.store_overhang``), which for a single row or a 1-D array lands past the array's end."""
    over = tmap.store_overhang
    if not over:
        return
    rows = 1
    for n in tmap.shape[:-1]:
        rows *= n
    padded = len(tmap.shape) > 1 and tmap.strides[-2] >= tmap.shape[-1] * tmap.dtype.itemsize + over
    if rows > 1 and padded:
        return  # the extra bytes land in each row's own padding (documented in docs/guide.md)
    raise TensorMapError(
        f"{op}: {what} is a {tmap.dtype.name} array with shape {tuple(tmap.shape)}; its rows are "
        f"{tmap.shape[-1] * tmap.dtype.itemsize} bytes long, and a TMA store writes whole 16-byte units, so it "
        f"would write {over} bytes past the end of the array. Make the innermost extent a multiple of "
        f"{16 // tmap.dtype.itemsize if tmap.dtype.itemsize < 16 else 1} elements (or use a padded view)."
    )
