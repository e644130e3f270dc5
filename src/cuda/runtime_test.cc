// The CUDA runtime seam and the copy engine directly (no engine, no transport). Every test
// skips where no CUDA device is usable. The local transport's CUDA path through engines:
// src/engine/local_cuda_test.cc.
#include "testing/cuda_buffer.h"

#include "ferry/gpu.h"

namespace ferry {
namespace {

using namespace cuda_testing;  // NOLINT: test helpers

#if FERRY_HAVE_CUDA
// Posts a batch of offsets between two device buffers of `bytes` each (from `local` to
// `remote` for a write), the source random and the destination zeroed, and checks that every
// byte lands where its op says and no other changes. With `buffer`, `ops` lie in it: the handle
// is let go once the batch is posted (the batch holds the buffer until it completes).
void PostAndCheck(cuda::CopyEngine& engine, std::span<const TransferOp> ops, void* local, void* remote, size_t bytes,
                  bool write, uint64_t seed, std::optional<cuda::OpBuffer> buffer = std::nullopt) {
  const std::vector<TransferOp> kept(ops.begin(), ops.end());  // a buffer's ops are gone with it
  auto data = RandomBytes(bytes, seed);
  void* from = write ? local : remote;
  void* to = write ? remote : local;
  ASSERT_TRUE(cuda::CopySync(from, data.data(), bytes).ok());
  ASSERT_TRUE(cuda::CopySync(to, std::vector<uint8_t>(bytes, 0).data(), bytes).ok());
  cuda::OffsetBatch batch{ops, static_cast<std::byte*>(to), static_cast<const std::byte*>(from), write,
                          buffer ? &*buffer : nullptr};
  cuda::PostOptions options;
  options.kernel_ok = true;
  auto c = engine.Post(batch, options);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  buffer.reset();
  ASSERT_TRUE(WaitDone(*c).ok());
  std::vector<uint8_t> out(bytes);
  ASSERT_TRUE(cuda::CopySync(out.data(), to, bytes).ok());
  std::vector<uint8_t> want(bytes, 0);
  for (const TransferOp& o : kept) {
    const uint64_t d = write ? o.remote_offset : o.local_offset, s = write ? o.local_offset : o.remote_offset;
    std::memcpy(want.data() + d, data.data() + s, o.size);
  }
  ASSERT_EQ(out, want) << (write ? "write" : "read");
}

TEST(CudaRuntime, RegistrationAndPointers) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  std::vector<uint8_t> host(1 << 20);
  ASSERT_TRUE(cuda::HostRegister(host.data(), host.size()).ok());
  EXPECT_EQ(cuda::HostRegister(host.data(), host.size()).code(), Code::kAlreadyExists);
  EXPECT_TRUE(cuda::IsMappedHost(host.data() + 4096, 0));
  EXPECT_TRUE(cuda::HostUnregister(host.data()).ok());
  EXPECT_EQ(cuda::HostUnregister(host.data()).code(), Code::kNotFound);
  EXPECT_FALSE(cuda::IsMappedHost(host.data(), 0));

  auto dev = cuda::Malloc(0, 4096);
  ASSERT_TRUE(dev.ok());
  auto info = cuda::QueryPointer(*dev);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->device_memory);
  EXPECT_EQ(info->device, 0);
  EXPECT_FALSE(cuda::QueryPointer(host.data())->device_memory);
  EXPECT_TRUE(cuda::Free(*dev).ok());
  EXPECT_FALSE(cuda::Devices().empty());
  EXPECT_EQ(cuda::Malloc(0, size_t{1} << 62).status().code(), Code::kResourceExhausted);
}

TEST(CudaRuntime, CopyEngineCompletesThroughCallbackAndTest) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto src = cuda::Malloc(0, 1 << 20);
  auto dst = cuda::Malloc(0, 1 << 20);
  ASSERT_TRUE(src.ok() && dst.ok());
  auto data = RandomBytes(1 << 20, 16);
  ASSERT_TRUE(cuda::CopySync(*src, data.data(), data.size()).ok());
  std::vector<cuda::Copy> copies;
  for (size_t i = 0; i < 256; ++i)
    copies.push_back({static_cast<char*>(*dst) + i * 4096, static_cast<char*>(*src) + (255 - i) * 4096, 4096});
  std::atomic<int> calls{0};
  cuda::PostOptions options;
  options.kernel_ok = true;
  options.on_done = [&](const Status& s) {
    EXPECT_TRUE(s.ok()) << s.ToString();
    calls.fetch_add(1);
  };
  auto c = (*engine)->Post(copies, options);
  ASSERT_TRUE(c.ok());
  while (!(*c)->Test()) std::this_thread::yield();
  EXPECT_TRUE((*c)->status().ok());
  EXPECT_EQ(calls.load(), 1);
  std::vector<uint8_t> out(1 << 20);
  ASSERT_TRUE(cuda::CopySync(out.data(), *dst, out.size()).ok());
  for (size_t i = 0; i < 256; ++i)
    ASSERT_EQ(std::memcmp(out.data() + i * 4096, data.data() + (255 - i) * 4096, 4096), 0) << i;
  engine->reset();
  EXPECT_TRUE(cuda::Free(*src).ok());
  EXPECT_TRUE(cuda::Free(*dst).ok());
}

// The engine alternates a batch's launches between two streams, so two batches in flight
// together may move their bytes at the same time (README: data is not ordered between transfers
// in flight together). What holds: both land whole, their completions come in the order posted,
// and a batch posted once the one before completed lands after it, whether the first went
// through several kernel launches or the DMA engines. Batch 2 (in flight beside batch 1) writes
// elsewhere; batch 3, posted after batch 1 completed, rewrites the destination of batch 1's last
// pieces (those of its last launch) from another source, and its bytes must be what stays.
TEST(CudaRuntime, BatchesInFlightTogetherLandWholeAndALaterBatchLandsLast) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr size_t kPiece = 4096, kPieces = 40'000, kBytes = kPiece * kPieces;  // 5 launches
  auto a = cuda::Malloc(0, kBytes), b = cuda::Malloc(0, kBytes), dst = cuda::Malloc(0, kBytes),
       dst2 = cuda::Malloc(0, kBytes);
  ASSERT_TRUE(a.ok() && b.ok() && dst.ok() && dst2.ok());
  auto data_a = RandomBytes(kBytes, 1), data_b = RandomBytes(kBytes, 2);
  ASSERT_TRUE(cuda::CopySync(*a, data_a.data(), kBytes).ok());
  ASSERT_TRUE(cuda::CopySync(*b, data_b.data(), kBytes).ok());
  auto at = [](void* base, size_t i) { return static_cast<char*>(base) + i * kPiece; };
  cuda::PostOptions options;
  options.kernel_ok = true;
  for (int round = 0; round < 6; ++round) {
    // Round 0-1: batch 1 is kernel launches; round 2-3: a few 40 MB pieces on the DMA engines;
    // round 4-5: the same large pieces cut for the kernel (large_to_dma off, as for copies
    // within one device's memory).
    const bool dma_first = round >= 2;
    options.large_to_dma = round < 4;
    std::vector<cuda::Copy> first, beside, last;
    if (dma_first) {
      for (size_t q = 0; q < 4; ++q)
        first.push_back({at(*dst, q * kPieces / 4), at(*a, q * kPieces / 4), kBytes / 4});
    } else {
      for (size_t i = 0; i < kPieces; ++i) first.push_back({at(*dst, i), at(*a, i), kPiece});
    }
    for (size_t i = 0; i < kPieces; ++i) beside.push_back({at(*dst2, i), at(*b, kPieces - 1 - i), kPiece});
    const size_t from = kPieces - 2000;  // inside batch 1's last launch, or its last DMA piece
    for (size_t i = from; i < kPieces; ++i) last.push_back({at(*dst, i), at(*b, i), kPiece});
    auto c1 = (*engine)->Post(first, options);
    auto c2 = (*engine)->Post(beside, options);
    ASSERT_TRUE(c1.ok() && c2.ok());
    ASSERT_TRUE(WaitDone(*c2).ok()) << "round " << round;
    EXPECT_TRUE((*c1)->Test()) << "round " << round << ": batch 2 completed before batch 1";
    ASSERT_TRUE(WaitDone(*c1).ok()) << "round " << round;
    std::vector<uint8_t> out(kBytes);
    ASSERT_TRUE(cuda::CopySync(out.data(), *dst, kBytes).ok());
    ASSERT_EQ(std::memcmp(out.data(), data_a.data(), kBytes), 0) << "round " << round << ": batch 1";
    ASSERT_TRUE(cuda::CopySync(out.data(), *dst2, kBytes).ok());
    for (size_t i = 0; i < kPieces; i += 7)
      ASSERT_EQ(std::memcmp(out.data() + i * kPiece, data_b.data() + (kPieces - 1 - i) * kPiece, kPiece), 0)
          << "round " << round << ": batch 2, piece " << i;
    auto c3 = (*engine)->Post(last, options);
    ASSERT_TRUE(c3.ok());
    ASSERT_TRUE(WaitDone(*c3).ok()) << "round " << round;
    ASSERT_TRUE(cuda::CopySync(out.data(), *dst, kBytes).ok());
    ASSERT_EQ(std::memcmp(out.data(), data_a.data(), from * kPiece), 0) << "round " << round;
    ASSERT_EQ(std::memcmp(out.data() + from * kPiece, data_b.data() + from * kPiece, (kPieces - from) * kPiece), 0)
        << "round " << round << ": batch 3 was overtaken by batch 1";
  }
  engine->reset();
  for (void* p : {*a, *b, *dst, *dst2}) EXPECT_TRUE(cuda::Free(p).ok());
}

// No call per piece: a batch of small scattered pieces is a few kernel launches (the first of
// 2,048 pieces, each later one twice the last, at most a quarter of the descriptor ring), and
// pieces of 1 MiB or more go to the DMA engines in one batched call beside them.
TEST(CudaRuntime, ABatchIsAFewLaunchesAndOneDmaCall) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr size_t kPiece = 4096, kPieces = 80'000, kBig = 2 << 20, kBytes = kPiece * kPieces + 2 * kBig;
  auto src = cuda::Malloc(0, kBytes), dst = cuda::Malloc(0, kBytes);
  ASSERT_TRUE(src.ok() && dst.ok());
  auto data = RandomBytes(kBytes, 5);
  ASSERT_TRUE(cuda::CopySync(*src, data.data(), kBytes).ok());
  auto at = [](void* base, size_t off) { return static_cast<char*>(base) + off; };
  std::vector<cuda::Copy> copies;
  for (size_t i = 0; i < kPieces; ++i)
    copies.push_back({at(*dst, (kPieces - 1 - i) * kPiece), at(*src, i * kPiece), kPiece});
  const size_t big = kPieces * kPiece;
  copies.push_back({at(*dst, big), at(*src, big + kBig), kBig});
  copies.push_back({at(*dst, big + kBig), at(*src, big), kBig});
  cuda::PostOptions options;
  options.kernel_ok = true;
  auto c = (*engine)->Post(copies, options);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(WaitDone(*c).ok());
  cuda::CopyStats s = (*engine)->stats();
  EXPECT_EQ(s.batches, 1u);
  // 2,048 + 4,096 + 8,192 + 16,384 + 32,768 + 16,512: six launches for 80,000 pieces.
  EXPECT_EQ(s.kernel_launches, 6u);
  EXPECT_EQ(s.kernel_pieces, kPieces);
  EXPECT_EQ(s.dma_calls, 1u);
  EXPECT_EQ(s.dma_copies, 2u);
  std::vector<uint8_t> out(kBytes);
  ASSERT_TRUE(cuda::CopySync(out.data(), *dst, kBytes).ok());
  for (size_t i = 0; i < kPieces; i += 997)
    ASSERT_EQ(std::memcmp(out.data() + (kPieces - 1 - i) * kPiece, data.data() + i * kPiece, kPiece), 0) << i;
  EXPECT_EQ(std::memcmp(out.data() + big, data.data() + big + kBig, kBig), 0);
  EXPECT_EQ(std::memcmp(out.data() + big + kBig, data.data() + big, kBig), 0);

  // A handful of pieces goes to the DMA engines whole (a launch would cost more).
  std::vector<cuda::Copy> few(copies.begin(), copies.begin() + 3);
  auto f = (*engine)->Post(few, options);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(WaitDone(*f).ok());
  s = (*engine)->stats();
  EXPECT_EQ(s.kernel_launches, 6u);
  EXPECT_EQ(s.dma_calls, 2u);
  EXPECT_EQ(s.dma_copies, 5u);
  engine->reset();
  for (void* p : {*src, *dst}) EXPECT_TRUE(cuda::Free(p).ok());
}

// A batch of offsets goes to the kernel as its ops, and ops the kernel does not take whole (over
// 256 KiB: cut into pieces; 1 MiB and more: the DMA engines) are interleaved with them, in both
// directions, empty ops included: every byte lands where its op says.
TEST(CudaRuntime, OffsetBatchesMixWholeOpsCutOpsAndDmaCopies) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr size_t kBytes = 64 << 20;
  auto local = cuda::Malloc(0, kBytes), remote = cuda::Malloc(0, kBytes);
  ASSERT_TRUE(local.ok() && remote.ok());
  std::vector<TransferOp> ops;
  uint64_t at = 0;
  for (int i = 0; i < 20'000; ++i) {
    uint64_t size = (i % 1000 == 7)    ? 100'000           // whole, one warp
                    : (i % 1500 == 9)  ? 300'001           // cut into pieces
                    : (i % 5000 == 11) ? (1 << 20) + 3     // DMA engines
                    : (i % 777 == 1)   ? 0
                                       : 1024 + i % 61;
    ops.push_back({at, kBytes - at - size, size});  // mirrored: the remote side runs backwards
    at += size + 13;
    if (at + (2 << 20) > kBytes / 2) break;
  }
  for (bool write : {true, false}) {
    SCOPED_TRACE(write ? "write" : "read");
    PostAndCheck(**engine, ops, *local, *remote, kBytes, write, write ? 11 : 12);
  }
  cuda::CopyStats s = (*engine)->stats();
  EXPECT_GE(s.kernel_launches, 4u);
  EXPECT_GE(s.dma_copies, 2u);
  engine->reset();
  for (void* p : {*local, *remote}) EXPECT_TRUE(cuda::Free(p).ok());
}

// A batch checked into one of the engine's op buffers is one launch that reads its ops where
// they lie (no ring fill, no upload; more ops than one launch of the ring takes); a buffer whose longest op the caller does not know, or one with ops the kernel does
// not take whole, goes the ring's way and still lands. Buffers are bounded (kOpBuffers) and come
// back once their handle and their batch are done.
TEST(CudaRuntime, BatchesInAnOpBufferLaunchFromIt) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr size_t kOps = 40'000;
  constexpr uint64_t kSlot = 4096, kBytes = kOps * kSlot;
  auto local = cuda::Malloc(0, kBytes), remote = cuda::Malloc(0, kBytes);
  ASSERT_TRUE(local.ok() && remote.ok());
  std::vector<uint64_t> slots(kOps);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937_64(5));
  EXPECT_FALSE((*engine)->ReserveOps(0));
  EXPECT_FALSE((*engine)->ReserveOps(cuda::kOpBufferOps + 1));
  struct Case {
    const char* name;
    bool known_max;  // the caller says how long the longest op is
    bool long_op;    // one op of 1 MiB + 3 (the DMA engines) replaces two slots
    bool direct;     // launched from the buffer
  };
  for (const Case& c : {Case{"direct", true, false, true}, Case{"max unknown", false, false, false},
                        Case{"a long op", true, true, false}}) {
    for (bool write : {true, false}) {
      std::optional<cuda::OpBuffer> buffer = (*engine)->ReserveOps(kOps);
      ASSERT_TRUE(buffer) << c.name;
      ASSERT_GE(buffer->capacity, kOps);
      size_t n = 0;
      uint64_t longest = 0;
      constexpr uint64_t kLong = (1 << 20) + 3, kLongSlots = kLong / kSlot + 1;
      for (size_t i = 0; i < kOps; ++i) {
        TransferOp o{i * kSlot, slots[i] * kSlot, 1 + (i * 37) % kSlot};  // odd sizes: narrow words too
        if (c.long_op) {  // from local slot 100 on, into remote slot 0 on; the slots it covers stay out
          if (i == 100) {
            o = TransferOp{100 * kSlot, 0, kLong};
          } else if ((i > 100 && i <= 100 + kLongSlots) || slots[i] < kLongSlots) {
            continue;
          }
        }
        buffer->ops[n++] = o;
        longest = std::max(longest, o.size);
      }
      if (c.known_max) buffer->max_op_size = longest;
      SCOPED_TRACE(std::string(c.name) + (write ? ", write" : ", read"));
      const cuda::CopyStats before = (*engine)->stats();
      const std::span<const TransferOp> ops(buffer->ops, n);
      PostAndCheck(**engine, ops, *local, *remote, kBytes, write, write ? 21 : 22, std::move(buffer));
      const cuda::CopyStats after = (*engine)->stats();
      EXPECT_EQ(after.direct_batches - before.direct_batches, c.direct ? 1u : 0u);
      if (c.direct) EXPECT_EQ(after.kernel_launches - before.kernel_launches, 1u);
    }
  }
  // Bounded: every buffer in use means none, until one comes back.
  std::vector<cuda::OpBuffer> held;
  for (int i = 0; i < cuda::kOpBuffers; ++i) {
    auto b = (*engine)->ReserveOps(1000);
    ASSERT_TRUE(b) << "buffer " << i;
    held.push_back(std::move(*b));
  }
  EXPECT_FALSE((*engine)->ReserveOps(1000));
  held.pop_back();
  EXPECT_TRUE((*engine)->ReserveOps(1000));
  held.clear();
  engine->reset();
  for (void* p : {*local, *remote}) EXPECT_TRUE(cuda::Free(p).ok());
}

// gpu::Stream::Spin, the compute stand-in of `ferry pd --compute gpu`: the launch returns at
// once, the stream is busy for the duration asked (the timer it spins on updates about every
// microsecond; the slack above covers the launch and a loaded host), and work enqueued after
// it (an event) waits for it.
TEST(CudaRuntime, StreamSpinKeepsTheStreamBusyForItsDuration) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  using namespace std::chrono;
  auto stream = gpu::Stream::Create(0);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  ASSERT_TRUE((*stream)->Sync(seconds(5)).ok());  // the context and the kernel are loaded
  ASSERT_TRUE((*stream)->Spin(microseconds(10)).ok());
  ASSERT_TRUE((*stream)->Sync(seconds(5)).ok());
  for (auto want : {microseconds(1000), microseconds(20'000)}) {
    SCOPED_TRACE(std::to_string(want.count()) + " us");
    const auto t0 = steady_clock::now();
    ASSERT_TRUE((*stream)->Spin(want).ok());
    const auto enqueued = steady_clock::now() - t0;
    auto event = gpu::Event::Create(0);
    ASSERT_TRUE(event.ok());
    ASSERT_TRUE((*event)->Record((*stream)->handle()).ok());
    ASSERT_TRUE(gpu::WaitEvent((*event)->handle(), seconds(5)).ok());
    const auto took = steady_clock::now() - t0;
    EXPECT_LT(enqueued, want / 2);
    EXPECT_GE(took, want);
    EXPECT_LT(took, want + milliseconds(5));
  }
  EXPECT_TRUE((*stream)->Spin(nanoseconds(0)).ok());
  EXPECT_EQ((*stream)->Spin(nanoseconds(-1)).code(), Code::kInvalidArgument);
  EXPECT_EQ((*stream)->Spin(minutes(2)).code(), Code::kInvalidArgument);
}

#endif  // FERRY_HAVE_CUDA

}  // namespace
}  // namespace ferry
