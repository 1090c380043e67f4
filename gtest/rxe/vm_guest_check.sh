#!/bin/bash
# The soft-RoCE VM's speed settings (gtest/rxe/README.md, "What the guest has") are in effect:
#  - rxe's ICRC runs on crc32_pclmul: where the guest's CPU has PCLMULQDQ (the default model does),
#    the kernel's "crc32" of highest priority is crc32-pclmul and passed its self-test. Without it
#    every byte soft-RoCE moves goes through crc32_generic, at half the speed or less.
#  - the clock source is the TSC (tsc=reliable; kvm-clock under KVM), which the vDSO reads without
#    a system call;
#  - every ksoftirqd thread is real-time (SCHED_FIFO), so rxe's deferred packet work does not wait
#    for a scheduler tick behind busy-polling processes.
# Only inside the test VM (GMD_RXE_VM=1): on a host with RDMA devices of its own there is nothing to
# check (exit 77, skipped with the reason).
set -u
if [[ ${GMD_RXE_VM:-} != 1 ]]; then
  echo "SKIP: not in the soft-RoCE VM (real RDMA devices: no guest settings to check)"
  exit 77
fi
fail=0
if grep -qw pclmulqdq /proc/cpuinfo; then
  # /proc/crypto: blocks of "key : value" lines; the best crc32 is the one of highest priority.
  best=$(awk -F' *: *' '$1 == "name" { n = $2 } $1 == "driver" { d = $2 }
                        $1 == "priority" && n == "crc32" && $2 > p { p = $2; best = d }
                        $1 == "selftest" && n == "crc32" && d == best { ok = $2 }
                        END { print best, ok }' /proc/crypto)
  if [[ $best == "crc32-pclmul passed" ]]; then
    echo "rxe's ICRC: crc32-pclmul (self-test passed)"
  else
    echo "FAIL: the CPU has PCLMULQDQ but the kernel's best crc32 is '${best:-none}', not crc32-pclmul passed"
    fail=1
  fi
else
  echo "FAIL: the guest's CPU has no PCLMULQDQ (GMD_VM_CPU=${GMD_VM_CPU:-default}): rxe's ICRC runs on crc32_generic"
  fail=1
fi
clock=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)
if [[ $clock == tsc || $clock == kvm-clock ]]; then
  echo "clock source: $clock"
else
  echo "FAIL: the guest's clock source is '${clock:-unknown}', not tsc (or kvm-clock under KVM): every clock_gettime is a system call"
  fail=1
fi
n=0
for pid in $(pgrep -x 'ksoftirqd/[0-9]+'); do
  policy=$(chrt -p "$pid" | sed -n 's/.*scheduling policy: //p')
  ((++n))
  [[ $policy == SCHED_FIFO ]] || { echo "FAIL: ksoftirqd (pid $pid) runs $policy, not SCHED_FIFO"; fail=1; }
done
((n == $(nproc))) || { echo "FAIL: $n ksoftirqd threads for $(nproc) CPUs"; fail=1; }
((fail == 0)) && echo "PASS: crc32-pclmul for rxe, the TSC clock, $n ksoftirqd threads real-time"
exit $fail
