#!/usr/bin/env bash
# run_fuzz.sh FUZZER MAKE_SEEDS CORPUS_DIR SECONDS: seeds the corpus and fuzzes for SECONDS.
set -euo pipefail
fuzzer=$1 seeds=$2 corpus=$3 seconds=${4:-20}
mkdir -p "$corpus"
"$seeds" "$corpus"
exec "$fuzzer" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$corpus"
