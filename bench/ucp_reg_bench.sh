#!/bin/bash
# Registration cost at the UCP level (bench/ucp_reg_bench.cc) for one UCX release, in the soft-RoCE
# VM: every UcpReg benchmark of BUILD's gmd_bench REPS times (default 3), each run in its own process
# with gmd's counters printed when its MDs close (UCX_GMD_PRINT_STATS=y). Prints one row per
# benchmark: the median time per iteration with the lowest and highest of the runs, and from gmd's
# counters of the median run the registrations that reached gmd's cache per iteration (hits, and
# misses: real registrations) and the bytes gmd had pinned when the MDs closed. rc_verbs rows have
# no gmd counters.
#
#   bench/ucp_reg_bench.sh BUILD [SUITE] [REPS] [FILTER]
#     BUILD   a build folder (build, build-trixie, build-sid)
#     SUITE   the Debian root it was built in (trixie, sid; default: none, this machine's UCX), or
#             pip:SPEC, the pip build of UCX it was built against (packaging/pip-ucx.sh build SPEC
#             BUILD -DGMD_BUILD_BENCH=ON; that UCX has no IB transports, so no rc_verbs rows)
#     FILTER  a regular expression on the benchmark names (default: all)
#
# Example: bench/ucp_reg_bench.sh build-sid sid 3 > ucp-reg-1.23.txt
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: bench/ucp_reg_bench.sh BUILD [SUITE] [REPS] [FILTER]}" && pwd) || exit 2
suite=${2:-}
reps=${3:-3}
filter=${4:-.}
bench=$build/bench/gmd_bench
[[ -x $bench ]] || { echo "no $bench (build with -DGMD_BUILD_BENCH=ON)" >&2; exit 2; }
root_args=()
env_file=/dev/null
if [[ $suite == pip:* ]]; then
  env_file=$build/ucp-reg-env.sh
  "$here/packaging/pip-ucx.sh" env "${suite#pip:}" >"$env_file" || exit 1
elif [[ -n $suite ]]; then
  root=$("$here/packaging/debian-root.sh" "$suite") || exit 1
  root_args=(--root "$root")
fi
# Under the checkout: the guest reads the script from there (it sees /tmp as its own).
mkdir -p "$here/build" && out=$(mktemp -d "$here/build/ucp-reg-bench.XXXXXX") || exit 1
[[ -n ${GMD_KEEP:-} ]] || trap 'rm -rf "$out"' EXIT

# In the guest: every benchmark REPS times, one process each; stdout and stderr kept per run.
cat >"$out/guest.sh" <<'EOF'
#!/bin/bash
bench=$1 reps=$2 filter=$3 dir=$4
source "$5"  # the UCX's environment (a pip build's library path), or nothing
ulimit -l unlimited
export UCX_GMD_PRINT_STATS=y
"$bench" --benchmark_list_tests | grep '^UcpReg/' | grep -E -- "$filter" >"$dir/names"
n=0
while read -r name; do
  n=$((n + 1))
  for r in $(seq "$reps"); do
    timeout 600 "$bench" --benchmark_filter="^${name}\$" --benchmark_format=csv \
      >"$dir/$n.$r.csv" 2>"$dir/$n.$r.err"
  done
done <"$dir/names"
EOF
chmod +x "$out/guest.sh"
# Every benchmark, its runs and the VM's start take longer than run-in-vm's default limit.
GMD_VM_TIMEOUT=${GMD_VM_TIMEOUT:-5400} GMD_VM_RESULTS_DIR=$out "$here/gtest/rxe/run-in-vm" "${root_args[@]}" -- \
  bash -c "'$out/guest.sh' '$bench' '$reps' '$filter' \"\$GMD_VM_RESULTS\" '$env_file'" >&2 || exit 1

cpu=$(sed -n 's/^model name[[:space:]]*: //p;T;q' /proc/cpuinfo)
echo "# UcpReg, $reps runs each, host CPU: $cpu (the VM emulates it: compare rows of one run only)"
printf '%-34s %12s %22s %9s %9s %14s  %s\n' benchmark "us/iter" "(min - max)" hits/it \
  misses/it pinned_bytes label
n=0
while read -r name; do
  n=$((n + 1))
  short=${name%%/iterations:*}
  rows=()
  for r in $(seq "$reps"); do
    # Google Benchmark's CSV: name,iterations,real_time,cpu_time,time_unit,...,label,error...
    line=$(grep "^\"$name\"" "$out/$n.$r.csv" 2>/dev/null | head -n 1)
    if [[ -z $line || $line == *,true,* ]]; then
      rows+=("skip $r")
      continue
    fi
    t=$(echo "$line" | awk -F, '{print $3}')
    it=$(echo "$line" | awk -F, '{print $2}')
    # gmd's counters of every MD of both contexts of this run, summed.
    read -r hits misses pinned < <(awk '/^gmd .*reg_hits=/ {
        for (i = 1; i <= NF; ++i) { split($i, kv, "="); c[kv[1]] += kv[2] } }
        END { printf "%d %d %d\n", c["reg_hits"], c["reg_misses"], c["pinned_bytes"] }' \
        "$out/$n.$r.err")
    label=$(echo "$line" | sed -n 's/.*"\(UCX [^"]*\)".*/\1/p')
    rows+=("$t $r $it $hits $misses $pinned|$label")
  done
  ok=$(printf '%s\n' "${rows[@]}" | grep -v '^skip' | sort -g)
  if [[ -z $ok ]]; then
    why=$(sed -n 's/.*,true,"\(.*\)"$/\1/p' "$out/$n".*.csv 2>/dev/null | head -n 1)
    printf '%-34s %s\n' "$short" "skipped: ${why:-see its output}"
    continue
  fi
  count=$(echo "$ok" | wc -l)
  med=$(echo "$ok" | sed -n "$(((count + 1) / 2))p")
  lo=$(echo "$ok" | head -n 1 | awk '{ printf "%.1f", $1 }')
  hi=$(echo "$ok" | tail -n 1 | awk '{ printf "%.1f", $1 }')
  read -r t _ it hits misses pinned <<<"${med%%|*}"
  if [[ $short == */rc_verbs ]]; then
    printf '%-34s %12.1f %22s %9s %9s %14s  %s\n' "$short" "$t" "($lo - $hi)" - - - "${med#*|}"
  else
    printf '%-34s %12.1f %22s %9.2f %9.2f %14s  %s\n' "$short" "$t" "($lo - $hi)" \
      "$(awk -v a="$hits" -v b="$it" 'BEGIN { print a / b }')" \
      "$(awk -v a="$misses" -v b="$it" 'BEGIN { print a / b }')" "$pinned" "${med#*|}"
  fi
done <"$out/names"
