#!/usr/bin/env bash
# run_fuzz.sh FUZZER MAKE_SEEDS CORPUS_DIR SECONDS [IN_TREE_CORPUS]: writes the generated seeds
# into CORPUS_DIR (MAKE_SEEDS "-": none), then fuzzes for SECONDS from it and from the in-tree
# corpus (read only: new inputs go to CORPUS_DIR).
set -euo pipefail
fuzzer=$1 seeds=$2 corpus=$3 seconds=${4:-20} in_tree=${5:-}
mkdir -p "$corpus"
[[ $seeds == - ]] || "$seeds" "$corpus"
dirs=("$corpus")
[[ -n $in_tree && -d $in_tree ]] && dirs+=("$in_tree")
# UCX (linked by most targets) would catch the fuzzer's traps and crashes itself.
export UCX_HANDLE_ERRORS=none
exec "$fuzzer" -max_total_time="$seconds" -max_len=4096 -timeout=30 -print_final_stats=1 "${dirs[@]}"
