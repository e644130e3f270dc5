#!/usr/bin/env bash
# Rounds of TCP loopback bandwidth, side by side: ucx_perftest tag_bw, tag_bw -e (endpoints with
# error handling, as ferry's), ferry's defaults and ferry with 2 lanes over 2 workers. One
# markdown row per round: round, load, the four GB/s, then ferry / tag_bw, ferry / tag_bw -e and
# 2 x 2 / tag_bw (bench/results/ucx_two_process.md).
# Usage: [ROUNDS=5] [SIZE=1048576] [BATCH=16] bench/ucx_tcp_rounds.sh [ferry binary]
set -euo pipefail
cd "$(dirname "$0")/.."
F=${1:-build/release/tools/ferry}
ROUNDS=${ROUNDS:-5}
SIZE=${SIZE:-1048576}
BATCH=${BATCH:-16}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT
# shellcheck source=bench/two_process_lib.sh
source bench/two_process_lib.sh
run() {
  : >"$tmp/listen"
  env UCX_TLS=tcp "$F" bench --listen 127.0.0.1:0 --max-bytes $((SIZE*BATCH)) --transport ucx "$@" >"$tmp/listen" 2>&1 &
  local s=$! a
  a=$(listen_address "$tmp/listen")
  env UCX_TLS=tcp "$F" bench --peer "$a" --transport ucx --max-bytes $((SIZE*BATCH)) --sizes "$SIZE" --batches "$BATCH" --min-time 1 --json "$tmp/o.json" "$@" >/dev/null
  wait "$s" || true
  python3 -c "import json,sys; print('%.2f' % json.load(open(sys.argv[1]))['points'][0]['gbps'])" "$tmp/o.json"
}
iters=$([ "$SIZE" -gt 1048576 ] && echo 40 || echo 400)
for r in $(seq "$ROUNDS"); do
  tag=$(mb_to_gb "$(perftest tcp tag_bw "$SIZE" "$iters")")
  tage=$(mb_to_gb "$(perftest tcp tag_bw "$SIZE" "$iters" -e -e)")
  fd=$(run)
  f2=$(run --ucx-lanes 2 --ucx-workers 2)
  echo "| $r | $(cut -d' ' -f1 /proc/loadavg) | $tag | $tage | $fd | $f2 | $(ratio "$fd" "$tag") | $(ratio "$fd" "$tage") | $(ratio "$f2" "$tag") |"
done
