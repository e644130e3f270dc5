#!/usr/bin/env bash
# ctest metrics_embed_test: `ferry embed-serve --metrics-port -1` (host mode, a small synthetic
# table) serves GET /metrics while it runs: read with `ferry metrics`, as text and as JSON, it
# holds the service's counters and its phase histogram family; SIGTERM still stops it (exit 0).
# (The histograms' contents during a run of steps: embed_service_test's EmbedStatsPrometheusTest.)
# Usage: tools/metrics_embed_test.sh FERRY_BINARY
set -euo pipefail
ferry=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT

"$ferry" embed-serve --socket "$tmp/embed.sock" --base-vocab 1000 --embed-dim 64 --uva off --metrics-port -1 \
  > "$tmp/serve" 2>&1 &
service=$!
for _ in $(seq 200); do grep -qE 'metrics on http://' "$tmp/serve" && break; sleep 0.05; done
address=$(grep -oE 'http://127\.0\.0\.1:[0-9]+/metrics' "$tmp/serve" | head -1)
[ -n "$address" ] || { cat "$tmp/serve"; echo "embed-serve: no metrics address printed"; exit 1; }

"$ferry" metrics "$address" > "$tmp/text" || { cat "$tmp/text" "$tmp/serve"; exit 1; }
for family in "ferry_embed_phase_seconds histogram" "ferry_embed_steps_total counter" "ferry_embed_live_clients gauge"; do
  grep -qx "# TYPE $family" "$tmp/text" || { cat "$tmp/text"; echo "embed-serve /metrics: no $family"; exit 1; }
done
"$ferry" metrics "$address" --json - > "$tmp/json"
python3 - "$tmp/json" <<'PY' || { cat "$tmp/json"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ferry_embed_registrations_total"] == 0 and d['ferry_embed_steps_total{result="ok"}'] == 0, d
PY
kill -TERM "$service"
wait "$service" || { cat "$tmp/serve"; echo "embed-serve with --metrics-port did not exit 0 on SIGTERM"; exit 1; }
echo "embed-serve --metrics-port: /metrics served while running, stopped by SIGTERM"
