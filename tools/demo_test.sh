#!/usr/bin/env bash
# ctest demo_test: `ferry demo` with a small cache, in one process and as a producer and a
# consumer process over each host transport that reaches another process (shm with shared
# caches, ucx); each run must end with every byte verified on the consumer's side. Then
# `ferry bench --listen/--peer` over the same transports, writes and reads. `--json -` puts the
# JSON document alone on stdout (demo, bench, info), and `--transport` in one process runs on
# the transport named.
# Usage: tools/demo_test.sh FERRY_BINARY
set -euo pipefail
ferry=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT
shape=(--layers 3 --blocks 16 --block-bytes 8K --deadline 10)
# listen_address FILE: the side-channel address a --listen process printed to FILE.
# shellcheck source=../bench/two_process_lib.sh
source "$(dirname "$0")/../bench/two_process_lib.sh"

"$ferry" demo "${shape[@]}" > "$tmp/one" || { cat "$tmp/one"; exit 1; }
grep -q "verified" "$tmp/one" || { cat "$tmp/one"; echo "one process: nothing verified"; exit 1; }

# --json -: stdout holds the document alone; the text report goes to stderr.
"$ferry" demo "${shape[@]}" --rounds 2 --json - > "$tmp/demo.json" 2> "$tmp/demo.err" || { cat "$tmp/demo.err"; exit 1; }
python3 - "$tmp/demo.json" <<'PY' || { cat "$tmp/demo.json" "$tmp/demo.err"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
assert d["config"]["layers"] == 3 and len(d["rounds"]) == 2, d
assert all(r["verified"] and r["gbps"] > 0 for r in d["rounds"]), d["rounds"]
assert d["total"]["gbps"] > 0, d["total"]
PY
grep -q "OK: notification received" "$tmp/demo.err" || { cat "$tmp/demo.err"; echo "demo --json -: no text on stderr"; exit 1; }
[ ! -e ./- ] || { echo "--json - wrote a file named -"; exit 1; }
"$ferry" info --json | python3 -c 'import json, sys; assert "transports_usable" in json.load(sys.stdin)' ||
  { echo "info --json: not JSON"; exit 1; }

# In one process, --transport picks the path (it was once ignored there).
for transport in local ucx; do
  how=(--transport "$transport")
  "$ferry" bench "${how[@]}" --sizes 4K --batches 1 --min-time 0.01 --json - > "$tmp/b.json" 2> "$tmp/b.err" ||
    { cat "$tmp/b.err"; exit 1; }
  grep -q "in-process, host -> host, $transport (direct)" "$tmp/b.err" || { cat "$tmp/b.err"; echo "bench --transport $transport: another path ran"; exit 1; }
  # Every point has the same run's baseline beside it (one thread's memcpy of the same pieces).
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["points"][0]["gbps"] > 0
b = d["baseline"]; assert len(b) == len(d["points"]) and b[0]["gbps"] > 0, d
assert (b[0]["piece_bytes"], b[0]["batch"]) == (d["points"][0]["piece_bytes"], d["points"][0]["batch"]), d' "$tmp/b.json" ||
    { cat "$tmp/b.json"; exit 1; }
  "$ferry" demo "${how[@]}" "${shape[@]}" > "$tmp/d" 2>&1 || { cat "$tmp/d"; exit 1; }
  grep -q "^path $transport" "$tmp/d" || { cat "$tmp/d"; echo "demo --transport $transport: another path ran"; exit 1; }
done

for transport in shm ucx; do
  how=(--transport "$transport")
  [ "$transport" = shm ] && how+=(--alloc shared)
  "$ferry" demo --role consumer --listen 127.0.0.1:0 "${how[@]}" "${shape[@]}" > "$tmp/consumer" 2>&1 &
  consumer=$!
  address=$(listen_address "$tmp/consumer")
  [ -n "$address" ] || { cat "$tmp/consumer"; echo "$transport: the consumer did not start"; exit 1; }
  timeout 60 "$ferry" demo --role producer --peer "$address" "${how[@]}" "${shape[@]}" > "$tmp/producer" 2>&1 ||
    { cat "$tmp/producer" "$tmp/consumer"; echo "$transport: the producer failed"; exit 1; }
  wait "$consumer" || { cat "$tmp/consumer"; echo "$transport: the consumer failed"; exit 1; }
  grep -q "path $transport" "$tmp/producer" || { cat "$tmp/producer"; echo "$transport: another path ran"; exit 1; }
  grep -q "round 0: notification received, .* verified" "$tmp/consumer" ||
    { cat "$tmp/consumer"; echo "$transport: the consumer verified nothing"; exit 1; }
  echo "$transport: $(grep '^total' "$tmp/producer")"
done

# `ferry bench` in its two-process mode (--listen / --peer) over the same transports, a small
# grid of writes and reads: every point moves bytes, on the path asked for.
for transport in shm ucx; do
  how=(--transport "$transport")
  [ "$transport" = shm ] && how+=(--alloc shared)
  for op in write read; do
    "$ferry" bench --listen 127.0.0.1:0 "${how[@]}" --max-bytes 4M > "$tmp/listener" 2>&1 &
    listener=$!
    address=$(listen_address "$tmp/listener")
    [ -n "$address" ] || { cat "$tmp/listener"; echo "bench $transport: the listener did not start"; exit 1; }
    extra=()
    [ "$transport" = ucx ] && extra=(--ucx-lanes 2 --ucx-post-batch 4)
    timeout 60 "$ferry" bench --peer "$address" "${how[@]}" "${extra[@]}" --op "$op" --sizes 4K,64K --batches 1,16 \
      --max-bytes 4M --min-time 0.02 --pings 20 --timeout 10 --json "$tmp/bench.json" > "$tmp/bench" 2>&1 ||
      { cat "$tmp/bench" "$tmp/listener"; echo "bench $transport $op: the peer failed"; exit 1; }
    wait "$listener" || { cat "$tmp/listener"; echo "bench $transport $op: the listener failed"; exit 1; }
    grep -q "two processes, .*, $transport (direct)" "$tmp/bench" ||
      { cat "$tmp/bench"; echo "bench $transport $op: another path ran"; exit 1; }
    python3 - "$tmp/bench.json" "$op" <<'PY' || { cat "$tmp/bench"; exit 1; }
import json, sys
points = json.load(open(sys.argv[1]))["points"]
assert len(points) == 4, f"{len(points)} points, expected 4"
for p in points:
    assert p["op"] == sys.argv[2] and p["iters"] > 0 and p["gbps"] > 0, p
pings = json.load(open(sys.argv[1]))["notification_one_way_us"]
assert pings["round_trips"] == 20 and pings["median"] > 0, pings
PY
    echo "bench $transport $op: $(grep -c 'KiB' "$tmp/bench") points"
  done
done

# A `ferry bench --listen` server is watched while it runs: --metrics-port serves GET /metrics,
# and SIGUSR1 prints the transfers in flight without disturbing it (its peer still runs).
"$ferry" bench --listen 127.0.0.1:0 --metrics-port -1 --max-bytes 1M > "$tmp/listener" 2>&1 &
listener=$!
address=$(listen_address "$tmp/listener")
[ -n "$address" ] || { cat "$tmp/listener"; echo "watched bench: the listener did not start"; exit 1; }
port=$(grep -oE '127\.0\.0\.1:[0-9]+/metrics' "$tmp/listener" | head -1 | sed -E 's/.*:([0-9]+)\/metrics/\1/')
[ -n "$port" ] || { cat "$tmp/listener"; echo "watched bench: no metrics port printed"; exit 1; }
python3 - "$port" <<'PY' || { cat "$tmp/listener"; exit 1; }
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
assert "# TYPE ferry_transfers_total counter" in text, text[:500]
PY
kill -USR1 "$listener"
for _ in $(seq 50); do grep -q "transfer(s) in flight" "$tmp/listener" && break; sleep 0.1; done
grep -q "transfer(s) in flight" "$tmp/listener" || { cat "$tmp/listener"; echo "watched bench: no dump on SIGUSR1"; exit 1; }
timeout 60 "$ferry" bench --peer "$address" --sizes 4K --batches 1 --max-bytes 64K --min-time 0.02 --timeout 10 \
  > "$tmp/bench" 2>&1 || { cat "$tmp/bench" "$tmp/listener"; echo "watched bench: the peer failed"; exit 1; }
wait "$listener" || { cat "$tmp/listener"; echo "watched bench: the listener failed after SIGUSR1"; exit 1; }
echo "bench --listen: /metrics served, SIGUSR1 dumped the transfers in flight, the peer ran"
