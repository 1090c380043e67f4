#!/usr/bin/python3
"""Plots of the registration cache benchmarks (bench/rcache_bench.cc), gmd against ucs_rcache.

Reads Google Benchmark's JSON (--benchmark_out=FILE --benchmark_out_format=json, with
--benchmark_repetitions and aggregates) and writes two PNGs into OUTDIR:
  rcache_vs_regions.png  hit, miss and eviction cost against the number of cached regions
  rcache_hit_threads.png hit cost per operation against the number of threads

usage: bench/plot_rcache.py RESULTS.json OUTDIR   (Debian python3 with python3-matplotlib)
"""
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def medians(path):
    """{run_name: median CPU time in ns} for the median aggregates (or single runs)."""
    with open(path) as f:
        data = json.load(f)
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
    out = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = b.get("run_name", b["name"])
        out[name] = b["cpu_time"] * scale[b.get("time_unit", "ns")]
    return out


def series(m, pattern):
    """[(x, y)] for run names matching pattern, whose group 1 is x."""
    pts = []
    for name, t in m.items():
        g = re.fullmatch(pattern, name)
        if g:
            pts.append((int(g.group(1)), t))
    return sorted(pts)


def plot_vs_regions(m, outdir):
    # One colour per operation, solid for gmd and dashed for ucs_rcache, so that each pair reads
    # side by side.
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ops = (("hit", "RcacheHit", "RcacheHitLargeN", "tab:blue"),
           ("miss", "RcacheMiss", "RcacheMissLarge", "tab:orange"),
           ("evict", None, "RcacheEvictLarge", "tab:green"))
    for impl, style in (("gmd", "-o"), ("ucs", "--s")):
        label = "gmd" if impl == "gmd" else "ucs_rcache"
        for op, single, large, colour in ops:
            pts = [(1, m[f"{single}_{impl}"])] if single and f"{single}_{impl}" in m else []
            pts += series(m, rf"{large}_{impl}/(\d+)")
            if pts:
                ax.plot(*zip(*pts), style, color=colour, label=f"{op}, {label}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cached regions (evict: the cache is full at that many)")
    ax.set_ylabel("CPU time per operation (ns, median)")
    ax.set_title("Registration cache: hit, miss and eviction cost vs cached regions")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(ncol=2, fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "rcache_vs_regions.png"), dpi=110)


def plot_threads(m, outdir):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for impl, style in (("gmd", "-o"), ("ucs", "--s")):
        pts = series(m, rf"RcacheHitThreads_{impl}/threads:(\d+)")
        if pts:
            ax.plot(*zip(*pts), style, label="gmd" if impl == "gmd" else "ucs_rcache")
            for x, y in pts:
                ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("threads (each hitting its own region of one cache)")
    ax.set_ylabel("CPU time per hit, per thread (ns, median)")
    ax.set_title("Registration cache: hit cost per operation vs threads")
    # Logarithmic: ucs_rcache's read-write lock can cost a hundred times gmd's hit under
    # contention, which on a linear axis flattens gmd's line to nothing.
    ax.set_yscale("log")
    ax.set_xticks([1, 2, 4])
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "rcache_hit_threads.png"), dpi=110)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    m = medians(sys.argv[1])
    os.makedirs(sys.argv[2], exist_ok=True)
    plot_vs_regions(m, sys.argv[2])
    plot_threads(m, sys.argv[2])


if __name__ == "__main__":
    main()
