// uva_pages: what limits a UVA gather of random rows from a host table. The same warp-per-token
// gather kernel (16 rows of 320 bytes a token, every load in flight before any store) reads a
// table held in: anonymous memory on 4 KiB pages, on transparent huge pages, a cuMem host
// allocation of 2 MiB granularity (so the GPU maps it with large pages), and cudaHostAlloc.
// Then, on the huge-page table: the same ids every step (translations stay cached) and random
// rows confined to footprints of 64 MiB..16 GiB. Baseline in the same run: one pinned
// host-to-device copy of the step's bytes. Each timed step gathers fresh random rows unless
// said otherwise; times are CUDA events over 50 back-to-back steps.
//
// A measurement program for the GPU machine, built by hand (it calls the driver API):
//   nvcc -O2 -arch=sm_90 bench/uva_pages.cu -o /tmp/uva_pages -lcuda
//   /tmp/uva_pages [table GiB=32]
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                   \
  do {                                                                          \
    auto e = (x);                                                               \
    if (e != 0) {                                                               \
      std::printf("%s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)e);          \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

constexpr int kRowBytes = 320;
constexpr int kRowWords = kRowBytes / 16;
constexpr int kHeads = 16;

__global__ void Gather(const uint4* table, const uint64_t* ids, uint4* out, int rows) {
  // one warp per token; each lane loads up to 10 words before storing
  int lane = threadIdx.x % 32;
  int token = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (token * kHeads >= rows) return;
  const uint64_t* tid = ids + token * kHeads;
  uint4 v[10];
#pragma unroll
  for (int u = 0; u < 10; ++u) {
    int k = u * 32 + lane;  // 0..319 words of the token
    int h = k / kRowWords;
    v[u] = table[tid[h] * kRowWords + (k - h * kRowWords)];
  }
#pragma unroll
  for (int u = 0; u < 10; ++u) out[(size_t)token * kHeads * kRowWords + u * 32 + lane] = v[u];
}

long AnonHuge() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("AnonHugePages:", 0) == 0) return std::atol(line.c_str() + 14);
  return -1;
}

void Fill(uint8_t* p, size_t bytes) {
  int n = std::thread::hardware_concurrency();
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t)
    ts.emplace_back([=] {
      size_t b = bytes / n * t, e = t == n - 1 ? bytes : bytes / n * (t + 1);
      std::memset(p + b, t + 1, e - b);
    });
  for (auto& t : ts) t.join();
}

void Run(const char* name, const uint8_t* table, size_t bytes, uint8_t* pinned_src, bool same_ids = false) {
  uint64_t rows = bytes / kRowBytes;
  for (int tokens : {256, 8192}) {
    int n = tokens * kHeads;
    std::vector<uint64_t> ids(n);
    std::mt19937_64 rng(42);
    for (auto& x : ids) x = rng() % rows;
    uint64_t* d_ids;
    uint4* d_out;
    CK(cudaMalloc(&d_ids, n * 8));
    CK(cudaMalloc(&d_out, (size_t)n * kRowBytes));
    CK(cudaMemcpy(d_ids, ids.data(), n * 8, cudaMemcpyHostToDevice));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    const int iters = 50;
    int threads = 128, blocks = (tokens * 32 + threads - 1) / threads;
    Gather<<<blocks, threads>>>((const uint4*)table, d_ids, d_out, n);
    CK(cudaDeviceSynchronize());
    // fresh ids per iteration so TLB contents from the previous iteration do not help
    std::vector<uint64_t*> idsets(iters);
    for (int i = 0; i < iters; ++i) {
      if (!same_ids || i == 0) for (auto& x : ids) x = rng() % rows;
      CK(cudaMalloc(&idsets[i], n * 8));
      CK(cudaMemcpy(idsets[i], ids.data(), n * 8, cudaMemcpyHostToDevice));
    }
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i) Gather<<<blocks, threads>>>((const uint4*)table, idsets[i], d_out, n);
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms_g;
    cudaEventElapsedTime(&ms_g, a, b);
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i)
      cudaMemcpyAsync(d_out, pinned_src, (size_t)n * kRowBytes, cudaMemcpyHostToDevice);
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms_c;
    cudaEventElapsedTime(&ms_c, a, b);
    double gb = (double)n * kRowBytes * iters / 1e9;
    std::printf("%-28s tokens %5d  gather %7.2f GB/s (%7.1f us)  pinned copy %7.2f GB/s  ratio %.2f\n",
                name, tokens, gb / (ms_g / 1e3), ms_g * 1e3 / iters, gb / (ms_c / 1e3), ms_c / ms_g);
    for (auto p : idsets) cudaFree(p);
    cudaFree(d_ids);
    cudaFree(d_out);
  }
}

int main(int argc, char** argv) {
  size_t gb = argc > 1 ? std::atol(argv[1]) : 32;
  size_t bytes = gb << 30;
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  uint8_t* src;
  CK(cudaHostAlloc(&src, 64 << 20, 0));
  std::memset(src, 1, 64 << 20);
  std::printf("table %zu GB\n", gb);
  {
    std::system("cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag");
  }
  for (int huge = 0; huge < 2; ++huge) {
    auto t0 = std::chrono::steady_clock::now();
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    Fill((uint8_t*)p, bytes);
    auto t1 = std::chrono::steady_clock::now();
    CK(cudaHostRegister(p, bytes, cudaHostRegisterMapped));
    auto t2 = std::chrono::steady_clock::now();
    std::printf("mmap %s: AnonHugePages %ld kB, fill %.2f s, register %.2f s\n", huge ? "THP" : "4K",
                AnonHuge(), std::chrono::duration<double>(t1 - t0).count(),
                std::chrono::duration<double>(t2 - t1).count());
    Run(huge ? "mmap+THP+register" : "mmap 4K+register", (uint8_t*)p, bytes, src);
    if (huge) {
      Run("THP same ids every step", (uint8_t*)p, bytes, src, true);
      for (size_t fp : {64ull << 20, 256ull << 20, 1ull << 30, 4ull << 30, 16ull << 30}) {
        std::string n = "THP rows within " + std::to_string(fp >> 20) + " MB";
        Run(n.c_str(), (uint8_t*)p, fp, src);
      }
    }
    CK(cudaHostUnregister(p));
    munmap(p, bytes);
  }
  {
    auto t0 = std::chrono::steady_clock::now();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = 0;
    size_t gran = 0;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    std::printf("cuMem host granularity %zu\n", gran);
    CUmemGenericAllocationHandle h;
    CUresult r = cuMemCreate(&h, bytes, &prop, 0);
    if (r != CUDA_SUCCESS) {
      std::printf("cuMemCreate host numa -> %d; trying HOST\n", (int)r);
      prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
      CK(cuMemCreate(&h, bytes, &prop, 0));
    }
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, bytes, 2 << 20, 0, 0));
    CK(cuMemMap(va, bytes, 0, h, 0));
    CUmemAccessDesc acc[2]{};
    acc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[0].location.id = 0;
    acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    acc[1].location.type = prop.location.type;
    acc[1].location.id = prop.location.id;
    acc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(va, bytes, acc, 2));
    auto t1 = std::chrono::steady_clock::now();
    Fill((uint8_t*)va, bytes);
    auto t2 = std::chrono::steady_clock::now();
    std::printf("cuMem host: create+map %.2f s, fill %.2f s\n",
                std::chrono::duration<double>(t1 - t0).count(),
                std::chrono::duration<double>(t2 - t1).count());
    Run("cuMemCreate host 2M", (uint8_t*)va, bytes, src);
    CK(cuMemUnmap(va, bytes));
    CK(cuMemRelease(h));
    CK(cuMemAddressFree(va, bytes));
  }
  {
    size_t b4 = std::min<size_t>(bytes, 8ull << 30);
    auto t0 = std::chrono::steady_clock::now();
    uint8_t* p;
    CK(cudaHostAlloc(&p, b4, cudaHostAllocMapped));
    auto t1 = std::chrono::steady_clock::now();
    Fill(p, b4);
    std::printf("cudaHostAlloc %zu GB: %.2f s\n", b4 >> 30, std::chrono::duration<double>(t1 - t0).count());
    Run("cudaHostAlloc (<=8GB)", p, b4, src);
    cudaFreeHost(p);
  }
  return 0;
}
