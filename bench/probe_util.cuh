// What the standalone GPU probes in bench/ share (each is built by nvcc alone, outside CMake):
// CK, which ends the probe on a CUDA error, and MakeTable, a host table of random-access rows.
#pragma once

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// `bytes` of anonymous memory on transparent huge pages where the kernel allows, filled by every
// host thread so that word k of row r (rows of row_bytes) is uint32(r * 131 + k). Null if mmap
// fails.
inline char* MakeTable(size_t bytes, size_t row_bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  char* table = static_cast<char*>(p);
  madvise(table, bytes, MADV_HUGEPAGE);
  const uint64_t rows = bytes / row_bytes;
  const int n = static_cast<int>(std::thread::hardware_concurrency());
  std::vector<std::thread> fill;
  for (int i = 0; i < n; ++i)
    fill.emplace_back([=] {
      const uint64_t r0 = rows / n * i, r1 = i == n - 1 ? rows : rows / n * (i + 1);
      for (uint64_t r = r0; r < r1; ++r) {
        uint32_t* w = reinterpret_cast<uint32_t*>(table + r * row_bytes);
        for (size_t k = 0; k < row_bytes / 4; ++k) w[k] = static_cast<uint32_t>(r * 131 + k);
      }
    });
  for (auto& t : fill) t.join();
  return table;
}
