#!/usr/bin/env bash
# ctest flags_test: `ferry demo` and `ferry bench` refuse times that are not finite or out of
# range, and counts out of range, with exit status 2 and a message naming the flag, before any
# engine starts; `demo --role producer` says what it waits for and gives up at --side-timeout.
# Usage: tools/flags_test.sh FERRY_BINARY
set -uo pipefail
ferry=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# refuses EXPECTED_TEXT ARGS...: `ferry ARGS` exits with status 2 (invalid argument) within 10 s
# and prints EXPECTED_TEXT.
refuses() {
  local text=$1 rc=0
  shift
  timeout 10 "$ferry" "$@" > "$tmp/out" 2>&1 || rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF -- "$text" "$tmp/out"; then
    echo "FAIL: ferry $* -> exit $rc, expected 2 and '$text':"
    cat "$tmp/out"
    failures=$((failures + 1))
  fi
}

small=(--layers 1 --blocks 2 --block-bytes 8K)
for bad in inf -inf nan 1e300 0 -1 86401; do
  refuses "--deadline must be a number of seconds" demo "${small[@]}" --deadline "$bad"
  refuses "--side-timeout must be a number of seconds" demo "${small[@]}" --side-timeout "$bad"
  refuses "--deadline must be a number of seconds" bench --sizes 4K --batches 1 --deadline "$bad"
  refuses "--deadline must be a number of seconds" bench --listen 127.0.0.1:0 --max-bytes 4K --deadline "$bad"
done
for bad in inf nan 1e300 -1; do
  refuses "--min-time must be a number of seconds" bench --sizes 4K --batches 1 --min-time "$bad"
done
# Copy threads out of range are INVALID_ARGUMENT from the engine, not an abort.
refuses "copy_threads must be in 0..1024" demo "${small[@]}" --threads 100000
refuses "copy_threads must be in 0..1024" bench --sizes 4K --batches 1 --threads -1

# A producer whose consumer is not there: it says what it waits for, and stops at --side-timeout.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s)
rc=0
timeout 20 "$ferry" demo --role producer --peer "127.0.0.1:$port" --side-timeout 1 "${small[@]}" > "$tmp/out" 2>&1 || rc=$?
took=$(($(date +%s) - start))
if [ "$rc" -ne 1 ] || [ "$took" -gt 5 ] || ! grep -qF "connecting to the consumer at 127.0.0.1:$port, for up to 1 s" "$tmp/out" ||
  ! grep -qF "no consumer answered at 127.0.0.1:$port" "$tmp/out"; then
  echo "FAIL: producer with no consumer -> exit $rc after ${took}s:"
  cat "$tmp/out"
  failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] && echo "flags_test: every bad flag refused"
exit $((failures > 0))
