#!/usr/bin/env bash
# ferry's `ucx` transport between two processes of this machine against ucx_perftest (Debian's
# ucx-utils), side by side in one run: shared memory (UCX's default choice) and TCP only.
# Usage: bench/ucx_two_process.sh [ferry binary]   (prints markdown tables)
# Env: PINGS (notification round trips, default 5000); ONLY=latency prints only the
# notification table (for repeated rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
F=${1:-build/release/tools/ferry}
PINGS=${PINGS:-5000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT

# shellcheck source=bench/two_process_lib.sh
source bench/two_process_lib.sh

# ferry_run TLS BYTES ARGS... : a `ferry bench --listen` process and a `--peer` run against it
# with ARGS (both get the --ucx-* flags among ARGS); the peer's stdout goes to $tmp/out.txt.
ferry_run() {
  local tls=$1 bytes=$2
  shift 2
  local i=0 args=("$@") ucx_flags=()
  while [ $i -lt ${#args[@]} ]; do
    if [[ ${args[$i]} == --ucx-* ]]; then ucx_flags+=("${args[$i]}" "${args[$((i + 1))]}"); i=$((i + 1)); fi
    i=$((i + 1))
  done
  : >"$tmp/listen"  # not the previous listener's address
  env UCX_TLS="$tls" "$F" bench --listen 127.0.0.1:0 --max-bytes "$bytes" --transport ucx "${ucx_flags[@]}" \
    >"$tmp/listen" 2>&1 &
  local server=$! address
  address=$(listen_address "$tmp/listen")
  env UCX_TLS="$tls" "$F" bench --peer "$address" --transport ucx --max-bytes "$bytes" "$@" >"$tmp/out.txt"
  wait "$server" || true
}

ferry_bw() {  # ferry_bw TLS SIZE BATCH [--ucx-* flags] -> GB/s of write batches of BATCH pieces of SIZE
  local tls=$1 size=$2 batch=$3
  shift 3
  ferry_run "$tls" $((size * batch)) --sizes "$size" --batches "$batch" --min-time 1 --json "$tmp/out.json" "$@"
  python3 -c "import json,sys; print('%.2f' % json.load(open(sys.argv[1]))['points'][0]['gbps'])" "$tmp/out.json"
}

ferry_ping() {  # ferry_ping TLS PROGRESS -> "median (p99)" one-way us of notification round trips
  ferry_run "$1" 4096 --sizes 4096 --batches 1 --min-time 0.1 --pings "$PINGS" --ucx-progress "$2"
  sed -n 's/.*median \([0-9.]*\) us, p99 \([0-9.]*\) us.*/\1 (\2)/p' "$tmp/out.txt"
}


echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
if [ "${ONLY:-}" != latency ]; then
# ucx_perftest keeps a window of messages in flight; ferry's side posts batches of 16 pieces of
# 1 MiB (and of 4 pieces of 64 MiB), so that both have several messages in flight.
# tag_bw -e: endpoints with peer-failure handling, as ferry's (with which UCX 1.13 gives TCP no
# zero-copy RMA lane, so rendezvous data is copied once more at the receiver).
echo "| link | piece | ferry write GB/s | ucp_put_bw GB/s | tag_bw GB/s | tag_bw -e GB/s | ferry / put_bw | ferry / tag_bw | ferry / tag_bw -e |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for tls in "all" "tcp"; do
  for size in 1048576 67108864; do
    iters=$([ "$size" -gt 1048576 ] && echo 20 || echo 200)
    put=$(mb_to_gb "$(perftest "$tls" ucp_put_bw "$size" "$iters")")
    tag=$(mb_to_gb "$(perftest "$tls" tag_bw "$size" "$iters")")
    tage=$(mb_to_gb "$(perftest "$tls" tag_bw "$size" "$iters" -e -e)")
    fw=$(ferry_bw "$tls" "$size" "$([ "$size" -gt 1048576 ] && echo 4 || echo 16)")
    echo "| UCX_TLS=$tls | $((size >> 20)) MiB | $fw | $put | $tag | $tage | $(ratio "$fw" "$put") | $(ratio "$fw" "$tag") | $(ratio "$fw" "$tage") |"
  done
done
echo
# The workers knob: two lanes per peer, dealt over one or two workers (progress threads).
echo "| link | piece | ferry, 2 lanes, 1 worker GB/s | ferry, 2 lanes, 2 workers GB/s |"
echo "| --- | --- | ---: | ---: |"
for tls in "all" "tcp"; do
  w1=$(ferry_bw "$tls" 1048576 16 --ucx-lanes 2 --ucx-workers 1)
  w2=$(ferry_bw "$tls" 1048576 16 --ucx-lanes 2 --ucx-workers 2)
  echo "| UCX_TLS=$tls | 1 MiB | $w1 | $w2 |"
done
echo
# KV blocks in runs: 1024 pieces of 16 KiB in runs of N adjacent slots on both sides, with the
# engine merging each run into one op (the default) and with --no-merge.
echo "| link | 16 KiB pieces in runs of | merged GB/s | --no-merge GB/s | merged / not |"
echo "| --- | ---: | ---: | ---: | ---: |"
for run in 1 4 16 64; do
  m=$(ferry_bw tcp 16384 1024 --run "$run")
  n=$(ferry_bw tcp 16384 1024 --run "$run" --no-merge)
  echo "| UCX_TLS=tcp | $run | $m | $n | $(ratio "$m" "$n") |"
done
echo
echo
fi
# Notification latency. ferry's endpoints handle peer failure (UCP_ERR_HANDLING_MODE_PEER),
# with which UCX 1.13 leaves shared memory out of the lanes even under UCX_TLS=all (its
# ep_cfg: am(tcp/lo)): ucx_perftest -e (endpoints with error handling) takes the same lanes.
# ferry runs with the progress thread event-driven (the default) and with
# --ucx-progress shared (the polling application thread drives the worker).
echo "| link | ferry event, one-way us median (p99) | ferry shared, one-way us median (p99) | ucp_am_lat us typical (avg) | ucp_am_lat -e us typical (avg) | shared / am_lat | shared / am_lat -e |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for tls in "all" "tcp"; do
  lat=$(perftest "$tls" ucp_am_lat 8 20000)
  late=$(perftest "$tls" ucp_am_lat 8 20000 -e -e)
  fe=$(ferry_ping "$tls" event)
  fs=$(ferry_ping "$tls" shared)
  echo "| UCX_TLS=$tls | $fe | $fs | $lat | $late | $(ratio "${fs%% *}" "${lat%% *}") | $(ratio "${fs%% *}" "${late%% *}") |"
done
echo
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
