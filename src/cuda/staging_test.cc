// The copy engine's device staging and 2D copies (PostOptions::host_side), directly: batches
// between this device's memory and page-locked host memory. Part of cuda_runtime_test; every
// test skips where no CUDA device is usable.
#include "testing/cuda_buffer.h"

namespace ferry {
namespace {

using namespace cuda_testing;  // NOLINT: test helpers

#if FERRY_HAVE_CUDA
// A batch between this device's memory and page-locked host memory whose host side lies end to
// end in runs (a request's blocks offloaded into one host slab, and loaded back) goes through
// device staging a chunk at a time (PostOptions::host_side): a run longer than three chunks
// (the staging slots are used again), a run starting at an odd host offset with odd sizes,
// runs too short to stage, a run broken by an empty op, and host-scattered ops, in one batch,
// both directions, two batches in flight at once: every byte lands where its op says, and
// only the long runs were staged.
TEST(CudaRuntime, HostContiguousRunsGoThroughDeviceStagingBothWays) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr size_t kBytes = 128 << 20;
  std::vector<uint64_t> sizes, host;  // op i: sizes[i] bytes at host offset host[i]
  uint64_t h = 0;
  auto run = [&](size_t n, uint64_t size) {
    for (size_t i = 0; i < n; ++i, h += size) {
      sizes.push_back(size);
      host.push_back(h);
    }
  };
  run(4000, 16 << 10);  // 62.5 MiB: chunks of 16, 16, 16 and 14.5 MiB
  h += 4096;
  for (int i = 0; i < 300; ++i, h += (16 << 10) + 4096) {  // host-scattered
    sizes.push_back(16 << 10);
    host.push_back(h);
  }
  run(96, 32 << 10);  // 3 MiB: below kStageMinBytes, the kernel's
  h += 8192;
  run(100, 32 << 10);  // 3.1 MiB, an empty op, 3.1 MiB: two short runs
  sizes.push_back(0);
  host.push_back(h);
  run(100, 32 << 10);
  h += 100;  // odd alignment from here
  run(1500, 4001);  // 5.7 MiB of odd sizes: one staged chunk
  ASSERT_LT(h, kBytes);
  // The device side: the same ops in a shuffled order, end to end with 48-byte gaps.
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  std::vector<uint64_t> dev(sizes.size());
  uint64_t d = 0;
  for (size_t i : order) {
    dev[i] = d;
    d += sizes[i] + 48;
  }
  ASSERT_LT(d, kBytes);
  auto device = cuda::Malloc(0, kBytes);
  ASSERT_TRUE(device.ok());
  std::vector<uint8_t> slab1(kBytes), slab2(kBytes);
  ASSERT_TRUE(cuda::HostRegister(slab1.data(), kBytes).ok());
  ASSERT_TRUE(cuda::HostRegister(slab2.data(), kBytes).ok());
  // Writes: local = device, remote = host. Reads: local = device, remote = host.
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < sizes.size(); ++i) ops.push_back({dev[i], host[i], sizes[i]});
  const auto data = RandomBytes(kBytes, 21);
  ASSERT_TRUE(cuda::CopySync(*device, data.data(), kBytes).ok());
  auto expect_host = [&](const std::vector<uint8_t>& slab, const char* what) {
    std::vector<uint8_t> want(kBytes, 0);
    for (const TransferOp& o : ops) std::memcpy(want.data() + o.remote_offset, data.data() + o.local_offset, o.size);
    ASSERT_TRUE(slab == want) << what;
  };

  cuda::PostOptions options;
  options.kernel_ok = true;
  options.host_side = cuda::PostOptions::HostSide::kDst;
  const cuda::CopyStats before = (*engine)->stats();
  cuda::OffsetBatch to1{ops, reinterpret_cast<std::byte*>(slab1.data()), static_cast<const std::byte*>(*device), true};
  cuda::OffsetBatch to2{ops, reinterpret_cast<std::byte*>(slab2.data()), static_cast<const std::byte*>(*device), true};
  auto c1 = (*engine)->Post(to1, options);
  auto c2 = (*engine)->Post(to2, options);  // in flight beside the first: the slots are shared
  ASSERT_TRUE(c1.ok() && c2.ok());
  ASSERT_TRUE(WaitDone(*c1).ok());
  ASSERT_TRUE(WaitDone(*c2).ok());
  expect_host(slab1, "GPU -> host slab, first batch");
  expect_host(slab2, "GPU -> host slab, second batch");
  cuda::CopyStats after = (*engine)->stats();
  EXPECT_EQ(after.staged_chunks - before.staged_chunks, 2u * 5u);  // 4 + 1 chunks a batch
  EXPECT_EQ(after.staged_bytes - before.staged_bytes, 2u * (4000u * (16 << 10) + 1500u * 4001u));

  // Back: the host slab into zeroed device memory.
  std::vector<uint8_t> back_data = RandomBytes(kBytes, 22);
  std::memcpy(slab1.data(), back_data.data(), kBytes);
  ASSERT_TRUE(cuda::MemsetSync(*device, 0, kBytes).ok());
  options.host_side = cuda::PostOptions::HostSide::kSrc;
  cuda::OffsetBatch from1{ops, static_cast<std::byte*>(*device), reinterpret_cast<const std::byte*>(slab1.data()), false};
  auto c3 = (*engine)->Post(from1, options);
  ASSERT_TRUE(c3.ok());
  ASSERT_TRUE(WaitDone(*c3).ok());
  std::vector<uint8_t> out(kBytes), want(kBytes, 0);
  ASSERT_TRUE(cuda::CopySync(out.data(), *device, kBytes).ok());
  for (const TransferOp& o : ops) std::memcpy(want.data() + o.local_offset, back_data.data() + o.remote_offset, o.size);
  EXPECT_TRUE(out == want) << "host slab -> GPU";
  EXPECT_EQ((*engine)->stats().staged_chunks - after.staged_chunks, 5u);

  // Without host_side nothing is staged, and the bytes are the same.
  options.host_side = cuda::PostOptions::HostSide::kNone;
  std::fill(slab2.begin(), slab2.end(), 0);
  after = (*engine)->stats();
  auto c4 = (*engine)->Post(to2, options);
  ASSERT_TRUE(c4.ok());
  ASSERT_TRUE(WaitDone(*c4).ok());
  EXPECT_EQ((*engine)->stats().staged_chunks, after.staged_chunks);
  std::vector<uint8_t> want2(kBytes, 0);
  for (const TransferOp& o : ops) std::memcpy(want2.data() + o.remote_offset, want.data() + o.local_offset, o.size);
  EXPECT_TRUE(slab2 == want2) << "GPU -> host, not staged";
  engine->reset();
  EXPECT_TRUE(cuda::HostUnregister(slab1.data()).ok());
  EXPECT_TRUE(cuda::HostUnregister(slab2.data()).ok());
  EXPECT_TRUE(cuda::Free(*device).ok());
}

// Runs of pieces of one size at a fixed stride on both sides (a regular layout) between this
// device and page-locked host memory go to the DMA engines as one 2D copy each: a run strided
// on both sides, one end to end on the host (the 2D copy is taken before staging), one that
// starts after scattered ops in the same launch, and a run too short to count (15 ops), among
// scattered ops, both directions: every byte lands where its op says and only the three runs
// were 2D copies.
TEST(CudaRuntime, StridedRunsGoToTheDmaEnginesAsOne2DCopyEach) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr uint64_t kBytes = 64 << 20, KiB = 1 << 10, MiB = 1 << 20;
  // ops: local = device offset, remote = host offset.
  auto strided = [](uint64_t n, uint64_t size, uint64_t dev, uint64_t dev_stride, uint64_t host, uint64_t host_stride) {
    std::vector<TransferOp> r;
    for (uint64_t i = 0; i < n; ++i) r.push_back({dev + i * dev_stride, host + i * host_stride, size});
    return r;
  };
  std::vector<uint64_t> slots(200), host_slots(200);
  std::iota(slots.begin(), slots.end(), 0);
  std::iota(host_slots.begin(), host_slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937(4));
  std::shuffle(host_slots.begin(), host_slots.end(), std::mt19937(5));
  std::vector<TransferOp> scattered;
  for (size_t i = 0; i < 200; ++i) scattered.push_back({44 * MiB + slots[i] * 64 * KiB, 35 * MiB + host_slots[i] * 32 * KiB, 16 * KiB});
  std::vector<TransferOp> ops;
  auto add = [&](const std::vector<TransferOp>& v, size_t from, size_t to) { ops.insert(ops.end(), v.begin() + from, v.begin() + to); };
  auto a = strided(512, 16 * KiB, 0, 48 * KiB, 0, 32 * KiB);               // strided both sides, 8 MiB
  auto d = strided(300, 16 * KiB, 38 * MiB, 20 * KiB, 30 * MiB, 16 * KiB);  // end to end on the host
  auto c = strided(15, 512 * KiB, 30 * MiB, 520 * KiB, 21 * MiB, 600 * KiB);  // 15 ops: too few
  auto b = strided(20, 256 * KiB, 24 * MiB, 300 * KiB, 16 * MiB, 256 * KiB);  // 5 MiB, 20 ops
  add(a, 0, a.size());
  add(scattered, 0, 100);
  add(d, 0, d.size());  // starts inside the launch that took the scattered ops
  add(c, 0, c.size());
  add(scattered, 100, 200);
  add(b, 0, b.size());
  auto device = cuda::Malloc(0, kBytes);
  ASSERT_TRUE(device.ok());
  std::vector<uint8_t> slab(kBytes);
  ASSERT_TRUE(cuda::HostRegister(slab.data(), kBytes).ok());
  cuda::PostOptions options;
  options.kernel_ok = true;
  for (bool write : {true, false}) {
    SCOPED_TRACE(write ? "GPU -> host" : "host -> GPU");
    const auto data = RandomBytes(kBytes, write ? 31 : 32);
    std::vector<uint8_t> zero(kBytes, 0);
    if (write) {
      ASSERT_TRUE(cuda::CopySync(*device, data.data(), kBytes).ok());
      slab = zero;
    } else {
      slab = data;
      ASSERT_TRUE(cuda::MemsetSync(*device, 0, kBytes).ok());
    }
    options.host_side = write ? cuda::PostOptions::HostSide::kDst : cuda::PostOptions::HostSide::kSrc;
    cuda::OffsetBatch batch = write ? cuda::OffsetBatch{ops, reinterpret_cast<std::byte*>(slab.data()),
                                                        static_cast<const std::byte*>(*device), true}
                                    : cuda::OffsetBatch{ops, static_cast<std::byte*>(*device),
                                                        reinterpret_cast<const std::byte*>(slab.data()), false};
    const cuda::CopyStats before = (*engine)->stats();
    auto posted = (*engine)->Post(batch, options);
    ASSERT_TRUE(posted.ok()) << posted.status().ToString();
    ASSERT_TRUE(WaitDone(*posted).ok());
    const cuda::CopyStats after = (*engine)->stats();
    EXPECT_EQ(after.strided_runs - before.strided_runs, 3u);
    EXPECT_EQ(after.staged_chunks, before.staged_chunks);
    std::vector<uint8_t> want(kBytes, 0);
    for (const TransferOp& o : ops) {
      if (write) std::memcpy(want.data() + o.remote_offset, data.data() + o.local_offset, o.size);
      else std::memcpy(want.data() + o.local_offset, data.data() + o.remote_offset, o.size);
    }
    if (write) {
      EXPECT_TRUE(slab == want);
    } else {
      std::vector<uint8_t> out(kBytes);
      ASSERT_TRUE(cuda::CopySync(out.data(), *device, kBytes).ok());
      EXPECT_TRUE(out == want);
    }
  }
  engine->reset();
  EXPECT_TRUE(cuda::HostUnregister(slab.data()).ok());
  EXPECT_TRUE(cuda::Free(*device).ok());
}

#endif  // FERRY_HAVE_CUDA

}  // namespace
}  // namespace ferry
