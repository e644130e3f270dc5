// The cross-process conformance suite's rig (src/engine/process_conformance_test.cc, and its
// hostile-initiator cases in process_hostile_test.cc): the transports it runs over
// (ProcessCases()), how this process's engine and the ferry_test_peer child are set up for
// each, and what each transport answers where transports differ (each difference is a field
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
using testing::Hex;
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

  // Hostile initiators (process_hostile_test.cc). Where a descriptor is checked against the
  // region it names: shm and ucx ask the target as a session opens, and shm's target counts
  // each open it refuses in stats().rejected_messages (ucx's answers the region check without
  // counting it); cuda_ipc's initiator checks the descriptor against the cuda_ipc entry it
  // carries, and nothing reaches the target.
  bool counts_refused_opens = false;
  // cuda_ipc reaches a region through its allocation's IPC handle and the region's offset in
  // the entry, and bounds it by that allocation (so the hostile cases give each region an
  // allocation of its own): the descriptor's address is not used, and a descriptor with a
  // moved address reaches the region where it is.
  bool checks_address = true;
  // A descriptor with another region's id (or another region's access entry): shm and ucx
  // know no region by that id and key; cuda_ipc sees the id differ from its entry's.
  Code foreign_region_code = Code::kFailedPrecondition;
  // A descriptor whose memory kind is changed: shm carries host memory only and cuda_ipc GPU
  // memory only, so the initiator's engine finds no transport for it (kUnavailable); ucx
  // carries either (GPU memory staged through host buffers) and its target bounds a transfer
  // by the region it registered, whatever kind the descriptor says: the session opens and
  // the bytes land in the region (kOk).
  Code changed_kind_code = Code::kUnavailable;
  // A notification over the receiver's max_notification_bytes by more than the allowance for
  // a topic's frame: shm's sender sees the limit in the receiver's ring and refuses it
  // (kInvalidArgument), nothing reaches the receiver; ucx sends it one-way and the receiver
  // drops it (stats().dropped_notifications). Within the allowance both drop it there.
  bool oversize_refused_by_sender = false;
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

inline ProcessCase ShmCase() {
  ProcessCase c;
  c.name = "shm";
  c.transport = "shm";
  c.local_transports = {"shm", "ucx"};
  // Only the target's memory must be shareable; this side's is on the heap.
  c.peer_args = {"--transports", "shm,ucx", "--alloc", "shared"};
  c.only_alloc = testing::HostAlloc::kShared;
  c.options.copy_threads = 2;
  c.options.parallel_copy_bytes = 1 << 20;
  c.kill_batches = 64;
  c.kill_mixes_reads = false;
  c.kill_waits_for_first = true;
  c.kill_own_slices_under_tsan = true;
  c.kill_deadline = std::chrono::seconds(20);
  c.kill_bound = std::chrono::seconds(10);
  c.dead_notify_bound = std::chrono::seconds(2);
  c.counts_refused_opens = true;
  c.oversize_refused_by_sender = true;
  return c;
}

inline ProcessCase UcxCase(UcxOptions::Rma rma, int workers) {
  const bool always = rma == UcxOptions::Rma::kAlways;
  ProcessCase c;
  c.name = std::string("ucx_") + (always ? "always" : "never") + "_w" + std::to_string(workers);
  c.transport = "ucx";
  c.local_transports = {"ucx"};
  c.peer_args = {"--rma", always ? "always" : "never", "--workers", std::to_string(workers)};
  c.options.ucx.rma = rma;
  c.options.ucx.workers = workers;
  // With more than one worker, three lanes dealt over them: batches split over two threads.
  if (workers > 1) c.options.ucx.lanes = 3;
  c.kill_skipped = workers > 1;
  // Active messages need the peer's CPU; one-sided RMA does not, but may wait on it to connect.
  c.stopped_write = always ? ProcessCase::StoppedWrite::kEither : ProcessCase::StoppedWrite::kHitsDeadline;
  c.restart_changes_addresses = true;
  c.changed_kind_code = Code::kOk;
  return c;
}

inline ProcessCase CudaIpcCase() {
  ProcessCase c;
  c.name = "cuda_ipc";
  c.transport = "cuda_ipc";
  c.local_transports = {"cuda_ipc", "ucx"};
  c.peer_args = {"--kind", "cuda", "--device", "0", "--transports", "cuda_ipc,ucx"};
  c.options.default_deadline = std::chrono::seconds(60);
  c.gpu = true;
  c.stopped_deadline = std::chrono::milliseconds(2000);
  c.stopped_bound = std::chrono::milliseconds(4000);
  c.killed_may_hit_deadline = true;
  c.kill_batches = 1;
  c.kill_region = 256 << 20;
  c.kill_scattered = true;
  c.kill_mixes_reads = false;
  c.kill_notification = "never seen";
  c.kill_bound = std::chrono::seconds(12);
  c.carries_notifications = false;
  c.checks_address = false;
  c.foreign_region_code = Code::kInvalidArgument;
  return c;
}

// Every transport that reaches other processes, as the suites instantiate them.
inline std::vector<ProcessCase> ProcessCases() {
  return {ShmCase(),
          UcxCase(UcxOptions::Rma::kAlways, 1),
          UcxCase(UcxOptions::Rma::kAlways, 2),
          UcxCase(UcxOptions::Rma::kNever, 1),
          UcxCase(UcxOptions::Rma::kNever, 2),
          CudaIpcCase()};
}

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
