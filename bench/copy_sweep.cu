// copy_sweep: times variants of a batched scattered-copy kernel against the copy engines, on
// the paths ferry's CUDA transports use (device -> device, device -> pinned host, pinned host
// -> device, GPU0 -> GPU1 where two GPUs exist). Each batch is `count` pieces of `piece` bytes;
// piece i of the source goes to a shuffled slot of the destination. Baselines, in the same run:
// one cudaMemcpy of 1 GiB on the same path, and cudaMemcpyBatchAsync of the same pieces.
// Every variant's output is checked against the source before it is timed.
//
// A measurement program for the GPU machine, built by hand there:
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/copy_sweep.cu -o /tmp/copy_sweep
//   /tmp/copy_sweep [batch MiB=2500] [piece sizes in KiB=16,32,128]
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

struct Piece {
  uint64_t dst, src, size;
};

// V0: one warp per piece, 16-byte words, UNROLL words in flight per lane (ferry's kernel).
template <int UNROLL>
__global__ void __launch_bounds__(256) WarpPerPiece(const Piece* __restrict__ pieces, uint32_t count) {
  const int lane = threadIdx.x & 31;
  const uint32_t wpb = blockDim.x / 32;
  const uint32_t total = gridDim.x * wpb;
  for (uint32_t p = blockIdx.x * wpb + threadIdx.x / 32; p < count; p += total) {
    const Piece pc = pieces[p];
    const uint4* s = reinterpret_cast<const uint4*>(pc.src);
    uint4* d = reinterpret_cast<uint4*>(pc.dst);
    const uint32_t words = static_cast<uint32_t>(pc.size / 16);
    uint32_t i = lane;
    for (; i + (UNROLL - 1) * 32 < words; i += UNROLL * 32) {
      uint4 v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = s[i + u * 32];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) d[i + u * 32] = v[u];
    }
    for (; i < words; i += 32) d[i] = s[i];
  }
}

// V1: one block per piece (grid-stride over pieces), every thread UNROLL words in flight.
template <int UNROLL>
__global__ void BlockPerPiece(const Piece* __restrict__ pieces, uint32_t count) {
  for (uint32_t p = blockIdx.x; p < count; p += gridDim.x) {
    const Piece pc = pieces[p];
    const uint4* s = reinterpret_cast<const uint4*>(pc.src);
    uint4* d = reinterpret_cast<uint4*>(pc.dst);
    const uint32_t words = static_cast<uint32_t>(pc.size / 16);
    const uint32_t step = blockDim.x;
    uint32_t i = threadIdx.x;
    for (; i + (UNROLL - 1) * step < words; i += UNROLL * step) {
      uint4 v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = s[i + u * step];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) d[i + u * step] = v[u];
    }
    for (; i < words; i += step) d[i] = s[i];
  }
}

// V2: the batch as one flat array of 16-byte words: thread t copies words t, t + T, ... and
// finds its piece by division (every piece the same size, as a KV batch is).
__global__ void FlatUniform(const Piece* __restrict__ pieces, uint32_t count, uint32_t words_per_piece) {
  const uint64_t total = uint64_t{count} * words_per_piece;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < total; w += stride) {
    const uint32_t p = static_cast<uint32_t>(w / words_per_piece);
    const uint32_t i = static_cast<uint32_t>(w - uint64_t{p} * words_per_piece);
    reinterpret_cast<uint4*>(pieces[p].dst)[i] = reinterpret_cast<const uint4*>(pieces[p].src)[i];
  }
}

struct Buffers {
  char* src = nullptr;
  char* dst = nullptr;
  bool src_host = false, dst_host = false;
};

char* HostPinned(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::exit(2);
  madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);
  CHECK(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  return static_cast<char*>(p);
}

int sms = 0;

template <typename Launch>
double TimeMs(Launch launch, int iters) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  launch();  // warm-up
  CHECK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return ms[ms.size() / 2];
}

// Poisons dst, runs once, then compares the first and last 16 bytes of every piece and the whole
// of every 61st piece with the source (filled once per path by FillSource).
template <typename Launch>
bool Verify(const char* name, Launch launch, const Buffers& buf, const std::vector<Piece>& host_pieces,
            size_t total, const std::vector<char>& pattern, std::vector<char>& out) {
  if (buf.dst_host) std::memset(buf.dst, 0xAB, total); else CHECK(cudaMemset(buf.dst, 0xAB, total));
  CHECK(cudaDeviceSynchronize());
  launch();
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(out.data(), buf.dst, total, cudaMemcpyDefault));
  for (size_t k = 0; k < host_pieces.size(); ++k) {
    const Piece& p = host_pieces[k];
    size_t so = p.src - reinterpret_cast<uint64_t>(buf.src), d = p.dst - reinterpret_cast<uint64_t>(buf.dst);
    bool ok = k % 61 == 0 ? std::memcmp(out.data() + d, pattern.data() + so, p.size) == 0
                          : std::memcmp(out.data() + d, pattern.data() + so, 16) == 0 &&
                                std::memcmp(out.data() + d + p.size - 16, pattern.data() + so + p.size - 16, 16) == 0;
    if (!ok) {
      std::printf("VERIFY FAILED: %s (piece %zu)\n", name, k);
      return false;
    }
  }
  return true;
}

void RunPath(const char* path, Buffers buf, int device, uint32_t count, uint64_t piece, int peer_for_dma) {
  const size_t total = size_t{count} * piece;
  std::vector<uint32_t> perm(count);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  std::vector<Piece> pieces(count);
  for (uint32_t i = 0; i < count; ++i)
    pieces[i] = Piece{reinterpret_cast<uint64_t>(buf.dst) + uint64_t{perm[i]} * piece,
                      reinterpret_cast<uint64_t>(buf.src) + uint64_t{i} * piece, piece};
  std::vector<char> pattern(total), out(total);
  for (size_t i = 0; i < total / 8; ++i) reinterpret_cast<uint64_t*>(pattern.data())[i] = i * 0x9E3779B97F4A7C15ull + 17;
  CHECK(cudaMemcpy(buf.src, pattern.data(), total, cudaMemcpyDefault));
  Piece* dpieces = nullptr;
  CHECK(cudaMalloc(&dpieces, count * sizeof(Piece)));
  CHECK(cudaMemcpy(dpieces, pieces.data(), count * sizeof(Piece), cudaMemcpyHostToDevice));
  const double gb = total / 1e9;
  const int iters = 10;
  auto report = [&](const std::string& name, double ms) {
    std::printf("%-10s %7lu KiB x %6u  %-34s %8.1f GB/s  (%.3f ms)\n", path, piece >> 10, count,
                name.c_str(), gb / (ms / 1e3), ms);
  };

  // Baselines: one 1 GiB copy on the same path; the copy engines over the same pieces.
  const size_t big = std::min<size_t>(total, size_t{1} << 30);
  report("cudaMemcpyAsync 1 GiB", TimeMs([&] { CHECK(cudaMemcpyAsync(buf.dst, buf.src, big, cudaMemcpyDefault)); }, iters) *
                                      (double(total) / big));
  {
    std::vector<void*> d(count);
    std::vector<void*> s(count);
    std::vector<size_t> z(count, piece);
    for (uint32_t i = 0; i < count; ++i) {
      d[i] = reinterpret_cast<void*>(pieces[i].dst);
      s[i] = reinterpret_cast<void*>(pieces[i].src);
    }
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
    auto batch = [&] {
      CHECK(cudaMemcpyBatchAsync(d.data(), s.data(), z.data(), count, &attr, &attr_idx, 1, st));
      CHECK(cudaStreamSynchronize(st));
    };
    if (Verify("batch", batch, buf, pieces, total, pattern, out)) report("cudaMemcpyBatchAsync", TimeMs(batch, 3));
    CHECK(cudaStreamDestroy(st));
  }

  const uint32_t wpp = static_cast<uint32_t>(piece / 16);
  struct V {
    std::string name;
    std::function<void()> run;
  };
  std::vector<V> vs;
  for (int per_sm : {1, 2, 4, 8}) {
    uint32_t blocks = sms * per_sm;
    vs.push_back({"warp/piece u8 256t " + std::to_string(per_sm) + "b/SM",
                  [=] { WarpPerPiece<8><<<blocks, 256>>>(dpieces, count); }});
  }
  vs.push_back({"warp/piece u4 256t 8b/SM", [=] { WarpPerPiece<4><<<sms * 8, 256>>>(dpieces, count); }});
  for (int threads : {256, 512, 1024}) {
    for (int per_sm : {1, 2, 4, 8}) {
      if (threads * per_sm > 2048) continue;
      uint32_t blocks = sms * per_sm;
      vs.push_back({"block/piece u4 " + std::to_string(threads) + "t " + std::to_string(per_sm) + "b/SM",
                    [=] { BlockPerPiece<4><<<blocks, threads>>>(dpieces, count); }});
    }
  }
  vs.push_back({"block/piece u4 512t grid=count", [=] { BlockPerPiece<4><<<count, 512>>>(dpieces, count); }});
  vs.push_back({"block/piece u2 1024t 2b/SM", [=] { BlockPerPiece<2><<<sms * 2, 1024>>>(dpieces, count); }});
  vs.push_back({"block/piece u8 256t 4b/SM", [=] { BlockPerPiece<8><<<sms * 4, 256>>>(dpieces, count); }});
  for (int per_sm : {2, 4, 8})
    vs.push_back({"flat 256t " + std::to_string(per_sm) + "b/SM",
                  [=] { FlatUniform<<<sms * per_sm, 256>>>(dpieces, count, wpp); }});
  for (auto& v : vs) {
    if (!Verify(v.name.c_str(), v.run, buf, pieces, total, pattern, out)) continue;
    report(v.name, TimeMs(v.run, iters));
  }
  CHECK(cudaFree(dpieces));
}

int main(int argc, char** argv) {
  // Every size moves the same bytes: 80,000 pieces of 32 KiB by default.
  const size_t batch_bytes = (argc > 1 ? std::stoull(argv[1]) : 2500) << 20;
  std::vector<uint64_t> sizes;
  std::string list = argc > 2 ? argv[2] : "16,32,128";
  for (size_t at = 0; at < list.size();) {
    size_t comma = list.find(',', at);
    sizes.push_back(std::stoull(list.substr(at, comma - at)) << 10);
    at = comma == std::string::npos ? list.size() : comma + 1;
  }
  int ndev = 0;
  CHECK(cudaGetDeviceCount(&ndev));
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("devices %d, SMs %d, batch %zu MiB\n", ndev, sms, batch_bytes >> 20);
  for (uint64_t piece : sizes) {
    const uint32_t count = static_cast<uint32_t>(batch_bytes / piece);
    const size_t total = size_t{count} * piece;
    char *d0 = nullptr, *d1 = nullptr;
    CHECK(cudaMalloc(&d0, total));
    CHECK(cudaMalloc(&d1, total));
    char* h = HostPinned(total);
    RunPath("d2d", {d0, d1}, 0, count, piece, -1);
    RunPath("d2h", {d0, h, false, true}, 0, count, piece, -1);
    RunPath("h2d", {h, d1, true, false}, 0, count, piece, -1);
    CHECK(cudaFree(d1));
    if (ndev > 1) {
      CHECK(cudaDeviceEnablePeerAccess(1, 0));
      CHECK(cudaSetDevice(1));
      CHECK(cudaMalloc(&d1, total));
      CHECK(cudaSetDevice(0));
      RunPath("gpu0->gpu1", {d0, d1}, 0, count, piece, 1);
      CHECK(cudaFree(d1));
    } else {
      std::printf("gpu0->gpu1: skipped, one GPU\n");
    }
    CHECK(cudaFree(d0));
    CHECK(cudaHostUnregister(h));
    munmap(h, total);
  }
  return 0;
}
