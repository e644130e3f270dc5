#!/usr/bin/env bash
# The GPU suite, for the GPU machine: configure and build everything with CUDA, run the whole test
# suite (the GPU tests run instead of skipping) and the GPU benchmarks, and write every log to
# "${OUT:-/tmp}/". FERRY_GPU_NO_BENCH=1 stops after the tests. One command, from the repo root:
#     source .device/unpack.sh; bench/gpu_suite.sh
# (.device/ comes from ../shared/device/bundle-deps.sh.) Exits non-zero when a build or a test
# failed; the benchmarks run either way.
set -u
out="${OUT:-/tmp}"
build="${FERRY_GPU_BUILD:-/tmp/build}"
jobs="${FERRY_GPU_JOBS:-$(nproc)}"
mkdir -p "$out"
status=0

{
  date -u
  uptime
  nvidia-smi -L 2>&1 || echo "nvidia-smi not found"
  nvidia-smi topo -m 2>&1 || true
} > "$out/gpu_machine.log" 2>&1

echo "configure + build -> $out/gpu_build.log"
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_WITH_CUDA=ON \
         -DFERRY_WITH_PYTHON=ON -DPython3_EXECUTABLE="$(command -v python3)" -DFERRY_WITH_BENCH=ON &&
       cmake --build "$build" -j "$jobs" ${FERRY_GPU_EXTRA_TARGETS:+--target $FERRY_GPU_EXTRA_TARGETS}; } > "$out/gpu_build.log" 2>&1; then
  echo "build failed; see $out/gpu_build.log"
  tail -30 "$out/gpu_build.log"
  exit 1
fi
grep -q "ferry: CUDA ON" "$out/gpu_build.log" || echo "warning: CMake did not find CUDA (see $out/gpu_build.log)"

echo "CUDA tests -> $out/gpu_tests.log"
if ! (cd "$build" && ctest --output-on-failure -R "${FERRY_GPU_TESTS:-.}") > "$out/gpu_tests.log" 2>&1; then
  status=1
  echo "some tests failed; see $out/gpu_tests.log"
fi
tail -15 "$out/gpu_tests.log"
# Skipped tests print their reason; keep them in one place.
grep -h -A1 "Skipped$" "$build"/Testing/Temporary/LastTest.log > "$out/gpu_skips.log" 2>/dev/null || true

echo "Python GPU tests -> $out/gpu_pytest.log"
if ! PYTHONPATH="$build/python" python3 -m pytest -q -x -k "${FERRY_GPU_PYTEST:-cuda or torch or embed}" tests/python \
     > "$out/gpu_pytest.log" 2>&1; then
  status=1
  echo "some Python tests failed; see $out/gpu_pytest.log"
fi
tail -5 "$out/gpu_pytest.log"

[ "${FERRY_GPU_NO_BENCH:-0}" = 1 ] && exit "$status"
echo "benchmarks -> $out/gpu_bench.log, $out/gpu_bench.json"
uptime > "$out/gpu_bench.log"
"$build/bench/ferry_bench_cuda" --benchmark_out="$out/gpu_bench.json" --benchmark_out_format=json \
  >> "$out/gpu_bench.log" 2>&1 || status=1
# The KV batches to pinned host again, with the host buffers on transparent huge pages
# (cudaHostRegister) instead of cudaHostAlloc; each against its own 1 GiB copy.
FERRY_BENCH_HOST_MEM=thp "$build/bench/ferry_bench_cuda" --benchmark_filter='pinned_1GiB|kv_gpu_to_host' \
  --benchmark_out="$out/gpu_bench_thp.json" --benchmark_out_format=json >> "$out/gpu_bench.log" 2>&1 || status=1
cat "$out/gpu_bench.log"
echo "embedding benchmarks -> $out/gpu_embed_bench.log"
FERRY_EMBED_TABLE_GB="${FERRY_EMBED_TABLE_GB:-32}" "$build/bench/ferry_bench_embed" --benchmark_min_time=0.3 \
  > "$out/gpu_embed_bench.log" 2>&1 || status=1
cat "$out/gpu_embed_bench.log"

# The embedding service's step (request sent to DONE visible on the GPU) against a torch
# reference, with a table of at least 32 GB (B = 6,500,000: 104 M rows of 320 bytes).
echo "embedding service benchmarks -> $out/gpu_embed_service.log"
vocab="${FERRY_EMBED_BASE_VOCAB:-6500000}"
{
  "$build/tools/ferry" bench-embed --kind cuda --base-vocab "$vocab" --threads 12 --iters 50
  PYTHONPATH="$build/python" python3 bench/embed_service_reference.py --ferry "$build/tools/ferry" \
    --cuda --base-vocab "$vocab" --threads 12 --iters 50
} > "$out/gpu_embed_service.log" 2>&1 || status=1
cat "$out/gpu_embed_service.log"
exit $status
