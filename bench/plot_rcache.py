#!/usr/bin/python3
"""Plots of the registration cache benchmarks (bench/rcache_bench.cc), gmd against ucs_rcache.

Reads Google Benchmark's JSON (--benchmark_out=FILE --benchmark_out_format=json, with
--benchmark_repetitions and aggregates) and writes two PNGs into OUTDIR:
  rcache_vs_regions.png  hit, miss and eviction cost against the number of cached regions
  rcache_hit_threads.png hit cost per operation against the number of threads
With --table it prints instead a Markdown table of every case: gmd's and ucs_rcache's medians, the
ratio, the goal docs/rcache.md sets for it and whether this run meets it, the repetitions'
coefficient of variation, and, where the JSON holds the repetitions themselves (not only their
aggregates), the ratio of each side's fastest repetition (bench/rcache_compare.sh runs both); below
it, the interface's part of a gmd hit (RcacheCallFloor) and any gmd hit row some of whose hits took
the writer lock. On a machine whose speed moves with its neighbours, noise only ever adds time: the
fastest repetitions are the ones it touched least, and their ratio moves less from run to run than
the medians'.

usage: bench/plot_rcache.py RESULTS.json OUTDIR [LABEL]   (Debian python3 with python3-matplotlib;
       LABEL, e.g. the UCX release and the processor, goes into the plots' titles)
       bench/plot_rcache.py --table RESULTS.json
"""
import json
import os
import re
import sys


def aggregates(path):
    """{run_name: {aggregate or "single": the benchmark's record, "reps": its repetitions'}}."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        kind = b.get("aggregate_name", "single") if b.get("run_type") == "aggregate" else "single"
        a = out.setdefault(b.get("run_name", b["name"]), {})
        a[kind] = b
        if kind == "single":
            a.setdefault("reps", []).append(b)
    return out


def fastest(a):
    """The fastest repetition's CPU time in ns; None when the JSON holds no repetitions."""
    reps = a.get("reps", [])
    return min(ns(b) for b in reps) if len(reps) > 1 else None


def ns(b):
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
    return b["cpu_time"] * scale[b.get("time_unit", "ns")]


def central(a):
    """A benchmark's median record (its single run's without repetitions); None when it has none."""
    return a.get("median", a.get("single")) if a else None


def medians(path):
    """{run_name: median CPU time in ns} for the median aggregates (or single runs)."""
    return {name: ns(central(a)) for name, a in aggregates(path).items()
            if "median" in a or "single" in a}


def cv(a):
    """The repetitions' coefficient of variation of CPU time (None for a single run)."""
    if "stddev" not in a or "mean" not in a or ns(a["mean"]) == 0:
        return None
    return ns(a["stddev"]) / ns(a["mean"])


# (case, gmd's run, the reference run, goal: the ratio gmd / reference may not exceed)
CASES = [
    ("hit, 1 thread", "RcacheHit_gmd", "RcacheHit_ucs", 0.6),
    ("hit, 1 of 100k regions", "RcacheHitLargeN_gmd/100000", "RcacheHitLargeN_ucs/100000", 0.6),
    ("hit, two buffers in turn", "RcacheHitTwo_gmd", "RcacheHitTwo_ucs", 0.6),
    ("hit, 4 threads, per op, against gmd's 1 thread", "RcacheHitThreads_gmd/threads:4",
     "RcacheHitThreads_gmd/threads:1", 1.1),
    ("miss, empty cache", "RcacheMiss_gmd", "RcacheMiss_ucs", 0.8),
] + [(f"miss among {n // 1000}k regions", f"RcacheMissLarge_gmd/{n}", f"RcacheMissLarge_ucs/{n}",
      0.8) for n in (1000, 10000, 100000)] + [
    (f"evict among {n // 1000}k regions", f"RcacheEvictLarge_gmd/{n}",
     f"RcacheEvictLarge_ucs/{n}", 0.8) for n in (1000, 10000, 100000)] + [
    ("invalidate 64 regions", "RcacheInvalidate_gmd", "RcacheInvalidate_ucs", 0.8),
]


def table(path):
    agg = aggregates(path)

    def fmt(t):
        return f"{t / 1000:.2f} us" if t >= 1000 else f"{t:.1f} ns"

    def spread(a):
        c = cv(a)
        return "-" if c is None else f"{100 * c:.1f}%"

    print("| case | gmd | reference | ratio | goal | cv gmd / ref | fastest: gmd / ref |")
    print("|---|---|---|---|---|---|---|")
    for case, mine, ref, goal in CASES:
        if mine not in agg or ref not in agg:
            print(f"| {case} | not run | | | <= {goal} | | |")
            continue
        a, b = agg[mine], agg[ref]
        t, u = ns(central(a)), ns(central(b))
        ratio = t / u
        verdict = "met" if ratio <= goal else "**not met**"
        fa, fb = fastest(a), fastest(b)
        quick = "-" if fa is None or fb is None else f"{fmt(fa)} / {fmt(fb)}: {fa / fb:.2f}x"
        print(f"| {case} | {fmt(t)} | {fmt(u)} | {ratio:.2f}x | <= {goal}: {verdict} | "
              f"{spread(a)} / {spread(b)} | {quick} |")
    rec = central(agg.get("RcacheHitLargeN_gmd/100000"))
    ucs = central(agg.get("RcacheHitLargeN_ucs/100000"))
    if rec and "bytes/region" in rec:
        mine = rec["bytes/region"]
        theirs = ucs.get("bytes/region") if ucs else None
        verdict = "met" if mine <= 96 else "**not met**"
        print(f"| memory per cached region (100k) | {mine:.1f} B | "
              f"{'-' if theirs is None else f'{theirs:.1f} B'} | | <= 96 B: {verdict} | | |")
    # Below the table: how much of gmd's hit is the interface (the same calls into a do-nothing
    # cache), and whether any of its hits went under the writer lock.
    hit, floor = central(agg.get("RcacheHit_gmd")), central(agg.get("RcacheCallFloor"))
    if hit and floor:
        print(f"\nthe interface's part of a gmd hit (RcacheCallFloor): {fmt(ns(floor))} of "
              f"{fmt(ns(hit))}")
    for name in ("RcacheHit_gmd", "RcacheHitTwo_gmd", "RcacheHitLargeN_gmd/100000"):
        a = central(agg.get(name))
        if a and a.get("locked/hit", 0) > 0:
            print(f"{name}: {100 * a['locked/hit']:.2f}% of its hits under the writer lock")


def series(m, pattern):
    """[(x, y)] for run names matching pattern, whose group 1 is x."""
    pts = []
    for name, t in m.items():
        g = re.fullmatch(pattern, name)
        if g:
            pts.append((int(g.group(1)), t))
    return sorted(pts)


def plot_vs_regions(m, outdir, label):
    import matplotlib.pyplot as plt
    # One colour per operation, solid for gmd and dashed for ucs_rcache, so that each pair reads
    # side by side.
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ops = (("hit", "RcacheHit", "RcacheHitLargeN", "tab:blue"),
           ("miss", "RcacheMiss", "RcacheMissLarge", "tab:orange"),
           ("evict", None, "RcacheEvictLarge", "tab:green"))
    for impl, style in (("gmd", "-o"), ("ucs", "--s")):
        name = "gmd" if impl == "gmd" else "ucs_rcache"
        for op, single, large, colour in ops:
            pts = [(1, m[f"{single}_{impl}"])] if single and f"{single}_{impl}" in m else []
            pts += series(m, rf"{large}_{impl}/(\d+)")
            if pts:
                ax.plot(*zip(*pts), style, color=colour, label=f"{op}, {name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cached regions (evict: the cache is full at that many)")
    ax.set_ylabel("CPU time per operation (ns, median)")
    ax.set_title("Registration cache: hit, miss and eviction cost vs cached regions" + label)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(ncol=2, fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "rcache_vs_regions.png"), dpi=110)


def plot_threads(m, outdir, label):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for impl, style in (("gmd", "-o"), ("ucs", "--s")):
        pts = series(m, rf"RcacheHitThreads_{impl}/threads:(\d+)")
        if pts:
            ax.plot(*zip(*pts), style, label="gmd" if impl == "gmd" else "ucs_rcache")
            for x, y in pts:
                ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("threads (each hitting its own region of one cache)")
    ax.set_ylabel("CPU time per hit, per thread (ns, median)")
    ax.set_title("Registration cache: hit cost per operation vs threads" + label)
    # Logarithmic: ucs_rcache's read-write lock can cost a hundred times gmd's hit under
    # contention, which on a linear axis flattens gmd's line to nothing.
    ax.set_yscale("log")
    ax.set_xticks([1, 2, 4])
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "rcache_hit_threads.png"), dpi=110)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        table(sys.argv[2])
        return
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    import matplotlib
    matplotlib.use("Agg")
    label = f"\n{sys.argv[3]}" if len(sys.argv) == 4 else ""
    m = medians(sys.argv[1])
    os.makedirs(sys.argv[2], exist_ok=True)
    plot_vs_regions(m, sys.argv[2], label)
    plot_threads(m, sys.argv[2], label)


if __name__ == "__main__":
    main()
