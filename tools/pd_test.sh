#!/usr/bin/env bash
# ctest pd_test: short `ferry pd` runs with --json, each summary checked with python3: write and
# read mode, over shm and ucx, hetero TP (1 prefill of TP 2 -> 1 decode of TP 1 and back),
# different block sizes and tensor orders on the two sides, an MLA model, a trace file, prefix
# hits (partial and full), DP ranks, the fault runs (--kill-prefill-after, --kill-decode-after,
# --stop-prefill-after: every request ends, no block leaks on the survivors), the GPU compute stand-in where a GPU is
# usable (else its clean refusal), and bad flags refused with exit status 2 and a message naming
# the flag.
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
# Authenticated peers: every worker takes the deployment's secret from the environment, and every
# ucx and shm connection between them proves it (EngineOptions::secret).
export FERRY_SECRET=pd-test-deployment-secret-0123
run write-ucx-secret "$all_done" "${small[@]}" --mode write --transport ucx --requests 4
run read-shm-secret "$all_done" "${small[@]}" --mode read --transport shm --requests 4
unset FERRY_SECRET
printf '# seconds tokens\n0 16\n0.01 17\n0.02 300\n0.05 1\n' > "$tmp/trace"
run trace "$all_done and s['requests'] == 4" --trace "$tmp/trace" --layer-us 50 --timeout 40
# The fault run: a prefill worker dies with requests in flight; every request still ends (done
# or failed, none stuck) and the survivors hand every block back.
kill_check='s["killed"] != "" and s["failed"] >= 1 and s["done"] >= 3'
run kill-write "$kill_check" "${small[@]}" --requests 16 --layer-us 10000 --prefill 2 --mode write \
  --transport shm --kill-prefill-after 3
run kill-read "$kill_check" "${small[@]}" --requests 16 --layer-us 10000 --prefill 2 --mode read \
  --transport ucx --kill-prefill-after 3
# A decode worker dies with a request in flight (its prefill still running): the producers
# settle with the dead peer, the other decode instance serves the rest.
kill_decode="$kill_check"' and [w["role"] for w in s["workers"] if w["killed"]] == ["decode"]'
run kill-decode-write "$kill_decode" "${small[@]}" --requests 16 --layer-us 10000 --decode 2 \
  --mode write --transport shm --kill-decode-after 3
run kill-decode-read "$kill_decode" "${small[@]}" --requests 16 --layer-us 10000 --decode 2 --decode-tp 2 \
  --mode read --transport ucx --kill-decode-after 3
# A prefill worker stopped (SIGSTOP) with requests in flight for 1.5 s, longer than the transfer
# timeout, then continued: the decode side fails what it is owed but keeps the blocks until the
# continued worker confirms the aborts (none expire); every request ends, none stuck, no block
# leaks, and every worker ends alive with nothing pending.
stopped=(--model tiny --requests 16 --prompt-tokens 10..70 --layer-us 10000 --timeout 40
  --transfer-timeout 1 --prefill 2 --stop-prefill-after 3 --stop-ms 1500)
stop_check='s["killed"].endswith("(stopped)") and s["done"] >= 3 and all(w["alive"] for w in s["workers"])'
run stop-write "$stop_check"' and s["failed"] >= 1 and all(w["stats"]["blocks_expired"] == 0 for w in s["workers"])' \
  "${stopped[@]}" --mode write --transport shm
run stop-read "$stop_check" "${stopped[@]}" --mode read --transport ucx

# Prefix hits: decode holds whole blocks of both sides (here lcm(16, 8) = 16 and lcm(16, 32) = 32
# tokens) and checks only the tokens that moved.
run prefix-write-shm "$all_done" "${small[@]}" --mode write --transport shm --prefix-hit 0.5 \
  --decode-block-tokens 8
run prefix-read-ucx "$all_done" "${small[@]}" --mode read --transport ucx --prefix-hit 0.7 \
  --decode-block-tokens 32 --decode-tp 2
# --prefix-hit 1 over prompts of whole blocks is a full hit (an empty block list): of 32, 17, 64,
# 48 and 5 tokens only 1 + 5 move, 1 KiB a token in the tiny model.
printf '0 32\n0 17\n0 64\n0 48\n0 5\n' > "$tmp/hits"
full_hit='s["done"] == s["requests"] == 5 and s["bytes"] == 6 * 1024'
run prefix-full-write "$full_hit" --trace "$tmp/hits" --layer-us 50 --timeout 40 --prefix-hit 1 --mode write
run prefix-full-read "$full_hit" --trace "$tmp/hits" --layer-us 50 --timeout 40 --prefix-hit 1 --mode read

# DP: 2 prefill and 3 decode DP ranks, each its own blocks; round robin pairs every prefill rank
# with every decode rank, and each rank serves requests.
dp_check="$all_done"' and len(s["workers"]) == 8 and all(w["stats"]["requests_done"] > 0 for w in s["workers"])'
run dp-write-shm "$dp_check" "${small[@]}" --requests 12 --mode write --transport shm --prefill-dp 2 \
  --decode-dp 3 --decode-tp 2

# The GPU compute stand-in: a kernel per layer, the write waiting on its event (GPU machines);
# without a usable GPU the command refuses cleanly.
gpu=(--memory gpu --transport cuda_ipc --compute gpu)
if timeout 60 "$ferry" pd "${small[@]}" "${gpu[@]}" --requests 1 > "$tmp/gpu-probe" 2>&1; then
  run gpu-compute-write "$all_done" "${small[@]}" "${gpu[@]}" --layer-us 1000 --mode write
  run gpu-compute-read "$all_done" "${small[@]}" "${gpu[@]}" --mode read --decode-tp 2
elif grep -q "no usable GPU" "$tmp/gpu-probe"; then
  echo "skipped: the GPU runs ($(tail -1 "$tmp/gpu-probe"))"
else
  echo "FAIL: ferry pd ${gpu[*]}:"
  cat "$tmp/gpu-probe"
  failures=$((failures + 1))
fi

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
refuses "--transport must be shm, ucx or cuda_ipc" --transport tcp
refuses "--mode must be write or read" --mode push
refuses "--layout" --layout diagonal
refuses "--decode-layout" --decode-layout mla
refuses "--trace: cannot open" --trace "$tmp/missing"
refuses "--kill-prefill-after 10 must be less than" --requests 10 --kill-prefill-after 10
refuses "--kill-decode-after 10 must be less than" --requests 10 --kill-decode-after 10
refuses "--stop-prefill-after 10 must be less than" --requests 10 --stop-prefill-after 10
refuses "--stop-ms must be in" --stop-ms -1
refuses "--prefix-hit must be in [0, 1]" --prefix-hit 1.5
refuses "--decode-dp must be in" --decode-dp 0
refuses "--compute gpu runs on the KV cache's GPU" --compute gpu
refuses "--transport cuda_ipc moves GPU memory only" --transport cuda_ipc

[ "$failures" -eq 0 ] && echo "pd_test: every run verified"
exit $((failures > 0))
