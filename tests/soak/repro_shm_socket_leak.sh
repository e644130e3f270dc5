#!/usr/bin/env bash
# Reproduces what the 30-minute soak found (bench/results/soak.md): a KV producer over shm
# (read mode) keeps one Unix socket open for every consumer incarnation that was killed -9
# and replaced while the producer was stopped (SIGSTOP); the socket stays ESTABLISHED with
# no peer. Uses the soak's own worker (tests/soak/worker_kv.py).
#   PYTHONPATH=build/release/python tests/soak/repro_shm_socket_leak.sh [rounds]
# Exit status 1 when the producer's descriptors grew by at least rounds/2 (reproduced).
set -u
# PYTHONPATH (one folder) made absolute before moving to this script's folder.
[ -n "${PYTHONPATH:-}" ] && PYTHONPATH=$(cd "$PYTHONPATH" && pwd) && export PYTHONPATH
cd "$(dirname "$0")"
rounds=${1:-8}
py=${PYTHON:-/usr/bin/python3}
dir=$(mktemp -d)
kv() { exec "$py" worker_kv.py --pair f --mode read --transport shm --rundir "$dir" --run 1 "$@"; }
kv --role producer >/dev/null 2>&1 & p=$!
kv --role consumer --inc 0 >/dev/null 2>&1 & c=$!
trap 'kill -CONT $p 2>/dev/null; kill -9 $p $c 2>/dev/null; rm -rf "$dir"' EXIT
sleep 4
before=$(ls /proc/$p/fd | wc -l)
for i in $(seq 1 "$rounds"); do
  kill -STOP $p; kill -9 $c; wait $c 2>/dev/null
  kv --role consumer --inc "$i" >/dev/null 2>&1 & c=$!
  sleep 2; kill -CONT $p; sleep 3
  echo "round $i: producer descriptors $(ls /proc/$p/fd | wc -l) (were $before)"
done
kill -9 $c; wait $c 2>/dev/null; sleep 5
after=$(ls /proc/$p/fd | wc -l)
echo "consumer gone for 5 s: producer descriptors $after (were $before)"
ls -l /proc/$p/fd | grep -c socket: | sed 's/^/sockets open: /'
if [ $((after - before)) -ge $((rounds / 2)) ]; then echo "reproduced: descriptors leaked"; exit 1; fi
echo "not reproduced"
