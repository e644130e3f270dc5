#!/usr/bin/env bash
# ctest metrics_cli_test: `ferry metrics` beside a running engine (a `ferry bench --listen` with
# --metrics-port): it prints the engine's /metrics as text and as JSON, and `--serve` serves one
# /metrics merging that engine's with a target that is down (ferry_metrics_target_up 1 and 0).
# The engine's endpoint is asked for through the environment (FERRY_METRICS_PORT): the CLI's
# engines start from EngineOptions::FromEnv, and a flag given overrides a variable.
# Usage: tools/metrics_cli_test.sh FERRY_BINARY
set -euo pipefail
ferry=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT

# A flag given wins over the variable: no endpoint. A bad variable is refused, naming it.
FERRY_METRICS_PORT=-1 "$ferry" bench --sizes 4K --batches 1 --min-time 0.01 --metrics-port 0 > "$tmp/off" 2>&1 ||
  { cat "$tmp/off"; exit 1; }
! grep -q '/metrics' "$tmp/off" || { cat "$tmp/off"; echo "--metrics-port 0 did not override FERRY_METRICS_PORT"; exit 1; }
set +e
FERRY_COPY_THREADS=bogus "$ferry" demo --layers 2 --blocks 4 --block-bytes 4K > "$tmp/bad" 2>&1; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "FERRY_COPY_THREADS" "$tmp/bad" || { cat "$tmp/bad"; echo "demo ignored FERRY_COPY_THREADS"; exit 1; }

FERRY_METRICS_PORT=-1 "$ferry" bench --listen 127.0.0.1:0 --max-bytes 1M > "$tmp/engine" 2>&1 &
for _ in $(seq 100); do grep -qE '127\.0\.0\.1:[0-9]+/metrics' "$tmp/engine" && break; sleep 0.1; done
port=$(grep -oE '127\.0\.0\.1:[0-9]+/metrics' "$tmp/engine" | head -1 | sed -E 's/.*:([0-9]+)\/metrics/\1/')
[ -n "$port" ] || { cat "$tmp/engine"; echo "no engine metrics port printed"; exit 1; }

"$ferry" metrics "127.0.0.1:$port" > "$tmp/text" || { cat "$tmp/text"; exit 1; }
grep -q '^# TYPE ferry_transfers_total counter$' "$tmp/text" || { cat "$tmp/text"; echo "metrics: no text"; exit 1; }
"$ferry" metrics "http://localhost:$port/metrics" --json - > "$tmp/json" || { cat "$tmp/json"; exit 1; }
python3 - "$tmp/json" <<'PY' || { cat "$tmp/json"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
peers = [k for k in d if k.startswith("ferry_peers{engine=")]
assert len(peers) == 1 and d[peers[0]] == 0, d
PY

# Nothing listening: exit 1 and one line; no endpoint and no --serve: bad usage (exit 2).
set +e
"$ferry" metrics 127.0.0.1:1 --timeout 2 2> "$tmp/err"; rc=$?
"$ferry" metrics 2> /dev/null; rc_usage=$?
set -e
[ "$rc" = 1 ] && grep -q "ferry metrics:" "$tmp/err" || { cat "$tmp/err"; echo "down target: rc $rc"; exit 1; }
[ "$rc_usage" = 2 ] || { echo "no endpoint: rc $rc_usage, want 2"; exit 1; }

"$ferry" metrics --serve 0 --targets "127.0.0.1:$port,127.0.0.1:1" --timeout 2 > "$tmp/serve" 2>&1 &
server=$!
for _ in $(seq 100); do grep -q 'serving http://' "$tmp/serve" && break; sleep 0.1; done
url=$(grep -oE 'http://[0-9.]+:[0-9]+/metrics' "$tmp/serve" | head -1)
[ -n "$url" ] || { cat "$tmp/serve"; echo "metrics --serve: no address printed"; exit 1; }
python3 - "$url" "$port" <<'PY' || { cat "$tmp/serve"; exit 1; }
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=20).read().decode()
assert text.count("# TYPE ferry_peers gauge") == 1, text
assert f'ferry_metrics_target_up{{target="127.0.0.1:{sys.argv[2]}"}} 1' in text, text
assert 'ferry_metrics_target_up{target="127.0.0.1:1"} 0' in text, text
assert "ferry_peers{engine=" in text, text
PY
kill -TERM "$server"
wait "$server" || { cat "$tmp/serve"; echo "metrics --serve did not exit 0 on SIGTERM"; exit 1; }
echo "metrics: printed (text, JSON) and served merged, a down target marked 0"
