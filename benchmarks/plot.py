"""Plot bandwidth vs array size (copy and transpose, numbatma vs torch) from a bandwidth.json written by
benchmarks/bandwidth.py.

    python benchmarks/plot.py [path/to/bandwidth.json] [-o benchmarks/bandwidth.png]

Defaults: the JSON is $OUT/bandwidth.json when $OUT is set and has one, else benchmarks/bandwidth.json; the
image goes to $OUT/bandwidth.png when $OUT is set, else benchmarks/bandwidth.png. Needs matplotlib; without it
(or without a JSON) it prints SKIP and exits 0, so the GPU suite can run it unconditionally.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SERIES = (  # (kind, impl, label, color, linestyle, marker)
    ("copy", "ours", "copy: numbatma StreamCopy", "tab:blue", "-", "o"),
    ("copy", "torch", "copy: torch copy_", "tab:blue", "--", "s"),
    ("transpose", "ours", "transpose: numbatma Transpose", "tab:orange", "-", "o"),
    ("transpose", "torch", "transpose: torch copy_(x.t())", "tab:orange", "--", "s"),
)


def _default_json():
    out = os.environ.get("OUT")
    if out and os.path.exists(os.path.join(out, "bandwidth.json")):
        return os.path.join(out, "bandwidth.json")
    return os.path.join(HERE, "bandwidth.json")


def _default_png():
    out = os.environ.get("OUT")
    return os.path.join(out, "bandwidth.png") if out else os.path.join(HERE, "bandwidth.png")


def plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    meta = doc.get("meta", {})
    sweep = doc.get("sweep") or {}
    fig, ax = plt.subplots(figsize=(8, 5), dpi=150)
    drawn = 0
    l2_sizes = []
    for kind, impl, label, color, ls, marker in SERIES:
        pts = sorted(sweep.get(kind, {}).get(impl, []), key=lambda p: p["array_bytes"])
        pts = [p for p in pts if p.get("tbps") is not None]
        if not pts:
            continue
        xs = [p["array_bytes"] / 2**20 for p in pts]
        ys = [p["tbps"] for p in pts]
        ax.plot(xs, ys, linestyle=ls, marker=marker, color=color, label=label)
        l2_sizes += [p["array_bytes"] / 2**20 for p in pts if p.get("l2_resident")]
        drawn += 1
    if not drawn:
        plt.close(fig)
        return False
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} MiB" if v < 1024 else f"{v / 1024:g} GiB"))
    ds = meta.get("datasheet_tbps")
    if ds:
        ax.axhline(ds, color="gray", linestyle=":", linewidth=1)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    x0 = ax.get_xlim()[0]
    if ds:
        ax.text(x0, ds, f" datasheet {ds} TB/s", va="bottom", ha="left", fontsize=8, color="gray")
    if l2_sizes:
        ax.axvspan(x0, max(l2_sizes), color="0.92", zorder=0)
        ax.text(max(l2_sizes), ax.get_ylim()[1] * 0.98, "src+dst fit in L2 ", ha="right", va="top", fontsize=7,
                color="0.4", rotation=90)
    ax.set_xlabel("size of one array (float32)")
    ax.set_ylabel("bandwidth, bytes read + written (TB/s)")
    gpu = meta.get("gpu", "unknown GPU")
    drv = f", driver {meta['driver']}" if meta.get("driver") else ""
    ax.set_title(f"numbatma TMA kernels vs torch: bandwidth vs size\n{gpu}{drv}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    note = []
    if meta.get("date"):
        note.append(meta["date"][:10])
    if meta.get("numbatma_commit"):
        note.append(f"numbatma {meta['numbatma_commit']}")
    if meta.get("command"):
        note.append(meta["command"])
    if note:
        fig.text(0.01, 0.005, " | ".join(note), fontsize=6, color="0.5")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plot bandwidth.json (from benchmarks/bandwidth.py) as a PNG.")
    ap.add_argument("json", nargs="?", default=None, help="bandwidth.json (default: $OUT or benchmarks/)")
    ap.add_argument("-o", "--output", default=None, help="PNG path (default: $OUT or benchmarks/bandwidth.png)")
    args = ap.parse_args(argv)
    src = args.json or _default_json()
    dst = args.output or _default_png()
    if not os.path.exists(src):
        print(f"SKIP plot: no {src} (run benchmarks/bandwidth.py first)")
        return 0
    if importlib.util.find_spec("matplotlib") is None:
        print("SKIP plot: matplotlib is not installed (pip install matplotlib)")
        return 0
    with open(src) as f:
        doc = json.load(f)
    if not plot(doc, dst):
        print(f"SKIP plot: {src} has no size sweep (run bandwidth.py with the 'sweep' section)")
        return 0
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
