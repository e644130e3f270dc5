# Helpers shared by bench/ucx_two_process.sh and bench/shm_two_process.sh (sourced; they set
# $tmp). Nothing here runs on its own.

# perftest TLS TEST SIZE ITERS [SERVER_FLAGS [CLIENT_FLAGS]] -> the "Final:" line's overall MB/s,
# or for ucp_am_lat "typical (average)" one-way us (typical is ucx_perftest's median, the figure
# to hold against ferry's median). Up to three tries, each on a fresh random port: one that is
# taken, or a server slower to start than the client's wait, leaves no "Final:" line.
perftest() {
  local tls=$1 test=$2 size=$3 iters=$4 sflags=${5:-} cflags=${6:-} line="" attempt port server
  for attempt in 1 2 3; do
    port=$((20000 + RANDOM % 20000))
    # shellcheck disable=SC2086  # the flags are words
    env UCX_TLS="$tls" ucx_perftest -p "$port" $sflags >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    # shellcheck disable=SC2086
    line=$(env UCX_TLS="$tls" ucx_perftest 127.0.0.1 -p "$port" $cflags -t "$test" -s "$size" -n "$iters" 2>/dev/null | grep '^Final:' || true)
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    [ -n "$line" ] && break
  done
  if [ "$test" = ucp_am_lat ]; then awk '{print $3 " (" $4 ")"}' <<<"$line"; else awk '{print $7}' <<<"$line"; fi
}

# listen_address FILE -> the side-channel address a `ferry bench --listen` process printed to
# FILE (waits up to 10 s).
listen_address() {
  local address=""
  for _ in $(seq 100); do
    address=$(grep -o 'side channel on [0-9.:]*' "$1" | awk '{print $4}' || true)
    [ -n "$address" ] && break
    sleep 0.1
  done
  echo "$address"
}

mb_to_gb() { python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) * 1048576 / 1e9))" "$1"; }
ratio() { python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$1" "$2"; }
median() { python3 -c "import statistics,sys; print('%.2f' % statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
