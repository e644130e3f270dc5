#!/usr/bin/env bash
# ferry's `shm` transport between two processes of this machine (buffers from
# AllocateSharedHost, `--alloc shared`) against ucx_perftest over UCX's shared memory (Debian's
# ucx-utils), side by side in one run: write bandwidth against ucp_put_bw, and notification
# one-way latency against ucp_am_lat. The ucx transport's own tables are bench/ucx_two_process.sh.
# Usage: bench/shm_two_process.sh [ferry binary]   (prints markdown tables)
# Env: SECTIONS (default "shm lat"): "shm" the bandwidth table, "lat" the latency table,
#      "ucx" this script's older ucx table; ROUNDS (default 5) latency rounds, alternated;
#      PINGS (default 5000) notification round trips per round; PIN (default 1): the latency
#      rounds keep each side's polling thread on its own CPU, ferry's (--ping-cpu) and
#      ucx_perftest's (-c) alike: on two cores the scheduler otherwise at times runs both of
#      ferry's polling threads on one CPU (bench/results/shm_two_process.md). PIN=0: unpinned.
set -euo pipefail
cd "$(dirname "$0")/.."
F=${1:-build/release/tools/ferry}
ROUNDS=${ROUNDS:-5}
PINGS=${PINGS:-5000}
PIN=${PIN:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT

# shellcheck source=bench/two_process_lib.sh
source bench/two_process_lib.sh

ferry_ping() {  # ferry_ping [LISTEN_FLAGS [PEER_FLAGS]] -> "median (p99)" one-way us of PINGS round trips over shm
  local lflags=${1:-} pflags=${2:-}
  : >"$tmp/listen"  # not the previous listener's address
  # shellcheck disable=SC2086
  "$F" bench --listen 127.0.0.1:0 --transport shm --alloc shared $lflags >"$tmp/listen" 2>&1 &
  local server=$! address
  address=$(listen_address "$tmp/listen")
  # shellcheck disable=SC2086
  "$F" bench --peer "$address" --transport shm --alloc shared --sizes 4096 --batches 1 --min-time 0.1 \
    --pings "$PINGS" $pflags >"$tmp/ping"
  wait "$server" || true
  sed -n 's/.*median \([0-9.]*\) us, p99 \([0-9.]*\) us.*/\1 (\2)/p' "$tmp/ping"
}

ferry_bw() {  # ferry_bw TLS SIZE BATCH [ALLOC TRANSPORT...] -> GB/s of write batches of BATCH pieces of SIZE
  local tls=$1 size=$2 batch=$3 alloc=${4:-heap}
  shift 3; shift || true
  local transports=("$@")
  [ ${#transports[@]} -eq 0 ] && transports=(ucx)
  local targs=()
  for t in "${transports[@]}"; do targs+=(--transport "$t"); done
  local bytes=$((size * batch))
  env UCX_TLS="$tls" "$F" bench --listen 127.0.0.1:0 --max-bytes "$bytes" --alloc "$alloc" "${targs[@]}" >"$tmp/listen" 2>&1 &
  local server=$! address
  address=$(listen_address "$tmp/listen")
  # shellcheck disable=SC2086  # FERRY_EXTRA: more `ferry bench` flags for the measuring side
  env UCX_TLS="$tls" "$F" bench --peer "$address" --alloc "$alloc" "${targs[@]}" ${FERRY_EXTRA:-} --sizes "$size" --batches "$batch" \
    --max-bytes "$bytes" --min-time 1 --json "$tmp/out.json" >"$tmp/peer"
  wait "$server" || true
  # The path the session took (e.g. "shm (direct)"), on stderr for the record.
  grep -o 'of [0-9.:]*, .*' "$tmp/peer" | head -1 | sed 's/^of [0-9.:]*, /  path: /' >&2 || true
  python3 -c "import json,sys; print('%.2f' % json.load(open(sys.argv[1]))['points'][0]['gbps'])" "$tmp/out.json"
}


echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
SECTIONS=${SECTIONS:-shm lat}
if [[ " $SECTIONS " == *" ucx "* ]]; then
# ucx_perftest keeps a window of messages in flight; ferry's side posts batches of 16 pieces of
# 1 MiB (and of 4 pieces of 64 MiB), so that both have several messages in flight.
echo "| link | piece | ferry write GB/s | ucp_put_bw GB/s | tag_bw GB/s | ferry / put_bw | ferry / tag_bw |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for tls in "all" "tcp"; do
  for size in 1048576 67108864; do
    iters=$([ "$size" -gt 1048576 ] && echo 20 || echo 200)
    put=$(mb_to_gb "$(perftest "$tls" ucp_put_bw "$size" "$iters")")
    tag=$(mb_to_gb "$(perftest "$tls" tag_bw "$size" "$iters")")
    fw=$(ferry_bw "$tls" "$size" "$([ "$size" -gt 1048576 ] && echo 4 || echo 16)")
    echo "| UCX_TLS=$tls | $((size >> 20)) MiB | $fw | $put | $tag | $(ratio "$fw" "$put") | $(ratio "$fw" "$tag") |"
  done
done
echo
echo "| link | ucp_am_lat one-way us |"
echo "| --- | ---: |"
for tls in "all" "tcp"; do
  echo "| UCX_TLS=$tls | $(perftest "$tls" ucp_am_lat 8 10000) |"
done
echo
fi
if [[ " $SECTIONS " == *" shm "* ]]; then
# The shm transport: both buffers shared (--alloc shared), engines with shm and ucx (shm wins by
# cost). Batches of one piece move the same bytes between the same two buffers each time, as
# ucp_put_bw does; batches of 16 (1 MiB) and 4 (64 MiB) scatter pieces over larger buffers.
# ucp_put_bw runs twice, with the ucx table's iterations (200 / 20) and for about a second
# (10000 / 50); the ratio is taken against the faster of the two. The measuring side copies
# with the engine's default parallel_copy_bytes (4 MiB; `ferry bench` defaults to 1M): on two
# cores, splitting a 1 MiB copy over two threads costs more than it gains.
echo "| piece | batch | ferry shm write GB/s | ucp_put_bw GB/s, short / 1 s run | ferry shm / best put_bw |"
echo "| --- | ---: | ---: | ---: | ---: |"
for size in 1048576 67108864; do
  short=$([ "$size" -gt 1048576 ] && echo 20 || echo 200)
  long=$([ "$size" -gt 1048576 ] && echo 50 || echo 10000)
  put_s=$(mb_to_gb "$(perftest all ucp_put_bw "$size" "$short")")
  put_l=$(mb_to_gb "$(perftest all ucp_put_bw "$size" "$long")")
  put=$(python3 -c "import sys; print(max(float(sys.argv[1]), float(sys.argv[2])))" "$put_s" "$put_l")
  for batch in 1 $([ "$size" -gt 1048576 ] && echo 4 || echo 16); do
    fw=$(FERRY_EXTRA="--parallel-bytes 4M" ferry_bw all "$size" "$batch" shared shm ucx)
    echo "| $((size >> 20)) MiB | $batch | $fw | $put_s / $put_l | $(ratio "$fw" "$put") |"
  done
done
fi
if [[ " $SECTIONS " == *" lat "* ]]; then
# Notification one-way latency: ferry's Engine::Notify over shm (a ring in shared memory per
# connection, drained by the polling thread; `ferry bench --pings`, round trips / 2) against
# ucp_am_lat over UCX's shared memory (UCX_TLS=all), alternated ROUNDS times; with PIN=1 the
# listening side's polling thread on CPU 0 and the measuring side's on CPU 1, for both.
pin_l="" pin_p="" pin_s="" pin_c=""
[ "$PIN" = 1 ] && pin_l="--ping-cpu 0" pin_p="--ping-cpu 1" pin_s="-c 0" pin_c="-c 1"
echo
echo "pinned: $([ "$PIN" = 1 ] && echo "yes (ferry $pin_l / $pin_p, ucx_perftest $pin_s / $pin_c)" || echo no)"
echo
echo "| round | ferry shm one-way us, median (p99) | ucp_am_lat us, typical (avg) | ferry / am_lat |"
echo "| --- | ---: | ---: | ---: |"
fs=() us=()
for r in $(seq "$ROUNDS"); do
  lat=$(perftest all ucp_am_lat 8 20000 "$pin_s" "$pin_c")
  f=$(ferry_ping "$pin_l" "$pin_p")
  fs+=("${f%% *}") us+=("${lat%% *}")
  echo "| $r | $f | $lat | $(ratio "${f%% *}" "${lat%% *}") |"
done
fm=$(median "${fs[@]}") um=$(median "${us[@]}")
echo "| median | $fm | $um | $(ratio "$fm" "$um") |"
echo
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
fi
