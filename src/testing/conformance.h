// The transport conformance suite's fixture (conformance_test.cc, conformance_notify_test.cc):
// the same behaviours checked over every transport compiled in, each through two engines of
// this process restricted to that transport, once with heap buffers and once with shareable
// host buffers (ferry::AllocateSharedHost). A combination whose transport cannot register that
// memory (shm and heap memory) is skipped. The parameters are instantiated in
// conformance_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "ferry/system.h"
#include "testing/engine_pair.h"
#include "transport/transport.h"

namespace ferry::conformance {

using testing::EnginePair;
using testing::HostAlloc;
using testing::RandomBytes;

// A transport, the kind of host memory, and for `ucx` how many workers: with more than one,
// three lanes per peer are dealt over them (2 + 1), so batches are split over two connections
// on two threads; optionally a number of lanes and a posting batch of their own.
struct Param {
  std::string transport;
  HostAlloc alloc;
  int workers = 1;
  int lanes = 0;       // 0: 3 with several workers, else the default
  int post_batch = 0;  // 0: the default
};

class Conformance : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const std::string& why = SkipReason(transport());
    if (!why.empty()) GTEST_SKIP() << why;
    // Whether the transport carries this kind of host memory at all.
    EngineOptions options;
    options.transports = {transport()};
    auto e = Engine::Create(options);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    testing::Bytes probe(4096, 0, testing::TestAllocator<uint8_t>(GetParam().alloc));
    auto d = (*e)->RegisterMemory(probe.data(), probe.size());
    if (d.status().code() == Code::kUnavailable)
      GTEST_SKIP() << transport() << " cannot register " << testing::HostAllocName(GetParam().alloc)
                   << " memory: " << d.status().ToString();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_TRUE((*e)->DeregisterMemory(*d).ok());
  }
  const std::string& transport() const { return GetParam().transport; }
  // The suite runs two engines of this process over host memory: transports that cannot
  // (cuda_ipc: GPU memory between processes) or that say they are unsupported here skip.
  // Probed once per transport.
  static const std::string& SkipReason(const std::string& name) {
    static std::map<std::string, std::string> reasons;
    auto it = reasons.find(name);
    if (it != reasons.end()) return it->second;
    std::string why;
    for (const auto& e : internal::RegisteredTransports()) {
      if (e.name != name) continue;
      EngineOptions o;
      internal::TransportContext ctx{"conformance-probe", &o, std::make_shared<internal::Inbox>(1, 1)};
      auto t = e.make(ctx);
      if (!t.ok() && t.status().code() == Code::kUnsupported) why = name + " is not usable here: " + t.status().ToString();
      if (t.ok() && !(*t)->caps().host_memory) why = name + " does not carry host memory between engines of one process";
    }
    return reasons.emplace(name, why).first->second;
  }
  std::unique_ptr<EnginePair> Pair(size_t bytes, EngineOptions options = {}) {
    options.ucx.workers = GetParam().workers;
    if (GetParam().workers > 1) options.ucx.lanes = 3;
    if (GetParam().lanes > 0) options.ucx.lanes = GetParam().lanes;
    if (GetParam().post_batch > 0) options.ucx.post_batch = GetParam().post_batch;
    auto p = EnginePair::Make(transport(), bytes, options, GetParam().alloc);
    if (p) {
      EXPECT_EQ(p->session.path().transport, transport());
    }
    return p;
  }
  // Pair() with a's buffer filled from `seed` (testing::Fill); null when Pair() is.
  std::unique_ptr<EnginePair> FilledPair(uint64_t seed, size_t bytes, EngineOptions options = {}) {
    auto p = Pair(bytes, std::move(options));
    if (p) testing::Fill(p->a_buf, seed);
    return p;
  }
  // Notifications sent with Engine::Notify may be one-way (ucx): wait until `n` arrived.
  static std::vector<Notification> WaitNotifications(Engine& e, size_t n) {
    std::vector<Notification> got;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got.size() < n && std::chrono::steady_clock::now() < until) {
      for (auto& x : e.PopNotifications()) got.push_back(std::move(x));
      if (got.size() < n) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return got;
  }
};

// Scattered pieces of random sizes that never overlap on either side.
inline std::vector<TransferOp> ScatteredOps(size_t region, size_t count, size_t max_piece, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t slot = region / count;
  std::vector<size_t> remote_slots(count);
  std::iota(remote_slots.begin(), remote_slots.end(), 0);
  std::shuffle(remote_slots.begin(), remote_slots.end(), rng);
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < count; ++i) {
    uint64_t size = 1 + rng() % std::min(max_piece, slot);
    uint64_t lo = i * slot + rng() % (slot - size + 1);
    uint64_t ro = remote_slots[i] * slot + rng() % (slot - size + 1);
    ops.push_back({lo, ro, size});
  }
  return ops;
}

template <typename Src, typename Dst>
void ExpectApplied(const Src& src, const Dst& dst, const std::vector<TransferOp>& ops, bool write) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    uint64_t s = write ? op.local_offset : op.remote_offset;
    uint64_t d = write ? op.remote_offset : op.local_offset;
    ASSERT_EQ(std::memcmp(src.data() + s, dst.data() + d, op.size), 0) << "op " << i;
  }
}

}  // namespace ferry::conformance
