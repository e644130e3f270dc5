#!/usr/bin/env bash
# ctest pd_test: short `ferry pd` runs with --json, each summary checked with python3: write and
# read mode, over shm and ucx, hetero TP (1 prefill of TP 2 -> 1 decode of TP 1 and back),
# different block sizes and tensor orders on the two sides, an MLA model, a trace file, the
# fault run (--kill-prefill-after: every request ends, no block leaks on the survivors), and
# bad flags refused with exit status 2 and a message naming the flag.
# Usage: tools/pd_test.sh FERRY_BINARY
set -uo pipefail
ferry=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
small=(--model tiny --requests 10 --prompt-tokens 10..70 --layer-us 100 --timeout 40 --transfer-timeout 5)

# run NAME CHECK ARGS...: `ferry pd ARGS --json` exits 0 and its summary passes the python CHECK
# (an expression over `s`, the summary) besides the checks every run gets.
run() {
  local name=$1 check=$2 rc=0 start=$SECONDS
  shift 2
  timeout 60 "$ferry" pd "$@" --json > "$tmp/$name.json" 2> "$tmp/$name.err" || rc=$?
  if [ "$rc" -ne 0 ] || ! python3 - "$tmp/$name.json" "$check" <<'PY'; then
import json, sys
s = json.load(open(sys.argv[1]))
assert s["ok"], s["problems"]
assert s["stuck"] == 0 and s["verify_failures"] == 0 and s["blocks_leaked"] == 0, s
assert s["done"] + s["failed"] == s["requests"], s
for w in s["workers"]:
    assert w["killed"] or (w["alive"] and w["pending"] == 0 and w["held_blocks"] == 0), w
assert eval(sys.argv[2]), f"check failed: {sys.argv[2]}: {s}"
print(s["done"], "done,", s["failed"], "failed; exposed p50", round(s["exposed_us"]["p50"]), "us, p99",
      round(s["exposed_us"]["p99"]), "us;", s["bytes"], "bytes", end="")
PY
    echo
    echo "FAIL: $name: ferry pd $* -> exit $rc"
    cat "$tmp/$name.json" "$tmp/$name.err"
    failures=$((failures + 1))
  else
    echo " <- ok: $name ($((SECONDS - start)) s)"
  fi
}

all_done='s["done"] == s["requests"] and s["bytes"] > 0 and s["exposed_us"]["p99"] >= s["exposed_us"]["p50"] > 0'
run write-shm "$all_done" "${small[@]}" --mode write --transport shm
run read-shm "$all_done" "${small[@]}" --mode read --transport shm
# Hetero TP, block sizes and tensor orders: each decode rank checks the heads it holds.
run write-ucx-tp2-tp1 "$all_done and len(s['workers']) == 3" "${small[@]}" --mode write --transport ucx \
  --prefill-tp 2 --decode-tp 1 --block-tokens 16 --decode-block-tokens 8 --layout blocks_first \
  --decode-layout kv_first_hnd
run read-ucx-2p-tp2 "$all_done and len(s['workers']) == 4" "${small[@]}" --mode read --transport ucx \
  --prefill 2 --decode-tp 2 --rate 200 --decode-block-tokens 32 --decode-layout separate
# TP 8 over 4 KV heads: replicated heads on the decode side.
run write-shm-replicated "$all_done" "${small[@]}" --mode write --transport shm --decode-tp 8 --requests 4
run mla-write-shm "$all_done" "${small[@]}" --model tiny-mla --mode write --transport shm --prefill-tp 2
run mla-read-ucx "$all_done" "${small[@]}" --model tiny-mla --mode read --transport ucx --decode-tp 2 \
  --decode-block-tokens 32
printf '# seconds tokens\n0 16\n0.01 17\n0.02 300\n0.05 1\n' > "$tmp/trace"
run trace "$all_done and s['requests'] == 4" --trace "$tmp/trace" --layer-us 50 --timeout 40
# The fault run: a prefill worker dies with requests in flight; every request still ends (done
# or failed, none stuck) and the survivors hand every block back.
kill_check='s["killed"] != "" and s["failed"] >= 1 and s["done"] >= 3'
run kill-write "$kill_check" "${small[@]}" --requests 16 --layer-us 10000 --prefill 2 --mode write \
  --transport shm --kill-prefill-after 3
run kill-read "$kill_check" "${small[@]}" --requests 16 --layer-us 10000 --prefill 2 --mode read \
  --transport ucx --kill-prefill-after 3

# refuses EXPECTED_TEXT ARGS...: `ferry pd ARGS` exits 2 within 10 s and prints EXPECTED_TEXT.
refuses() {
  local text=$1 rc=0
  shift
  timeout 10 "$ferry" pd "$@" > "$tmp/out" 2>&1 || rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF -- "$text" "$tmp/out"; then
    echo "FAIL: ferry pd $* -> exit $rc, expected 2 and '$text':"
    cat "$tmp/out"
    failures=$((failures + 1))
  fi
}
refuses "--model 'gpt' is not a preset" --model gpt
refuses "--prefill-tp 3 does not split" --prefill-tp 3
refuses "--decode must be in" --decode 0
refuses "--rate must be" --rate nan
refuses "--timeout must be a number of seconds" --timeout 0
refuses "--transport must be shm or ucx" --transport tcp
refuses "--mode must be write or read" --mode push
refuses "--layout" --layout diagonal
refuses "--decode-layout" --decode-layout mla
refuses "--trace: cannot open" --trace "$tmp/missing"
refuses "--kill-prefill-after 10 must be less than" --requests 10 --kill-prefill-after 10

[ "$failures" -eq 0 ] && echo "pd_test: every run verified"
exit $((failures > 0))
