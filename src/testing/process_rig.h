// The cross-process conformance suite's rig (src/engine/process_conformance_test.cc): which
// transport a case runs over, how this process's engine and the ferry_test_peer child are set up
// for it, and what that transport answers where transports differ (each difference is a field
// below, with the reason). This process's side holds host memory (heap) or GPU memory.
//
// Thread safety: a test fixture, used by the test's thread.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "testing/bytes.h"
#include "testing/cuda_buffer.h"
#include "testing/peer_process.h"

namespace ferry::process_testing {

using testing::Fnv;
using testing::PeerProcess;
using Clock = std::chrono::steady_clock;

// One transport that reaches other processes, as the suite runs it.
struct ProcessCase {
  std::string name;                       // the instance's name
  std::string transport;                  // the path every session must take
  std::vector<std::string> local_transports;
  std::vector<std::string> peer_args;     // ferry_test_peer's arguments (transports, memory)
  EngineOptions options;                  // this engine's options (transports filled in)
  bool gpu = false;                       // both sides hold GPU memory (skips without a GPU)
  // Host memory of an engine that has only this transport: shm registers shareable memory
  // only (ferry::AllocateSharedHost); the others take the heap.
  testing::HostAlloc only_alloc = testing::HostAlloc::kHeap;
  // ucx with several workers: a killed peer could abort UCX 1.13 (UcxOptions::workers), so
  // the cases that kill a peer skip there, saying so.
  bool kill_skipped = false;
  // A plain write to a stopped peer: shm and cuda_ipc copy without the peer's threads (OK);
  // ucx with active messages needs them (kDeadlineExceeded); one-sided RMA may go either way.
  enum class StoppedWrite { kCompletes, kHitsDeadline, kEither } stopped_write = StoppedWrite::kCompletes;
  // Stopped peer: the deadline of the writes to it, and the time they take at most.
  std::chrono::milliseconds stopped_deadline{500};
  std::chrono::milliseconds stopped_bound{2000};
  // Killed peer: what a batch in flight may end with besides OK and kUnavailable. cuda_ipc's
  // copy may also run into its deadline while the driver tears the mapping down.
  bool killed_may_hit_deadline = false;
  // Killed peer: the batches in flight (64 KiB blocks over `kill_region`, or scattered small
  // pieces as a GPU batch of KV blocks would be), whether every other one is a read, whether
  // the first must have completed before the kill, and whether under TSan each batch writes a
  // slice of its own (shm: racing copies of the same bytes are too slow to check there).
  int kill_batches = 16;
  uint64_t kill_region = 64 << 20;
  bool kill_scattered = false;
  bool kill_mixes_reads = true;
  bool kill_waits_for_first = false;
  bool kill_own_slices_under_tsan = false;
  std::string kill_notification;  // sent with each batch when not empty
  std::chrono::seconds kill_deadline{10};
  // The time a killed peer's transfers take to end, at most (shm fails at once, ucx within its
  // 10 s deadline, cuda_ipc within its deadline plus the driver's teardown).
  std::chrono::seconds kill_bound{11};
  // Notifications to a killed peer: whether this transport carries them (cuda_ipc does not:
  // its engines notify over ucx, which the ucx instances test), and how long they may go on
  // being taken after the kill (shm sees the socket close at once; ucx within its connect
  // timeout, 10 s).
  bool carries_notifications = true;
  std::chrono::seconds dead_notify_bound{15};
  // ucx advertises a new port when a peer restarts; shm and cuda_ipc a new pid only.
  bool restart_changes_addresses = false;
};

// This process's engine, its registered buffer (host or GPU), and the child it talks to.
// Members in order of need: the peer outlives this engine (which shuts down with it alive, as
// the per-transport tests did), the buffer outlives the engine.
struct Rig {
  ~Rig() {
    // A GPU peer exits on its own first (its engine unlinks its lease table), then this engine
    // closes; a host peer is killed once this engine has closed.
    if (peer && gpu) (void)peer->Command("exit");
  }
  std::unique_ptr<PeerProcess> peer;
  testing::Bytes host;                        // host memory
  std::unique_ptr<cuda_testing::Buffer> gpu;  // or GPU memory
  std::unique_ptr<Engine> engine;
  MemoryDesc local;
  Session session;

  // The local buffer's bytes (downloaded from the GPU where it lives there).
  std::vector<uint8_t> Contents() const {
    return gpu ? gpu->Download() : std::vector<uint8_t>(host.begin(), host.end());
  }
  void Set(const std::vector<uint8_t>& data) {
    if (gpu) {
      gpu->Upload(data);
    } else {
      std::memcpy(host.data(), data.data(), data.size());
    }
  }
  std::string HashOfLocal(uint64_t off, uint64_t size) const {
    auto c = Contents();
    return "HASH " + std::to_string(Fnv(c.data() + off, size));
  }
  static std::string HashCmd(uint64_t off, uint64_t size) {
    return "hash " + std::to_string(off) + " " + std::to_string(size);
  }
};

inline void PrintTo(const ProcessCase& c, std::ostream* os) { *os << c.name; }

inline std::unique_ptr<PeerProcess> StartPeer(const ProcessCase& c, uint64_t bytes,
                                              std::vector<std::string> extra = {}) {
  auto args = c.peer_args;
  args.insert(args.end(), extra.begin(), extra.end());
  auto peer = PeerProcess::Start(bytes, args);
  EXPECT_TRUE(peer) << "ferry_test_peer did not start";
  return peer;
}

// An engine and a buffer of `bytes` (random contents; host memory from `alloc`) here; with
// `with_peer`, a child with a buffer as large, added as a peer, and a session to it over
// c.transport.
inline std::unique_ptr<Rig> MakeRig(const ProcessCase& c, uint64_t bytes, bool with_peer = true,
                                    testing::HostAlloc alloc = testing::HostAlloc::kHeap) {
  signal(SIGPIPE, SIG_IGN);  // a command to a peer a test killed must fail, not end this process
  auto r = std::make_unique<Rig>();
  auto data = testing::RandomBytes(bytes, 42);
  if (c.gpu) {
    r->gpu = cuda_testing::Buffer::Make(cuda_testing::kGpu0, bytes);
    if (!r->gpu) return nullptr;
  } else {
    r->host = testing::Bytes(bytes, 0, testing::TestAllocator<uint8_t>(alloc));
  }
  r->Set(data);
  EngineOptions options = c.options;
  options.transports = c.local_transports;
  auto e = Engine::Create(options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return nullptr;
  r->engine = std::move(e).value();
  auto d = c.gpu ? r->engine->RegisterMemory(r->gpu->ptr(), bytes, MemoryKind::kCuda, 0)
                 : r->engine->RegisterMemory(r->host.data(), bytes);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return nullptr;
  r->local = *d;
  if (!with_peer) return r;
  r->peer = StartPeer(c, bytes);
  if (!r->peer) return nullptr;
  EXPECT_TRUE(r->engine->AddPeer(r->peer->engine).ok());
  auto s = r->engine->OpenSession(r->local, r->peer->memory);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  r->session = *s;
  EXPECT_EQ(r->session.path().transport, c.transport);
  return r;
}

// The child's "notes" once they read `want` (one-way notifications land a moment after Notify
// returns), or what they read after 5 s.
inline std::string WaitNotes(PeerProcess& peer, const std::string& want) {
  auto until = Clock::now() + std::chrono::seconds(5);
  std::string notes;
  while ((notes = peer.Command("notes")) != want && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return notes;
}

}  // namespace ferry::process_testing
