#!/usr/bin/env bash
# The KV connector on the GPU machine, in one call: build everything with CUDA, run the kv, pd,
# engine-completion and CUDA tests (the GPU cases run instead of skipping), then the KV
# benchmarks (planner, connector against the engine, seal-to-done, the control path) and
# bench/kv_pd.sh over shm and over cuda_ipc, with the connectors sleeping and busy polling
# (PD_BUSY="0 1"; ROUNDS=2). Logs go to "${OUT:-/tmp}/". From the repo root:
#     source .device/unpack.sh; bench/kv_device.sh
set -u
out="${OUT:-/tmp}"
build="${FERRY_GPU_BUILD:-/tmp/build}"
mkdir -p "$out"
status=0
exec > >(tee "$out/kv_device.log") 2>&1
  date -u; uptime; nvidia-smi -L 2>&1 || true
  echo "== configure + build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_WITH_CUDA=ON -DFERRY_WITH_PYTHON=ON \
    -DPython3_EXECUTABLE="$(command -v python3)" -DFERRY_WITH_BENCH=ON > "$out/kv_build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" >> "$out/kv_build.log" 2>&1 || { echo "build failed"; tail -30 "$out/kv_build.log"; exit 1; }
  grep -q "ferry: CUDA ON" "$out/kv_build.log" || echo "warning: CMake did not find CUDA"
  echo "== tests"
  (cd "$build" && ctest --output-on-failure -j 8 -R "${FERRY_KV_TESTS:-kv_|pd_|tools_test|completion_test|cuda|runtime_test|layering}") || status=1
  echo "== python: ferry.kv with torch (CUDA tensors where torch sees the GPU)"
  PYTHONPATH="$build/python" python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_kv.py \
    tests/python/test_kv_torch.py 2>&1 | tail -25 || status=1
  echo "== benchmarks"
  "$build/bench/ferry_bench_kv_plan" 2>&1 | tail -12
  "$build/bench/ferry_bench_kv_connector" --benchmark_repetitions=7 --benchmark_enable_random_interleaving=true \
    --benchmark_report_aggregates_only=true 2>&1 | grep -E "median|cv|Benchmark|---"
  FERRY_BENCH_TRANSPORT=local "$build/bench/ferry_bench_kv_connector" --benchmark_filter=seal 2>&1 | grep seal_to
  echo "== ferry pd: exposed time after the last layer (host/shm, then gpu/cuda_ipc)"
  for memory in host gpu; do
    for busy in ${PD_BUSY:-0 1}; do
      OUT=/tmp/kv_pd_${memory}_$busy ROUNDS=${ROUNDS:-2} REQUESTS=${REQUESTS:-20} RATE=${RATE:-4} BUSY_POLL=$busy \
        bench/kv_pd.sh "$build/tools/ferry" "$memory" 2>&1 | tail -20
    done
  done
exit $status
