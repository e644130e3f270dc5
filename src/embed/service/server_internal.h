// Internal to the embedding-offload server (server.cc, server_steps.cc): the registered
// ranks, the data-parallel groups and their step queues, and Server::Impl.
//
// Thread safety: Group::mu guards a group's members and queue; Impl::mu guards the group maps.
// The connection list is the event loop's (and Stop's, after the loop has ended); a
// connection's descriptor is closed under its send_mu, so a group's thread never sends on a
// closed (or reused) descriptor. A step's worker thread owns its group's staging and input
// copies.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <set>
#include <vector>

#include "base/mutex.h"
#include "cuda/runtime.h"
#include "embed/gather.h"
#include "embed/row_ids.h"
#include "embed/service/copy_pump.h"
#include "embed/service/output_sink.h"
#include "embed/service/protocol.h"
#include "embed/service/shared_memory.h"
#include "embed/service/staging.h"
#include "embed/service/step_policy.h"
#include "embed/service/step_stats.h"
#include "embed/service/unix_socket.h"
#include "embed/uva.h"
#include "ferry/embed_server.h"

namespace ferry::embed::service {
namespace internal {

struct Member;

// One accepted connection (non-blocking), served by the event loop.
struct Connection {
  explicit Connection(UniqueFd f) : poll_fd(f.get()), fd(std::move(f)) {}
  const int poll_fd;  // the descriptor the loop polls; valid until Close()
  Mutex send_mu;
  UniqueFd fd GUARDED_BY(send_mu);
  std::shared_ptr<Member> member;  // the loop's: set once the connection registered

  // A send that fails (the peer does not read, or is gone) shuts the connection down, so that
  // the loop sees it hang up and drops it.
  Status Send(const std::string& bytes) EXCLUDES(send_mu) {
    MutexLock lock(&send_mu);
    if (!fd.valid()) return Status(Code::kUnavailable, "the connection is closed");
    Status s = os::SendMessage(fd.get(), bytes, {}, Deadline::After(Clock::duration::zero()));
    if (s.ok()) return s;
    ::shutdown(fd.get(), SHUT_RDWR);
    if (s.code() == Code::kDeadlineExceeded) return Status(Code::kResourceExhausted, "the client does not read its socket");
    return s;
  }
  void Close() EXCLUDES(send_mu) {
    MutexLock lock(&send_mu);
    fd.reset();
  }
};

// One registered GPU worker.
struct Member {
  Register reg;
  std::vector<size_t> served;            // slot -> index into Impl::layers
  std::shared_ptr<SharedMemory> inputs;  // tensor-parallel rank 0 only
  std::unique_ptr<OutputSink> sink;
  std::weak_ptr<Connection> conn;  // the connection owns its member, not the other way
  std::atomic<bool> alive{true};
};

struct Step {
  Request request;
  Status error;  // set: the step fails without reading inputs (a malformed request)
  Clock::time_point received = Clock::now();
  Clock::time_point started;  // when the group's thread took it
};

// A group's UVA resources, on its rank 0's device (server_uva.cc): one kernel launcher per
// served layer, the step's inputs in device memory and their page-locked host mirror, and the
// event that orders the other ranks' DONE after the copies to them.
struct UvaState {
  int device = -1;
  std::map<size_t, std::unique_ptr<UvaGatherer>> gatherers;  // by index into Impl::layers
  int32_t* dev_inputs = nullptr;
  int32_t* host_inputs = nullptr;
  size_t capacity = 0;  // int32 entries of each
  void* event = nullptr;
  uint64_t uploaded_for = 0;  // the step serial whose inputs dev_inputs holds
  bool ran = false;           // a layer of the current step ran the kernel
  bool broken = false;        // setup failed once: the group runs the CPU path
  UvaState() = default;
  UvaState(const UvaState&) = delete;
  UvaState& operator=(const UvaState&) = delete;
  ~UvaState();
};

// A layer of the current step whose copies the pump may still issue (the pipelined CPU path):
// the group's thread gathers the next layer meanwhile, and retires this one (waits for its
// DONE to be written) before its staging is reused or the step ends.
struct PendingLayer {
  size_t slot = 0;
  CopyPump::Ticket ticket = 0;
  LayerTiming timing;
  Clock::time_point t0, released, drained, gathered;
  std::shared_ptr<std::atomic<uint64_t>> copies;  // counted by the pump's issue calls
  // The layer paid a one-time cost (the pump started, a staging allocated and page-locked):
  // its time is not a sample of the CPU path for the step policy.
  bool cold = false;
};

// One data-parallel rank: its members and its queue of steps, served by `worker`.
struct Group {
  explicit Group(std::atomic<uint64_t>* staging_bytes)
      : staging(staging_bytes), staging_b(staging_bytes) {}
  uint32_t dp_rank = 0;
  Mutex mu;
  CondVar cv;
  std::vector<std::shared_ptr<Member>> members GUARDED_BY(mu);  // tp_size entries
  std::deque<Step> queue GUARDED_BY(mu);
  bool stopping GUARDED_BY(mu) = false;
  std::thread worker;
  std::atomic<bool> finished{false};  // the worker has returned (it may be joined at once)
  // Used by the worker thread only.
  // Two stagings, used by alternate pipelined layers: one is gathered into while the pump
  // still copies from the other.
  Staging staging;
  Staging staging_b;
  int next_staging = 0;
  std::deque<PendingLayer> pending;  // at most CopyPump::kDepth, oldest first
  std::vector<int32_t> tokens, qsl, context;
  uint64_t serial = 0;  // steps run
  std::unique_ptr<StepPolicy> policy;
  std::unique_ptr<CopyPump> pump;  // CUDA outputs: issues the copies behind the gather
  UvaState uva;
};

inline bool SameShape(const Register& a, const Register& b) {
  if (a.tp_size != b.tp_size || a.max_tokens != b.max_tokens || a.max_reqs != b.max_reqs ||
      a.context_len != b.context_len || a.token_bytes != b.token_bytes ||
      a.layers.size() != b.layers.size())
    return false;
  for (size_t i = 0; i < a.layers.size(); ++i)
    if (a.layers[i].layer != b.layers[i].layer) return false;
  return true;
}

inline std::string RankName(const Register& r) {
  return "dp " + std::to_string(r.dp_rank) + " tp " + std::to_string(r.tp_rank);
}

}  // namespace internal

struct Server::Impl {
  using Connection = internal::Connection;
  using Member = internal::Member;
  using Step = internal::Step;
  using Group = internal::Group;

  ServerOptions options;
  std::vector<ServedLayer> layers;
  std::unique_ptr<Gatherer> gatherer;
  // CPU affinity (ServerOptions::pump_cpus): the group threads and the Gatherer's workers run
  // on gather_cpus, the copy pumps on pump_cpus; both empty when nothing is pinned.
  std::vector<int> gather_cpus, pump_cpus;
  UniqueFd listen_fd;
  std::set<int64_t> refused_users;  // event loop only: users refused at accept, logged once each
  UniqueFd wake_fd;  // ends the event loop
  std::thread loop_thread;
  std::atomic<bool> stopping{false};

  // The event loop's (Stop's once the loop has ended).
  std::vector<std::shared_ptr<Connection>> connections;

  // Taken before a group's mu when both are held (Enroll, Leave).
  Mutex mu;
  std::map<uint32_t, std::shared_ptr<Group>> groups GUARDED_BY(mu);
  std::vector<std::shared_ptr<Group>> retired GUARDED_BY(mu);  // emptied, being joined
  bool stopped GUARDED_BY(mu) = false;

  std::atomic<uint64_t> registrations{0}, live{0}, steps_ok{0}, steps_failed{0};
  std::atomic<uint64_t> open_connections{0}, group_count{0}, staging_bytes{0};
  StepStatsRecorder recorder;

  ServerStats Snapshot(bool reset_timings);
  // The event loop (server.cc): accepts, reads every connection's messages, drops closed ones.
  void Loop();
  bool AcceptOne();  // false when no connection was waiting (or accept failed)
  // Reads the connection's ready messages; false when it is to be dropped.
  bool OnReadable(const std::shared_ptr<Connection>& conn);
  // One message (or the error of reading it); false when the connection is to be dropped.
  bool Handle(const std::shared_ptr<Connection>& conn, Result<Message> msg);
  void Drop(Connection& conn);
  void ReapRetired() EXCLUDES(mu);
  Result<std::shared_ptr<Member>> Admit(const std::shared_ptr<Connection>& conn,
                                        const Register& reg, std::vector<UniqueFd> fds);
  Status Enroll(const std::shared_ptr<Member>& m) EXCLUDES(mu);
  void Leave(const std::shared_ptr<Member>& m) EXCLUDES(mu);
  void Enqueue(const std::shared_ptr<Member>& m, Step step) EXCLUDES(mu);
  void Work(Group& g) EXCLUDES(mu);  // the group's thread; sets g.finished when it returns
  Status RunStep(Group& g, const std::vector<std::shared_ptr<Member>>& members, const Step& s);
  // One layer: synchronous (DONE set and completed when it returns: host outputs without the
  // pump, the UVA path) or pipelined (its copies and DONE left to the pump, g.pending). On an
  // error *failed is the first slot that did not get its DONE.
  Status RunLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members, size_t slot,
                  const StepInput& in, const Step& step, LayerTiming& t, size_t* failed);
  // The CPU path of a layer without the pump: ids and rows gathered by the Gatherer, each
  // chunk copied to every other rank by the thread that gathered it.
  Status GatherLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members, size_t slot,
                     const StepInput& in, Clock::time_point* gathered, Clock::time_point* last_copy,
                     uint64_t* copies);
  // The CPU path with the pump (server_pipeline.cc): gathers into a staging the pump copies
  // from behind the gather, and leaves the layer in g.pending, its DONE set by the pump.
  Status PipelineLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members, size_t slot,
                       const StepInput& in, const Step& step, LayerTiming t, Clock::time_point t0,
                       Clock::time_point released, size_t* failed);
  // Whether the layer's copies go through the pump (CUDA outputs, or pump_host_copies).
  bool UsesPump(const std::vector<std::shared_ptr<Member>>& members, size_t slot) const;
  // Waits for the oldest pending layer's copies and DONE, and commits its timings.
  Status RetireOldest(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                      const Step& step, size_t* failed);
  // Retires every pending layer (all of them, whatever fails); the first error.
  Status RetireAll(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                   const Step& step, size_t* failed);
  // The UVA path (server_uva.cc): true when the layer step can run the kernel (CUDA outputs, a
  // pinned table of one segment, setup done); sets up what is missing.
  bool UvaReady(Group& g, const std::vector<std::shared_ptr<Member>>& members, size_t slot);
  Status UvaLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members, size_t slot,
                  const StepInput& in, Clock::time_point* gathered, Clock::time_point* last_copy,
                  uint64_t* copies);
  Status UvaCheck(Group& g);
  Status WaitReleased(const std::vector<std::shared_ptr<Member>>& members, size_t slot,
                      Deadline deadline);
  void FailFrom(const std::vector<std::shared_ptr<Member>>& members, size_t slot);
};

}  // namespace ferry::embed::service
