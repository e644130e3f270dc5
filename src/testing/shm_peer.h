// Helpers of the shm multi-process tests (shm_process_test.cc, shm_hostile_test.cc): this
// process's engine with one registered buffer, and ferry_test_peer children driven through it.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "ferry/shared_memory.h"
#include "testing/bytes.h"
#include "testing/peer_process.h"

namespace ferry::shm_testing {

using testing::Fnv;
using testing::Hex;
using testing::PeerProcess;
using Clock = std::chrono::steady_clock;

// This process's side: an engine with shm and ucx and one registered buffer.
struct Local {
  HostBuffer shared;
  std::vector<uint8_t> heap;
  std::unique_ptr<Engine> engine;
  MemoryDesc desc;
  uint8_t* data() { return shared ? reinterpret_cast<uint8_t*>(shared.data()) : heap.data(); }
};

inline std::unique_ptr<Local> MakeLocal(size_t bytes, bool shared, EngineOptions options = {}) {
  auto l = std::make_unique<Local>();
  if (shared) {
    auto b = AllocateSharedHost(bytes);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return nullptr;
    l->shared = std::move(b).value();
  } else {
    l->heap.assign(bytes, 0);
  }
  auto bytes_in = testing::RandomBytes(bytes, 42);
  std::memcpy(l->data(), bytes_in.data(), bytes);
  if (options.transports.empty()) options.transports = {"shm", "ucx"};
  auto e = Engine::Create(options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return nullptr;
  l->engine = std::move(e).value();
  auto d = l->engine->RegisterMemory(l->data(), bytes);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return nullptr;
  l->desc = *d;
  return l;
}

inline const std::vector<std::string> kSharedTarget = {"--transports", "shm,ucx", "--alloc", "shared"};
inline const std::vector<std::string> kHeapTarget = {"--transports", "shm,ucx", "--alloc", "heap"};

inline std::string HashCmd(uint64_t off, uint64_t size) { return "hash " + std::to_string(off) + " " + std::to_string(size); }
inline std::string HashOf(const uint8_t* p, uint64_t size) { return "HASH " + std::to_string(Fnv(p, size)); }

// The child maps this process's region and writes into it.
inline std::unique_ptr<PeerProcess> StartInitiator(Local& l, uint64_t bytes) {
  auto peer = PeerProcess::Start(bytes, kSharedTarget);
  EXPECT_TRUE(peer);
  if (!peer) return nullptr;
  EXPECT_EQ(peer->Command("peer " + Hex(l.engine->Describe().Pack())), "OK");
  EXPECT_EQ(peer->Command("open " + Hex(l.desc.Pack())), "SESSION shm");
  return peer;
}

// This process's shared buffer of `bytes` and a child that maps it and writes into it; either
// null (with the test failed) when it could not be made.
struct Initiated {
  std::unique_ptr<Local> local;
  std::unique_ptr<PeerProcess> peer;
};
inline Initiated LocalWithInitiator(uint64_t bytes, EngineOptions options = {}) {
  Initiated r;
  r.local = MakeLocal(bytes, true, std::move(options));
  if (r.local) r.peer = StartInitiator(*r.local, bytes);
  return r;
}

// This process's engine with only the shm transport, the child `peer` added as its peer.
inline std::unique_ptr<Local> ShmOnlyTo(const PeerProcess& peer) {
  EngineOptions only_shm;
  only_shm.transports = {"shm"};
  auto l = MakeLocal(4096, true, only_shm);
  if (l) {
    EXPECT_TRUE(l->engine->AddPeer(peer.engine).ok());
  }
  return l;
}

}  // namespace ferry::shm_testing
