#!/usr/bin/env bash
# Two builds of ferry measured side by side in one run, rounds interleaved (old, new, old, new...),
# so that a change can be judged against the commit before it on a shared, noisy machine:
# every google-benchmark program both builds have (ferry_bench_transfer, ferry_bench_notify,
# ferry_bench_cuda where CUDA is built) and `ferry bench` between two processes over shm and
# over ucx (TCP). bench/side_by_side.py turns the results into one table: each figure of both
# builds (median of the rounds), new / old, and each build's ratio to its in-run baseline.
# Usage: bench/side_by_side.sh OLD_BUILD NEW_BUILD [OUT_DIR]
# Env: ROUNDS (default 3); FILTER_<prog> a --benchmark_filter for that program (e.g.
#      FILTER_ferry_bench_cuda='pinned_1GiB|kv_gpu_to_host'); TWO_PROCESS=0 skips `ferry bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 out=${3:-/tmp/side_by_side}
ROUNDS=${ROUNDS:-3}
mkdir -p "$out"
# shellcheck source=bench/two_process_lib.sh
source bench/two_process_lib.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT

two_process() {  # two_process BUILD NAME TRANSPORT ALLOC SIZE BATCH -> JSON in $out
  local b=$1 name=$2 transport=$3 alloc=$4 size=$5 batch=$6
  : >"$tmp/listen"
  "$b/tools/ferry" bench --listen 127.0.0.1:0 --transport "$transport" --alloc "$alloc" \
    --max-bytes $((size * batch)) >"$tmp/listen" 2>&1 &
  local server=$! address
  address=$(listen_address "$tmp/listen")
  "$b/tools/ferry" bench --peer "$address" --transport "$transport" --alloc "$alloc" \
    --max-bytes $((size * batch)) --sizes "$size" --batches "$batch" --min-time 0.5 \
    --json "$out/$name.json" >/dev/null
  wait "$server" || true
}

for r in $(seq "$ROUNDS"); do
  for side in old new; do
    b=${!side}
    for prog in ferry_bench_transfer ferry_bench_notify ferry_bench_cuda; do
      [ -x "$old/bench/$prog" ] && [ -x "$new/bench/$prog" ] || continue
      filter_var="FILTER_$prog"
      "$b/bench/$prog" --benchmark_filter="${!filter_var:-.}" \
        --benchmark_out="$out/$side.$prog.$r.json" --benchmark_out_format=json >/dev/null 2>&1 ||
        echo "$side $prog round $r failed" >&2
    done
    if [ "${TWO_PROCESS:-1}" = 1 ]; then
      two_process "$b" "$side.shm_1MiBx16.$r" shm shared 1048576 16 || echo "$side shm failed" >&2
      UCX_TLS=tcp two_process "$b" "$side.ucx_tcp_1MiBx16.$r" ucx heap 1048576 16 ||
        echo "$side ucx failed" >&2
    fi
  done
done
python3 bench/side_by_side.py "$out"
