// GPU transfer benchmarks, side by side with the baselines they must be compared with, in one
// run (results in bench/results/cuda_ipc.md):
//  - kv_gpu_to_host/<piece>/{ferry,cudaMemcpyBatchAsync}: a KV-shaped batch of 80,000
//    scattered pieces (16, 32, 128 KiB; remote slots shuffled) from GPU memory to pinned host
//    memory, through ferry (two engines of this process, `local` transport) and as one
//    cudaMemcpyBatchAsync of the same pieces; baseline pinned_1GiB/cudaMemcpy: one 1 GiB copy.
//  - kv_gpu_to_host_slab/<piece>/ferry and kv_host_slab_to_gpu/<piece>/ferry: the same pieces
//    scattered on the GPU but end to end in one pinned host slab (a request's blocks offloaded
//    and loaded back), written to the host / read from it; baselines pinned_1GiB/cudaMemcpy and
//    pinned_1GiB_h2d/cudaMemcpy. kv_gpu_to_host_strided/<piece>/ferry: half as many pieces in a
//    regular layout (every other slot on the GPU, end to end on the host): one 2D copy.
//  - kv_gpu_to_host/<piece>/kernel: ferry's copy kernel alone over the same pieces (descriptors
//    uploaded once, timed by CUDA events around one launch): what ferry's path adds to it
//    (posting, the launches of the ramp, completion) is the difference to .../ferry, whose
//    counter post_ms is the time WriteBatch() takes to return.
//  - kv_gpu0_to_gpu1/<piece>/{ferry,cudaMemcpyBatchAsync} and peer_1GiB/cudaMemcpyPeer: where
//    two GPUs exist (the cases report an error and move nothing otherwise).
//  - kv_cuda_ipc/<piece>/ferry (pieces of 4 KiB too): the same batch from this process's GPU memory into a
//    ferry_test_peer child's GPU memory on the same GPU, through cuda_ipc; baseline
//    d2d_1GiB/cudaMemcpy: one 1 GiB copy inside one GPU. ferry_2_in_flight posts the batch
//    twice before waiting, as layers in flight do.
//  - kv_d2d/<piece>/{ferry,kernel,naive}: the same batch between two buffers of one GPU in this
//    process: through ferry (local transport), ferry's copy kernel alone (one launch, timed by
//    CUDA events), and a naive kernel (one thread per 16-byte word of the batch, one launch):
//    what the kernel leaves of the device's bandwidth, and what ferry's path adds to it.
// GB/s is bytes moved per second (counter bytes_per_second), never read + written.
// Run: build/<preset>/bench/ferry_bench_cuda [--benchmark_filter=...]; FERRY_BENCH_HOST_MEM=thp
// puts the pinned host buffers on transparent huge pages (cudaHostRegister) instead of cudaHostAlloc;
// FERRY_BENCH_PIECES sets the pieces per batch (default 80,000), FERRY_BENCH_RUN their runs.
// The engines take the FERRY_* variables of EngineOptions::FromEnv (docs/configuration.md).
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_loop.h"  // PlanScatteredOps
#include "cuda/copy_kernels.h"
#include "cuda/runtime.h"
#include "ferry/engine.h"
#include "ferry/system.h"
#include "testing/peer_process.h"

namespace ferry::cuda {
int LaunchNaiveCopy(const Piece* pieces, uint32_t count, uint64_t piece_bytes, CUstream_st* stream);  // naive_copy.cu
}

namespace {

const uint64_t kPieces = [] {
  const char* n = std::getenv("FERRY_BENCH_PIECES");
  return n != nullptr && std::atoll(n) > 0 ? static_cast<uint64_t>(std::atoll(n)) : uint64_t{80'000};
}();
constexpr uint64_t kOneGiB = 1ull << 30;
using Clock = std::chrono::steady_clock;

// FERRY_BENCH_RUN: the pieces lie in runs of this many adjacent slots on both sides (as KV
// blocks allocated in runs), which the engine merges (EngineOptions::merge_adjacent_ops); the
// kernel and cudaMemcpyBatchAsync cases copy the pieces as they are. Default 1: all scattered.
const uint64_t kRun = [] {
  const char* n = std::getenv("FERRY_BENCH_RUN");
  return n != nullptr && std::atoll(n) > 0 ? static_cast<uint64_t>(std::atoll(n)) : uint64_t{1};
}();

std::vector<ferry::TransferOp> KvOps(uint64_t piece) { return ferry::tools::PlanScatteredOps(piece, kPieces, kRun, 42); }

struct DeviceBuffer {
  DeviceBuffer(int device, uint64_t bytes) : size(bytes) {
    auto p = ferry::cuda::Malloc(device, bytes);
    if (p.ok()) ptr = *p;
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) (void)ferry::cuda::Free(ptr);
  }
  void* ptr = nullptr;
  uint64_t size;
};

// Page-locked host memory: cudaHostAlloc, or with FERRY_BENCH_HOST_MEM=thp anonymous memory on
// transparent huge pages registered with cudaHostRegister (how bench/copy_sweep.cu allocates).
struct PinnedBuffer {
  explicit PinnedBuffer(uint64_t bytes) : size(bytes) {
    const char* kind = std::getenv("FERRY_BENCH_HOST_MEM");
    if (kind != nullptr && std::string(kind) == "thp") {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return;
      (void)madvise(p, bytes, MADV_HUGEPAGE);
      std::memset(p, 0, bytes);
      if (cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped) != cudaSuccess) {
        munmap(p, bytes);
        return;
      }
      ptr = p;
      mapped = true;
      return;
    }
    if (cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess) ptr = nullptr;
  }
  ~PinnedBuffer() {
    if (ptr == nullptr) return;
    if (mapped) {
      cudaHostUnregister(ptr);
      munmap(ptr, size);
    } else {
      cudaFreeHost(ptr);
    }
  }
  void* ptr = nullptr;
  uint64_t size;
  bool mapped = false;
};

// Everything one case needs, made on first use; one at a time (buffers reach 10 GiB).
struct Rig {
  std::string error;
  std::unique_ptr<DeviceBuffer> gpu0, gpu1;
  std::unique_ptr<PinnedBuffer> host;
  std::unique_ptr<ferry::Engine> a, b;
  std::unique_ptr<ferry::testing::PeerProcess> peer;
  ferry::Session session;
};

std::unique_ptr<Rig>& Current() {
  static std::unique_ptr<Rig> rig;
  return rig;
}

enum class Target { kHost, kGpu1, kIpcPeer, kGpu0 };

Rig* GetRig(Target target, uint64_t bytes) {
  static std::pair<Target, uint64_t> made{Target::kHost, 0};
  auto& rig = Current();
  if (rig && made == std::make_pair(target, bytes)) return rig.get();
  rig.reset();  // free the previous case's buffers first
  rig = std::make_unique<Rig>();
  made = {target, bytes};
  auto fail = [&](const std::string& why) {
    rig->error = why;
    return rig.get();
  };
  std::string reason;
  if (!ferry::CudaAvailable(&reason)) return fail("no GPU: " + reason);
  if (target == Target::kGpu1 && ferry::cuda::DeviceCount() < 2) return fail("needs two GPUs; this machine has one");
  rig->gpu0 = std::make_unique<DeviceBuffer>(0, bytes);
  if (rig->gpu0->ptr == nullptr) return fail("cudaMalloc of the source failed");
  // The FERRY_* variables apply (e.g. FERRY_WAIT_SPIN), as in the CLI.
  auto env = ferry::EngineOptions::FromEnv();
  if (!env.ok()) return fail(env.status().ToString());
  ferry::EngineOptions options = *env;
  options.default_deadline = std::chrono::seconds(120);
  options.key = "bench-cuda-a";
  options.transports = target == Target::kIpcPeer ? std::vector<std::string>{"cuda_ipc", "ucx"}
                                                  : std::vector<std::string>{"local"};
  auto a = ferry::Engine::Create(options);
  if (!a.ok()) return fail(a.status().ToString());
  rig->a = std::move(a).value();
  auto local = rig->a->RegisterMemory(rig->gpu0->ptr, bytes, ferry::MemoryKind::kCuda, 0);
  if (!local.ok()) return fail(local.status().ToString());
  ferry::MemoryDesc remote;
  if (target == Target::kIpcPeer) {
    rig->peer = ferry::testing::PeerProcess::Start(bytes, {"--kind", "cuda", "--transports", "cuda_ipc,ucx", "--fill", "0"});
    if (!rig->peer) return fail("ferry_test_peer did not start");
    if (auto s = rig->a->AddPeer(rig->peer->engine); !s.ok()) return fail(s.ToString());
    remote = rig->peer->memory;
  } else {
    options.key = "bench-cuda-b";
    auto b = ferry::Engine::Create(options);
    if (!b.ok()) return fail(b.status().ToString());
    rig->b = std::move(b).value();
    if (auto s = rig->a->AddPeer(rig->b->Describe()); !s.ok()) return fail(s.ToString());
    ferry::Result<ferry::MemoryDesc> r = ferry::Status(ferry::Code::kInternal, "unset");
    if (target == Target::kHost) {
      rig->host = std::make_unique<PinnedBuffer>(bytes);
      if (rig->host->ptr == nullptr) return fail("cudaHostAlloc failed");
      r = rig->b->RegisterMemory(rig->host->ptr, bytes);
    } else if (target == Target::kGpu0) {
      rig->gpu1 = std::make_unique<DeviceBuffer>(0, bytes);
      if (rig->gpu1->ptr == nullptr) return fail("cudaMalloc of the destination failed");
      r = rig->b->RegisterMemory(rig->gpu1->ptr, bytes, ferry::MemoryKind::kCuda, 0);
    } else {
      rig->gpu1 = std::make_unique<DeviceBuffer>(1, bytes);
      if (rig->gpu1->ptr == nullptr) return fail("cudaMalloc on GPU 1 failed");
      r = rig->b->RegisterMemory(rig->gpu1->ptr, bytes, ferry::MemoryKind::kCuda, 1);
    }
    if (!r.ok()) return fail(r.status().ToString());
    remote = *r;
  }
  auto session = rig->a->OpenSession(*local, remote);
  if (!session.ok()) return fail(session.status().ToString());
  rig->session = *session;
  return rig.get();
}

void Finish(benchmark::State& state, uint64_t bytes, uint64_t pieces, const std::string& path) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  if (pieces > 0)
    state.counters["time_per_piece"] = benchmark::Counter(
        static_cast<double>(pieces), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  if (!path.empty()) state.SetLabel(path);
}

// Each iteration posts `ops` as one batch (a read or a write) and waits for it; the time until
// the post returned is added to *post_s, the batch's path kept in *path. False after a failed
// batch (the case is skipped with its error).
bool TimeBatches(benchmark::State& state, Rig* rig, const std::vector<ferry::TransferOp>& ops, bool read,
                 double* post_s, std::string* path) {
  for (auto _ : state) {
    auto start = Clock::now();
    ferry::Transfer t = read ? rig->session.ReadBatch(ops) : rig->session.WriteBatch(ops);
    *post_s += std::chrono::duration<double>(Clock::now() - start).count();
    ferry::Status s = t.Wait();
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return false;
    }
    *path = t.path().ToString();
  }
  return true;
}

void FerryKv(benchmark::State& state, Target target, uint64_t piece) {
  const uint64_t bytes = kPieces * piece;
  Rig* rig = GetRig(target, bytes);
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  const auto ops = KvOps(piece);
  std::string path;
  double post_s = 0;
  if (!TimeBatches(state, rig, ops, /*read=*/false, &post_s, &path)) return;
  state.counters["post_ms"] = benchmark::Counter(post_s * 1e3 / static_cast<double>(state.iterations()));
  Finish(state, bytes, kPieces, path);
}

// GPU pieces scattered, host side one slab in order: written to it (read == false) or read
// back from it.
void FerrySlab(benchmark::State& state, uint64_t piece, bool read, bool strided) {
  const uint64_t bytes = kPieces * piece;
  Rig* rig = GetRig(Target::kHost, bytes);
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  std::vector<ferry::TransferOp> ops = KvOps(piece);
  for (ferry::TransferOp& o : ops) std::swap(o.local_offset, o.remote_offset);  // GPU side scattered
  if (strided) {
    ops.resize(kPieces / 2);
    for (uint64_t i = 0; i < ops.size(); ++i) ops[i] = {2 * i * piece, i * piece, piece};
  }
  const uint64_t moved = ops.size() * piece;
  std::string path;
  double post_s = 0;
  if (!TimeBatches(state, rig, ops, read, &post_s, &path)) return;
  Finish(state, moved, ops.size(), path);
}

// The same batch posted twice before either is waited for (the two write the same bytes), as
// an application with layers in flight does: the host's work for one batch (check, descriptor
// fill, launches) and the completion of the other overlap. Bytes: both batches'.
void FerryKvTwoInFlight(benchmark::State& state, Target target, uint64_t piece) {
  const uint64_t bytes = kPieces * piece;
  Rig* rig = GetRig(target, bytes);
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  const auto ops = KvOps(piece);
  std::string path;
  for (auto _ : state) {
    auto start = Clock::now();
    ferry::Transfer a = rig->session.WriteBatch(ops);
    ferry::Transfer b = rig->session.WriteBatch(ops);
    ferry::Status sa = a.Wait(), sb = b.Wait();
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    if (!sa.ok() || !sb.ok()) return state.SkipWithError((sa.ok() ? sb : sa).ToString().c_str());
    path = a.path().ToString();
  }
  Finish(state, 2 * bytes, 2 * kPieces, path);
}

// ferry's copy kernel alone, one launch over the batch's pieces (cut as the engine cuts them),
// timed on the GPU.
void KernelKv(benchmark::State& state, Target target, uint64_t piece, bool naive) {
  const uint64_t bytes = kPieces * piece;
  Rig* rig = GetRig(target, bytes);
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  void* dst = target == Target::kHost ? rig->host->ptr : rig->gpu1->ptr;
  std::vector<ferry::cuda::Piece> pieces;
  for (const auto& op : KvOps(piece))
    for (uint64_t at = 0; at < op.size; at += ferry::cuda::kMaxPieceBytes)
      pieces.push_back({reinterpret_cast<uint64_t>(dst) + op.remote_offset + at,
                        reinterpret_cast<uint64_t>(rig->gpu0->ptr) + op.local_offset + at,
                        std::min<uint64_t>(ferry::cuda::kMaxPieceBytes, op.size - at)});
  void* dpieces = nullptr;
  int sms = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;
  cudaError_t e = cudaMalloc(&dpieces, pieces.size() * sizeof(ferry::cuda::Piece));
  if (e == cudaSuccess)
    e = cudaMemcpy(dpieces, pieces.data(), pieces.size() * sizeof(ferry::cuda::Piece), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  // FERRY_BENCH_BLOCKS_PER_SM: the grid, in blocks per SM (2 by default, as the engine launches).
  int per_sm = 2;
  if (const char* b = std::getenv("FERRY_BENCH_BLOCKS_PER_SM"); b != nullptr && std::atoi(b) > 0) per_sm = std::atoi(b);
  sms *= per_sm;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreate(&begin);
  if (e == cudaSuccess) e = cudaEventCreate(&end);
  for (auto _ : state) {
    if (e != cudaSuccess) break;
    e = cudaEventRecord(begin, stream);
    if (e == cudaSuccess && naive)
      e = static_cast<cudaError_t>(ferry::cuda::LaunchNaiveCopy(static_cast<const ferry::cuda::Piece*>(dpieces),
                                                               static_cast<uint32_t>(pieces.size()),
                                                               pieces.empty() ? 0 : pieces[0].size, stream));
    else if (e == cudaSuccess)
      e = static_cast<cudaError_t>(ferry::cuda::LaunchBatchCopy(static_cast<const ferry::cuda::Piece*>(dpieces),
                                                               static_cast<uint32_t>(pieces.size()),
                                                               static_cast<uint32_t>(sms), stream));
    if (e == cudaSuccess) e = cudaEventRecord(end, stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(end);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, begin, end);
    state.SetIterationTime(ms / 1e3);
  }
  if (e != cudaSuccess) state.SkipWithError(cudaGetErrorString(e));
  if (begin != nullptr) cudaEventDestroy(begin);
  if (end != nullptr) cudaEventDestroy(end);
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (dpieces != nullptr) cudaFree(dpieces);
  Finish(state, bytes, kPieces, "");
}

// One cudaMemcpyBatchAsync of the same pieces into pinned host memory or GPU 1.
void BatchAsyncKv(benchmark::State& state, Target target, uint64_t piece) {
  const uint64_t bytes = kPieces * piece;
  Rig* rig = GetRig(target, bytes);
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
#if CUDART_VERSION >= 13000
  const auto ops = KvOps(piece);
  std::vector<void*> dsts(kPieces);
  std::vector<const void*> srcs(kPieces);
  std::vector<size_t> sizes(kPieces, piece);
  char* dst = static_cast<char*>(target == Target::kHost ? rig->host->ptr : rig->gpu1->ptr);
  for (uint64_t i = 0; i < kPieces; ++i) {
    dsts[i] = dst + ops[i].remote_offset;
    srcs[i] = static_cast<const char*>(rig->gpu0->ptr) + ops[i].local_offset;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attr_index = 0;
  for (auto _ : state) {
    auto start = Clock::now();
    cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), kPieces, &attr, &attr_index, 1, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    if (e != cudaSuccess) {
      state.SkipWithError(cudaGetErrorString(e));
      break;
    }
  }
  cudaStreamDestroy(stream);
  Finish(state, bytes, kPieces, "");
#else
  state.SkipWithError("needs CUDA 13");
#endif
}

// One large copy: the link's ceiling. kind: 0 GPU -> pinned host, 1 GPU0 -> GPU1, 2 in GPU0,
// 3 pinned host -> GPU.
void OneCopy(benchmark::State& state, int kind) {
  std::string reason;
  if (!ferry::CudaAvailable(&reason)) return state.SkipWithError(("no GPU: " + reason).c_str());
  if (kind == 1 && ferry::cuda::DeviceCount() < 2) return state.SkipWithError("needs two GPUs; this machine has one");
  Current().reset();
  DeviceBuffer src(0, kOneGiB);
  std::unique_ptr<DeviceBuffer> dev_dst;
  std::unique_ptr<PinnedBuffer> host_dst;
  void* dst = nullptr;
  if (kind == 0 || kind == 3) {
    host_dst = std::make_unique<PinnedBuffer>(kOneGiB);
    dst = host_dst->ptr;
  } else {
    dev_dst = std::make_unique<DeviceBuffer>(kind == 1 ? 1 : 0, kOneGiB);
    dst = dev_dst->ptr;
  }
  if (src.ptr == nullptr || dst == nullptr) return state.SkipWithError("allocation failed");
  if (kind == 1) (void)cudaDeviceEnablePeerAccess(1, 0);
  for (auto _ : state) {
    auto start = Clock::now();
    cudaError_t e = kind == 1   ? cudaMemcpyPeer(dst, 1, src.ptr, 0, kOneGiB)
                    : kind == 3 ? cudaMemcpy(src.ptr, dst, kOneGiB, cudaMemcpyDefault)  // host -> GPU
                                : cudaMemcpy(dst, src.ptr, kOneGiB, cudaMemcpyDefault);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    if (e != cudaSuccess) return state.SkipWithError(cudaGetErrorString(e));
  }
  Finish(state, kOneGiB, 0, "");
}

void Register() {
  auto opts = [](benchmark::internal::Benchmark* b) {
    b->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
  };
  opts(benchmark::RegisterBenchmark("pinned_1GiB/cudaMemcpy", OneCopy, 0));
  for (uint64_t kib : {16, 32, 128}) {
    const uint64_t piece = kib << 10;
    const std::string p = std::to_string(kib) + "KiB";
    opts(benchmark::RegisterBenchmark(("kv_gpu_to_host/" + p + "/ferry").c_str(), FerryKv, Target::kHost, piece));
    opts(benchmark::RegisterBenchmark(("kv_gpu_to_host/" + p + "/kernel").c_str(), KernelKv, Target::kHost, piece, false));
    opts(benchmark::RegisterBenchmark(("kv_gpu_to_host/" + p + "/cudaMemcpyBatchAsync").c_str(), BatchAsyncKv,
                                      Target::kHost, piece));
  }
  opts(benchmark::RegisterBenchmark("pinned_1GiB_h2d/cudaMemcpy", OneCopy, 3));
  for (uint64_t kib : {16, 32, 128}) {
    const std::string p = std::to_string(kib) + "KiB";
    opts(benchmark::RegisterBenchmark(("kv_gpu_to_host_slab/" + p + "/ferry").c_str(), FerrySlab, kib << 10, false,
                                      false));
    opts(benchmark::RegisterBenchmark(("kv_host_slab_to_gpu/" + p + "/ferry").c_str(), FerrySlab, kib << 10, true,
                                      false));
    opts(benchmark::RegisterBenchmark(("kv_gpu_to_host_strided/" + p + "/ferry").c_str(), FerrySlab, kib << 10,
                                      false, true));
  }
  opts(benchmark::RegisterBenchmark("peer_1GiB/cudaMemcpyPeer", OneCopy, 1));
  for (uint64_t kib : {16, 32, 128}) {
    const std::string p = "kv_gpu0_to_gpu1/" + std::to_string(kib) + "KiB/";
    opts(benchmark::RegisterBenchmark((p + "ferry").c_str(), FerryKv, Target::kGpu1, kib << 10));
    opts(benchmark::RegisterBenchmark((p + "cudaMemcpyBatchAsync").c_str(), BatchAsyncKv, Target::kGpu1, kib << 10));
  }
  opts(benchmark::RegisterBenchmark("d2d_1GiB/cudaMemcpy", OneCopy, 2));
  for (uint64_t kib : {4, 16, 32, 128}) {  // 4 KiB: small blocks, where each op's descriptor weighs most
    const std::string p = std::to_string(kib) + "KiB/";
    opts(benchmark::RegisterBenchmark(("kv_cuda_ipc/" + p + "ferry").c_str(), FerryKv, Target::kIpcPeer, kib << 10));
    opts(benchmark::RegisterBenchmark(("kv_cuda_ipc/" + p + "ferry_2_in_flight").c_str(), FerryKvTwoInFlight,
                                      Target::kIpcPeer, kib << 10));
    opts(benchmark::RegisterBenchmark(("kv_d2d/" + p + "ferry").c_str(), FerryKv, Target::kGpu0, kib << 10));
    opts(benchmark::RegisterBenchmark(("kv_d2d/" + p + "kernel").c_str(), KernelKv, Target::kGpu0, kib << 10, false));
    opts(benchmark::RegisterBenchmark(("kv_d2d/" + p + "naive").c_str(), KernelKv, Target::kGpu0, kib << 10, true));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  Current().reset();
  benchmark::Shutdown();
  return 0;
}
