#!/bin/bash
# A checkout under /tmp (where the guest has a tmpfs of its own) still works with run-in-vm: a copy of
# run-in-vm and vm/ under a fresh /tmp folder runs a command from there that reads a file of that
# "checkout" and writes its working directory. Runs on this machine (it starts the VM itself).
set -u
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/gmd-hidden-checkout.XXXXXX) || { echo "FAIL: mktemp"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/gtest/rxe"
cp -r "$src/run-in-vm" "$src/vm" "$tmp/gtest/rxe/"
echo "marker $$" >"$tmp/marker"
cd "$tmp" || exit 1
out=$(gtest/rxe/run-in-vm -- sh -c 'pwd; cat marker' 2>&1)
rc=$?
if ((rc != 0)) || [[ $out != *"$tmp"*"marker $$"* ]]; then
  echo "FAIL: run-in-vm from $tmp exited $rc: $out"
  exit 1
fi
echo "PASS: run-in-vm runs a checkout under /tmp ($tmp)"
