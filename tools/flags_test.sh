#!/usr/bin/env bash
# ctest flags_test: `ferry demo` and `ferry bench` refuse times that are not finite or out of
# range, and counts out of range, with exit status 2 and a message naming the flag, before any
# engine starts; `demo --role producer` says what it waits for and gives up at --side-timeout.
# Every parse error (unknown flag or command, bad or missing value) is exit 2 and one line;
# flags that would be ignored or fail late (--transport foo, --pings without --peer, --listen
# without --role, an unwritable --json) are refused up front; `bench --peer` at a dead address
# says what it waits for and gives up at --timeout.
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

# Parse errors: exit 2 (not CLI11's 105, 106, 109, ...) and one line naming the command.
refuses "ferry: a command is required"
refuses "ferry: unknown command 'bogus'" bogus
refuses "ferry bench: --op: foo not in {write,read}" bench --op foo
refuses "ferry bench: the following argument was not expected: --nope" bench --nope
refuses "ferry info: the following argument was not expected: extra" info extra
refuses "ferry demo: could not convert: --layers = x" demo --layers x
refuses "ferry embed-serve: --socket is required" embed-serve
refuses "ferry bench: --sizes: 1 required TEXT missing" bench --sizes
for args in "bogus" "bench --op foo" "bench --nope" "embed-serve"; do
  # shellcheck disable=SC2086
  lines=$("$ferry" $args 2>&1 >/dev/null | wc -l)
  [ "$lines" -eq 1 ] || { echo "FAIL: ferry $args printed $lines lines on stderr, expected 1"; failures=$((failures + 1)); }
done
# --help is no error.
"$ferry" bench --help | grep -qF -- "--transport" || { echo "FAIL: bench --help"; failures=$((failures + 1)); }

# Flags that would be ignored, or fail only after a long run, are refused first.
refuses "--transport foo: no such transport in this build" bench --sizes 4K --batches 1 --transport foo
refuses "--transport foo: no such transport in this build" demo "${small[@]}" --transport foo
refuses "--transport shm carries shared memory only: add --alloc shared" bench --sizes 4K --batches 1 --transport shm
refuses "--pings times notifications to another process: it needs --peer" bench --sizes 4K --batches 1 --pings 10
refuses "--pings must be in 0..10000000" bench --sizes 4K --batches 1 --peer 127.0.0.1:1 --pings -1
refuses "--timeout must be a number of seconds" bench --peer 127.0.0.1:1 --sizes 4K --batches 1 --timeout nan
refuses "--timeout is how long one process waits for the other" bench --sizes 4K --batches 1 --timeout 5
refuses "--listen is the consumer's side channel: add --role consumer" demo "${small[@]}" --listen 127.0.0.1:0
refuses "--peer is the consumer the producer dials: add --role producer" demo "${small[@]}" --peer 127.0.0.1:1
refuses "--listen is the consumer's: the producer dials it" demo "${small[@]}" --role producer --peer 127.0.0.1:1 --listen 127.0.0.1:0
refuses "--json $tmp/no/such.json: folder $tmp/no does not exist" bench --sizes 4K --batches 1 --json "$tmp/no/such.json"
refuses "--json $tmp/no/such.json: folder $tmp/no does not exist" demo "${small[@]}" --json "$tmp/no/such.json"
refuses "--json $tmp is not a regular file" info --json "$tmp"

# `bench --peer` at an address where nothing listens: a line on stderr says what it waits for,
# and it stops at --timeout with one line naming the address.
start=$(date +%s)
rc=0
timeout 20 "$ferry" bench --peer "127.0.0.1:$port" --timeout 1 --sizes 4K --batches 1 > "$tmp/out" 2> "$tmp/err" || rc=$?
took=$(($(date +%s) - start))
if [ "$rc" -ne 1 ] || [ "$took" -gt 5 ] || ! grep -qF "connecting to the listener at 127.0.0.1:$port, for up to 1 s (--timeout)" "$tmp/err" ||
  ! grep -qF "no \`ferry bench --listen\` answered at 127.0.0.1:$port within 1 s" "$tmp/err"; then
  echo "FAIL: bench --peer with no listener -> exit $rc after ${took}s:"
  cat "$tmp/out" "$tmp/err"
  failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] && echo "flags_test: every bad flag refused"
exit $((failures > 0))
