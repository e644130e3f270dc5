#!/usr/bin/env bash
# ctest embed_serve_test: `ferry embed-serve` on its socket and its memory.
# - A second service on a live socket is refused (exit 1, one line), and the first one keeps
#   its socket and serves on.
# - A stale socket (its service killed, nobody listening) is replaced.
# - The default synthetic table (about 95 GiB) is refused, with the size it needs, on a machine
#   without that much memory available; every flag is checked before the table is built.
# - --json FILE holds the counters at exit (after SIGTERM).
# Usage: tools/embed_serve_test.sh FERRY_BINARY
set -uo pipefail
ferry=$1
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
small=(--base-vocab 1000 --embed-dim 64 --uva off)
sock="$tmp/embed.sock"

# wait_ready FILE PID: until the service wrote its ready file (10 s at most).
wait_ready() {
  for _ in $(seq 200); do
    [ -s "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

"$ferry" embed-serve --socket "$sock" --ready-file "$tmp/ready1" "${small[@]}" > "$tmp/first" 2>&1 &
first=$!
pids+=("$first")
wait_ready "$tmp/ready1" "$first" || { cat "$tmp/first"; fail "the first service did not start"; exit 1; }

# A second one on the live socket: refused, and the socket stays the first one's.
rc=0
timeout 20 "$ferry" embed-serve --socket "$sock" "${small[@]}" > "$tmp/out" 2> "$tmp/err" || rc=$?
if [ "$rc" -ne 1 ] || ! grep -qF "another service accepts connections there" "$tmp/err" || [ "$(wc -l < "$tmp/err")" -ne 1 ]; then
  fail "a second service on a live socket -> exit $rc:"
  cat "$tmp/out" "$tmp/err"
fi
[ -S "$sock" ] || fail "the refused service removed the live socket"
kill -0 "$first" 2>/dev/null || fail "the first service is gone"
python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect(sys.argv[1])' "$sock" ||
  fail "the first service no longer accepts on its socket"

# Killed without a chance to clean up: its socket file stays, stale. A new service replaces it.
kill -9 "$first"
wait "$first" 2>/dev/null
[ -S "$sock" ] || echo "note: the killed service's socket file is gone; the stale case is not exercised"
"$ferry" embed-serve --socket "$sock" --ready-file "$tmp/ready2" --json "$tmp/stats.json" "${small[@]}" > "$tmp/second" 2>&1 &
second=$!
pids+=("$second")
if wait_ready "$tmp/ready2" "$second"; then
  kill -TERM "$second"
  rc=0
  wait "$second" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$tmp/second"; fail "the service over the stale socket exited $rc on SIGTERM"; }
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["stopped_by_signal"] == 15 and "steps_ok" in d["stats"], d' \
    "$tmp/stats.json" || fail "--json at exit: $(cat "$tmp/stats.json" 2>&1)"
else
  cat "$tmp/second"
  fail "a service over a stale socket did not start"
fi

# The default table: refused with the size it needs where the memory is not there.
avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
if [ "$avail_kib" -lt $((96 * 1024 * 1024)) ]; then
  rc=0
  start=$(date +%s)
  timeout 60 "$ferry" embed-serve --socket "$tmp/default.sock" > "$tmp/out" 2> "$tmp/err" || rc=$?
  took=$(($(date +%s) - start))
  if [ "$rc" -ne 1 ] || [ "$took" -gt 10 ] || ! grep -qE "needs [0-9.]+ GiB, more than the [0-9.]+ (GiB|MiB) of memory available" "$tmp/err"; then
    fail "the default table on a machine with $((avail_kib / 1024 / 1024)) GiB available -> exit $rc after ${took}s:"
    cat "$tmp/out" "$tmp/err"
  fi
  [ ! -e "$tmp/default.sock" ] || fail "the refused service left a socket"
else
  echo "note: $((avail_kib / 1024 / 1024)) GiB available; the default table fits, its refusal is not tested"
fi

[ "$failures" -eq 0 ] && echo "embed_serve_test: live socket refused, stale socket replaced, oversized table refused"
exit $((failures > 0))
