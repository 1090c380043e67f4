#!/bin/bash
# gmd's registration cache against one UCX release's own ucs_rcache (bench/rcache_bench.cc), built and
# run in that release's Debian root, side by side in one gmd_bench run:
#
#   bench/rcache_compare.sh [SUITE] [REPS] [OUTDIR]
#     SUITE   bookworm (this machine's Debian 12 and UCX 1.13; the default), trixie (UCX 1.18) or sid
#             (UCX 1.23), the roots of packaging/debian-root.sh (built and cached on first use), or
#             pip:SPEC, one of NVIDIA's pip builds of UCX (packaging/pip-ucx.sh list), on this machine
#     REPS    repetitions of each benchmark (default 5); the tables use their medians
#     OUTDIR  where the results go (default build/rcache-SUITE)
#
# Builds gmd_bench alone (RelWithDebInfo, no tests) into build-bench-SUITE/, runs every Rcache
# benchmark, then writes into OUTDIR: results.json (Google Benchmark's JSON: each repetition and
# the aggregates), table.md (each case, gmd against ucs_rcache, the ratio of the medians and its
# goal from docs/rcache.md, the repetitions' spread, the ratio of the fastest repetitions) and,
# where python3-matplotlib is installed, the two plots of bench/plot_rcache.py. The table goes to
# stdout too. Run it on a quiet machine: the tables compare times of one run, and anything else
# running moves them. The repetitions of all benchmarks run in a random order (Google Benchmark's
# random interleaving): on a virtual machine whose speed moves with its neighbours (a plain loop's
# time went 1x-3.5x within a minute on one), gmd's row and ucs_rcache's then each see the fast and
# the slow phases, instead of one of them only.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
suite=${1:-bookworm}
reps=${2:-5}
source "$here/packaging/common.sh"
source "$here/packaging/root-env.sh"
name=$suite
[[ $suite == pip:* ]] && name=$("$here/packaging/pip-ucx.sh" name "${suite#pip:}")
out=${3:-$here/build/rcache-$name}
build=build-bench-$name

configure="cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGMD_BUILD_TESTS=OFF \
  -DGMD_BUILD_BENCH=ON -DGMD_WERROR=ON >/dev/null && cmake --build $build -j ${GMD_JOBS:-2} --target gmd_bench"
# Google Benchmark 1.8 on wants the minimum time with its unit (and warns at every benchmark
# without it); 1.7 (Debian 12) refuses the unit.
run="mt=0.5; $build/bench/gmd_bench --benchmark_min_time=0.5s --benchmark_filter='^\$' \
  >/dev/null 2>&1 && mt=0.5s
  $build/bench/gmd_bench --benchmark_filter=^Rcache --benchmark_repetitions=$reps \
  --benchmark_enable_random_interleaving=true \
  --benchmark_display_aggregates_only=true --benchmark_min_time=\$mt \
  --benchmark_out=$build/rcache.json --benchmark_out_format=json"
if [[ $suite == bookworm ]]; then
  in_place() { (cd "$here" && bash -c "$*"); }
elif [[ $suite == pip:* ]]; then
  spec=${suite#pip:}
  # pip-ucx.sh configures against the wheel (its pkg-config files) and builds.
  configure="packaging/pip-ucx.sh build '$spec' '$here/$build' -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGMD_BUILD_TESTS=OFF -DGMD_BUILD_BENCH=ON -- --target gmd_bench"
  pip_env=$("$here/packaging/pip-ucx.sh" env "$spec")
  in_place() { (cd "$here" && eval "$pip_env" && bash -c "$*"); }
else
  root=$("$here/packaging/debian-root.sh" "$suite")
  in_place() { gmd_in_root "$root" "$*"; }
fi
in_place "$configure" >&2
in_place "$run >/dev/null" >&2
mkdir -p "$out"
cp "$here/$build/rcache.json" "$out/results.json"
cpu=$(sed -n 's/^model name[[:space:]]*: //p;T;q' /proc/cpuinfo)
ucx=$(in_place "ucx_info -v" | sed -n 's/^# \(Library version:\|Version\) //p')
ucx=${ucx%%$'\n'*}  # the first (sed reads to the end: ucx_info sees no closed pipe under pipefail)
{
  echo "UCX $ucx, $(nproc) CPUs ($cpu), load average $(cut -d' ' -f1-3 /proc/loadavg) after the run," \
    "medians of $reps repetitions"
  echo
  /usr/bin/python3 "$here/bench/plot_rcache.py" --table "$out/results.json"
} | tee "$out/table.md"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  /usr/bin/python3 "$here/bench/plot_rcache.py" "$out/results.json" "$out" "UCX $ucx, $cpu"
  echo "plots: $out/rcache_vs_regions.png $out/rcache_hit_threads.png" >&2
else
  echo "no plots: python3-matplotlib is not installed" >&2
fi
