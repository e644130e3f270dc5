#!/usr/bin/env bash
# Rounds of TCP loopback bandwidth, side by side: ucx_perftest tag_bw, tag_bw -e (endpoints with
# error handling, as ferry's), ferry's defaults for each ferry binary given (e.g. a build before
# and one after a change: the rounds alternate them under the same conditions) and, for the
# first binary, ferry with 2 lanes over 2 workers. One markdown row per round: round, load
# (1 min), the GB/s, then each binary's ferry / tag_bw and ferry / tag_bw -e, and 2 x 2 / tag_bw;
# a median row closes the table (bench/results/ucx_two_process.md).
# Usage: [ROUNDS=5] [SIZE=1048576] [BATCH=16] [MIN_TIME=1] [TWO_BY_TWO=1]
#        bench/ucx_tcp_rounds.sh [ferry binary ...]    (default: build/release/tools/ferry)
# NICE=-10 runs every process at that niceness (root only), on a machine that others share.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then set -- build/release/tools/ferry; fi
for f in "$@"; do [ -x "$f" ] || { echo "not an executable: $f" >&2; exit 1; }; done
ROUNDS=${ROUNDS:-5}
SIZE=${SIZE:-1048576}
BATCH=${BATCH:-16}
MIN_TIME=${MIN_TIME:-1}
TWO_BY_TWO=${TWO_BY_TWO:-1}
NICE=${NICE:-0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT
# shellcheck source=bench/two_process_lib.sh
source bench/two_process_lib.sh
# run BINARY [flags] -> GB/s of one two-process ferry bench run (write, SIZE x BATCH).
run() {
  local f=$1 s a
  shift
  : >"$tmp/listen"
  rm -f "$tmp/o.json"
  nice -n "$NICE" env UCX_TLS=tcp "$f" bench --listen 127.0.0.1:0 --max-bytes $((SIZE*BATCH)) --transport ucx "$@" >"$tmp/listen" 2>&1 &
  s=$!
  a=$(listen_address "$tmp/listen")
  nice -n "$NICE" env UCX_TLS=tcp "$f" bench --peer "$a" --transport ucx --max-bytes $((SIZE*BATCH)) --sizes "$SIZE" \
    --batches "$BATCH" --min-time "$MIN_TIME" --no-baseline --json "$tmp/o.json" "$@" >/dev/null 2>&1 || true
  wait "$s" || true
  if [ -s "$tmp/o.json" ]; then
    python3 -c "import json,sys; print('%.2f' % json.load(open(sys.argv[1]))['points'][0]['gbps'])" "$tmp/o.json"
  else
    echo nan
  fi
}
# Relative to tag_bw; "-" where either side failed.
rel() { if [ "$1" = nan ] || [ "$2" = nan ] || [ -z "$2" ]; then echo -; else ratio "$1" "$2"; fi; }
pt() { local v; v=$(nice -n "$NICE" bash -c "source bench/two_process_lib.sh; perftest $*"); [ -n "$v" ] && mb_to_gb "$v" || echo nan; }
iters=$([ "$SIZE" -gt 1048576 ] && echo 40 || echo 400)
header="| round | load | tag_bw | tag_bw -e |"
sep="| ---: | ---: | ---: | ---: |"
for i in $(seq $#); do header+=" ferry #$i |"; sep+=" ---: |"; done
[ "$TWO_BY_TWO" = 1 ] && { header+=" #1 2 x 2 |"; sep+=" ---: |"; }
for i in $(seq $#); do header+=" #$i / tag_bw | #$i / tag_bw -e |"; sep+=" ---: | ---: |"; done
[ "$TWO_BY_TWO" = 1 ] && { header+=" 2 x 2 / tag_bw |"; sep+=" ---: |"; }
for i in $(seq $#); do echo "ferry #$i: ${!i}"; done
echo "$header"
echo "$sep"
declare -A col
for r in $(seq "$ROUNDS"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  tag=$(pt tcp tag_bw "$SIZE" "$iters")
  tage=$(pt tcp tag_bw "$SIZE" "$iters" -e -e)
  row="| $r | $load | $tag | $tage |"
  rels=""
  i=0
  for f in "$@"; do
    i=$((i + 1))
    v=$(run "$f")
    row+=" $v |"
    rels+=" $(rel "$v" "$tag") | $(rel "$v" "$tage") |"
    col[$i]+=" $(rel "$v" "$tag")"
  done
  if [ "$TWO_BY_TWO" = 1 ]; then
    v=$(run "$1" --ucx-lanes 2 --ucx-workers 2)
    row+=" $v |"
    rels+=" $(rel "$v" "$tag") |"
  fi
  echo "$row$rels"
done
for i in $(seq $#); do
  vals=$(tr ' ' '\n' <<<"${col[$i]}" | grep -v '^-\?$' | tr '\n' ' ' || true)
  [ -n "$vals" ] && echo "ferry #$i / tag_bw: median $(median $vals), min $(python3 -c "import sys; print('%.2f' % min(float(x) for x in sys.argv[1:]))" $vals) over $ROUNDS rounds"
done
