#!/usr/bin/env bash
# gtest/common/script_pipes_check.sh SRC: the project's scripts test long command output without a pipe
# into a reader that quits early. Under pipefail, `echo "$out" | grep -q X` fails when grep finds X and
# quits before echo has written all of $out (echo dies of SIGPIPE, 141): packaging/test-pip.sh's install
# stage failed so, now and then, on a pip release's long ucx_info -c -f output.
#   1. a long text with its match on the first line: the pipe form fails on it (the text is long enough
#      to show the fault), packaging/common.sh's gmd_has finds the match every time and no match where
#      there is none;
#   2. no script that sets pipefail pipes into grep -q or grep -m.
set -uo pipefail
src=${1:?usage: script_pipes_check.sh SOURCE_DIR}
source "$src/packaging/common.sh" || exit 1
fail=0

text="UCX_GMD_RC_ALLOC=huge,thp,md,mmap,heap"$'\n'$(seq -f 'UCX_OTHER_%g=some value' 1 50000)
echo "a text of ${#text} bytes, its match on the first line"
echo "$text" | grep -q '^UCX_GMD_RC_'
rc=$?
if ((rc == 0)); then
  echo "FAIL: echo | grep -q did not fail on the long text (status 0): it does not show the fault"; fail=1
else
  echo "the pipe form fails on it, as expected (status $rc)"
fi
misses=0
for _ in $(seq 20); do gmd_has '^UCX_GMD_RC_' "$text" || misses=$((misses + 1)); done
((misses == 0)) || { echo "FAIL: gmd_has missed the match $misses times in 20"; fail=1; }
gmd_has 'gmd: built for' "$text" && { echo "FAIL: gmd_has found a line the text does not have"; fail=1; }
gmd_has '-x' "a line with -x in it" || { echo "FAIL: gmd_has took a pattern that starts with - as an option"; fail=1; }

scripts=$(grep -rlE --exclude-dir='build*' --exclude-dir=.git 'set .*pipefail' "$src/packaging" "$src/gtest" \
  "$src/bench" "$src/.ci" 2>/dev/null)
[[ -n $scripts ]] || { echo "FAIL: found no script that sets pipefail under $src"; fail=1; }
n=0
for f in $scripts; do
  n=$((n + 1))
  [[ $f == "${BASH_SOURCE[0]}" || $f -ef ${BASH_SOURCE[0]} ]] && continue
  bad=$(grep -nE '(^|[^|])\|[[:space:]]*grep([[:space:]]+-[[:alnum:]-]+)*[[:space:]]+-[[:alpha:]]*[qm]' "$f")
  [[ -z $bad ]] || { echo "FAIL: ${f#"$src"/} pipes into a grep that quits early:"; echo "$bad"; fail=1; }
done
((fail == 0)) && echo "PASS: gmd_has holds on long text; none of $n scripts with pipefail pipes into grep -q or -m"
exit $fail
