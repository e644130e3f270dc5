// The connector's insides: the request state machines of both sides and the one thread that
// runs them.
//
// Every request's state lives on the connector's worker thread and is changed only there: the
// public calls and the engine's completion callbacks hand it Commands (a queue under `mu`), the
// thread drains them, the notifications of kv::kTopic and the timers, and makes every engine
// call itself, so no lock is held across an engine call and no callback re-enters the state.
// What callers wait on (finished requests, landed layers) is published under `mu`.
//
// Thread safety: the fields marked "worker thread" are touched by that thread alone.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/mutex.h"
#include "ferry/kv.h"
#include "kv/checksum.h"
#include "kv/handshake.h"
#include "kv/planner.h"
#include "kv/wire.h"

namespace ferry::kv::internal {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// A producer rank's partner on the consumer side, for one request.
struct Target {
  uint32_t rank = 0;        // the consumer's TP rank
  WorkerId consumer;
  std::string engine_key;
  bool allocated = false;   // its allocation (write mode) or read notice (read mode) arrived
  std::vector<uint64_t> blocks;
  uint64_t num_tokens = 0;
  uint64_t first_token = 0;  // after the consumer's prefix hit
  std::vector<uint64_t> src_blocks;  // the producer's blocks that move (after the prefix hit)
  std::vector<uint64_t> checksums;   // per layer, with options.checksums (0: not written)
  std::vector<PendingChecksum> checksum_jobs;  // per layer, until the completion collects them
  Plan plan;                // write mode: every layer's ops to this consumer
  bool planned = false;
  std::vector<size_t> layer_group;  // write mode: the first group of each layer in `plan`
  std::vector<uint32_t> groups_left;  // per layer, its writes not yet ended
  size_t posted = 0;        // saved layers posted so far (index into ProducerRequest::saved)
  std::vector<Transfer> transfers;  // this request's writes to it (and the completion)
  size_t inflight = 0;
  bool completion_posted = false;
  enum class State : uint8_t { kOpen, kDone, kFailed, kAborted } state = State::kOpen;
  bool ack_owed = false;     // an abort arrived: answer once nothing is in flight
  bool failed_owed = false;  // tell it the write failed once nothing is in flight
  // A write to it ended without its answer (deadline, lost connection): those bytes may still
  // land there (a cut link's queue). It is told so instead of a plain abort ack, and fences
  // this engine before it reuses the blocks.
  bool unanswered = false;
};

struct ProducerRequest {
  std::string id;
  bool read_mode = false;
  std::vector<uint64_t> blocks;
  bool have_blocks = false;
  uint64_t num_tokens = 0;
  std::vector<uint32_t> saved;   // layers whose data is ready, in the order they became ready
  uint32_t saves = 0;            // SaveLayer calls (ready or still waiting)
  std::optional<uint32_t> sealed;
  uint32_t consumer_tp = 0;      // 0 until the consumer's first message
  std::map<uint32_t, Target> targets;  // the partners, once consumer_tp is known
  TimePoint deadline;            // a backstop (abort_timeout): read mode, the hold's end
  TimePoint alloc_deadline = TimePoint::max();  // write mode: the deferred-write timeout
  Status error;                  // the first failure
  bool aborted = false;          // Abort() here
  bool ended = false;
  TimePoint last_layer_ready{};  // for the exposed-time figures
};

// A consumer rank's partner on the producer side, for one request.
struct Source {
  uint32_t rank = 0;  // the producer's TP rank
  std::string engine_key;
  WorkerId producer;
  // kReleaseSent (read mode): the reads ended and the release went out; done once the producer
  // confirms it held the blocks until then (kReleaseAck), failed if it did not or cannot say.
  // kFencing (write mode): given up on without proof that its writes ended (a silent producer,
  // a lost link, writes it reports unanswered); settled once the engine fenced it
  // (Engine::FencePeer), so that nothing it queued lands in the blocks handed back.
  enum class State : uint8_t { kWaiting, kDone, kFailed, kAbortSent, kReleaseSent, kFencing, kSettled } state =
      State::kWaiting;
  TimePoint abort_deadline{};  // kAbortSent, kReleaseSent: give up waiting for the answer then; kFencing: retry
  uint32_t layers = 0;             // completion: layers written
  std::vector<uint64_t> checksums;
  bool settled() const { return state == State::kDone || state == State::kFailed || state == State::kSettled; }
};

struct ConsumerRequest {
  std::string id;
  bool read_mode = false;
  std::vector<uint64_t> blocks;
  uint64_t num_tokens = 0;
  std::map<uint32_t, Source> sources;
  TimePoint deadline;        // transfer timeout
  Status error;
  bool failing = false;
  bool aborted = false;
  bool ended = false;
  // Read mode: reads still running per layer, and in total.
  std::vector<uint32_t> layer_inflight;
  size_t inflight = 0;
  bool released = false;
};

// What a public call or a completion callback hands the worker thread.
struct Command {
  std::function<void()> run;
};

// A landed-layer record that WaitLayer() reads (read mode), published under `mu`.
struct LayerBoard {
  std::vector<bool> landed;
  Status failed;  // set once the request failed
  bool ended = false;
};

// The queue of commands for the worker thread. Completion callbacks hold it by shared_ptr, so
// one that runs after the connector is gone finds it closed and drops its command.
struct Mailbox {
  Mutex mu;
  CondVar cv;
  std::deque<Command> commands GUARDED_BY(mu);
  bool closed GUARDED_BY(mu) = false;
  bool woken GUARDED_BY(mu) = false;  // a notification of kv::kTopic arrived
  // False once closed.
  bool Push(Command c) EXCLUDES(mu);
  void Wake() EXCLUDES(mu);
};

// SaveLayer's ReadyFn waits, one at a time in the order they were saved, on a thread of their
// own so that a slow GPU layer never holds up the worker thread.
class ReadyQueue {
 public:
  using Done = std::function<void(Status)>;
  explicit ReadyQueue(Duration timeout) : timeout_(timeout) {}
  ~ReadyQueue();
  Status Start();
  void Push(ReadyFn ready, Done done) EXCLUDES(mu_);

 private:
  void Run() EXCLUDES(mu_);
  const Duration timeout_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::pair<ReadyFn, Done>> items_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by Start()
};

}  // namespace ferry::kv::internal

namespace ferry::kv {

using internal::Clock;
using internal::ConsumerRequest;
using internal::ProducerRequest;
using internal::TimePoint;

struct Connector::Impl {
  Impl(Engine* e, const CacheLayout& l, std::vector<MemoryDesc> r, const ConnectorOptions& o);

  // ---- fixed at creation ----
  Engine* const engine;
  const CacheLayout layout;
  const std::vector<MemoryDesc> regions;
  const ConnectorOptions options;
  const WorkerId id;

  // ---- shared with callers, under mu ----
  mutable Mutex mu;
  CondVar finished_cv;  // finished grew, or a layer landed, or a request failed
  std::string metadata GUARDED_BY(mu);
  std::string handshake_address GUARDED_BY(mu);
  std::unique_ptr<HandshakeServer> handshake GUARDED_BY(mu);
  std::map<WorkerId, std::shared_ptr<const WorkerMetadata>> peers GUARDED_BY(mu);
  std::deque<Finished> finished GUARDED_BY(mu);
  std::unordered_map<std::string, internal::LayerBoard> boards GUARDED_BY(mu);
  // Ids of requests not ended, per side: a second request under a pending id is refused.
  std::unordered_map<std::string, bool> producer_ids GUARDED_BY(mu);
  // Producer requests that ended here, not done, and are still remembered (their tombstones):
  // SaveLayer() and Seal() of one are refused at once rather than taken and ignored, so that an
  // application that begins a request after its end (it learnt of the request late) hears so.
  std::unordered_set<std::string> ended_ids GUARDED_BY(mu);
  std::unordered_map<std::string, bool> consumer_ids GUARDED_BY(mu);
  ConnectorStats stats GUARDED_BY(mu);

  std::shared_ptr<internal::Mailbox> mailbox = std::make_shared<internal::Mailbox>();
  std::unique_ptr<internal::ReadyQueue> ready;

  // ---- the worker thread's own ----
  std::unique_ptr<Checksummer> checksummer;  // with options.checksums
  std::unordered_map<std::string, ProducerRequest> producing;
  std::unordered_map<std::string, ConsumerRequest> consuming;
  std::map<std::tuple<std::string, uint32_t, uint32_t>, Session> sessions;
  // Producer requests the consumer aborted before this side saw them: a later SaveLayer of one
  // fails at once instead of waiting for an allocation that will not come.
  struct Tombstone {
    TimePoint until;
    bool ended_here = false;  // false: the consumer aborted it before this side saw it
  };
  std::unordered_map<std::string, Tombstone> tombstones;
  // True (and the request's id dropped from producer_ids) when a call about `request` comes
  // after its end here: it is ignored.
  bool EndedHere(const std::string& request) EXCLUDES(mu);
  TimePoint next_liveness{};
  std::thread thread;

  // connector.cc
  void Run();
  void Post(std::function<void()> fn) { mailbox->Push(internal::Command{std::move(fn)}); }
  std::shared_ptr<const WorkerMetadata> PeerOf(const WorkerId& w) const EXCLUDES(mu);
  std::shared_ptr<const WorkerMetadata> PeerByKey(const std::string& engine_key) const EXCLUDES(mu);
  // Every TP rank of (instance, dp), ordered by rank; kFailedPrecondition naming a missing one.
  Result<std::vector<std::shared_ptr<const WorkerMetadata>>> InstanceRanks(std::string_view instance,
                                                                          uint32_t dp) const
      EXCLUDES(mu);
  Status LearnPeer(std::string_view metadata) EXCLUDES(mu);
  // ConnectorOptions::eager_connect: a first message and the sessions to `peer`'s regions.
  void Connect(const WorkerMetadata& peer);
  Status Send(const std::string& engine_key, const Message& m);
  Result<Session> SessionFor(const WorkerMetadata& peer, uint32_t local_region, uint32_t remote_region);
  // `remember_ended`: f's request joins ended_ids in the same step, so that a SaveLayer() or
  // Seal() refused for it finds its Finished already queued.
  void Publish(Finished f, bool producer_side, bool remember_ended = false) EXCLUDES(mu);
  void Count(uint64_t ConnectorStats::*field, uint64_t n = 1) EXCLUDES(mu);
  void HandleNotification(const Notification& n);
  void Timers(TimePoint now);
  void CheckLiveness(TimePoint now);
  void PeerLost(const std::string& engine_key, const Status& why);
  // Drops the sessions to `engine_key` unless a worker names it (see LearnPeer).
  void DropSessionsOf(const std::string& engine_key);
  Message Base(MsgType type, const std::string& request) const;
  std::string HandshakeAddress() const EXCLUDES(mu);

  // connector_producer.cc
  // A SaveLayer() whose data is ready (or failed to be: `ready`). `counted`: OnSaveCounted ran
  // for it when it was called (it had a ReadyFn).
  void OnSaved(const std::string& request, uint32_t layer, std::vector<uint64_t> blocks, Status ready,
               bool counted);
  void OnSaveCounted(const std::string& request);
  void OnSeal(const std::string& request, uint32_t layers);
  void OnHold(const std::string& request, std::vector<uint64_t> blocks, uint64_t num_tokens);
  void OnProducerAbort(const std::string& request);
  void OnAllocation(const Message& m, const std::string& from_key);
  void OnRelease(const Message& m, const std::string& from_key);
  void OnConsumerAbort(const Message& m, const std::string& from_key);
  // `layer`: the layer the write carried (ignored for the completion).
  void OnWriteDone(const std::string& request, uint32_t rank, bool completion, uint32_t layer, Status s);
  ProducerRequest& NewProducer(const std::string& request, bool read_mode);
  bool SetConsumerTp(ProducerRequest& r, uint32_t consumer_tp);
  void PlanTarget(ProducerRequest& r, internal::Target& t);
  void PostLayers(ProducerRequest& r, internal::Target& t);
  void ProgressProducer(ProducerRequest& r);
  void ProducerTimers(TimePoint now);
  void ProducerPeerLost(const std::string& engine_key, const Status& why);

  // connector_consumer.cc
  void OnExpectWrite(const std::string& request, std::vector<internal::Source> sources,
                     std::vector<uint64_t> blocks, uint64_t num_tokens, uint64_t first_token);
  void OnStartRead(ReadParams params, std::vector<std::shared_ptr<const WorkerMetadata>> producers,
                   std::vector<internal::Source> sources, std::vector<uint64_t> blocks, uint64_t first_token);
  void OnConsumerAbortLocal(const std::string& request);
  void OnCompletion(const Message& m, const std::string& from_key);
  void OnWriteFailed(const Message& m, const std::string& from_key);
  void OnAbortAck(const Message& m, const std::string& from_key);
  void OnReleaseAck(const Message& m, const std::string& from_key);
  void OnReadDone(const std::string& request, uint32_t layer, Status s);
  void FailConsumer(ConsumerRequest& r, Status why);
  void ProgressConsumer(ConsumerRequest& r);
  void ConsumerTimers(TimePoint now);
  void ConsumerPeerLost(const std::string& engine_key, const Status& why);
  // Write mode: `s` is given up on without proof that its writes ended; it settles once the
  // engine fenced its producer (kFencing until then, retried from the timers).
  void GiveUpOn(internal::Source& s);
  void TryFence(internal::Source& s, TimePoint now);
  // Tests: a message for which this returns true is dropped on arrival, as if lost on the way.
  std::function<bool(const Message&)> drop_on_arrival;  // set before traffic starts

  // With options.checksums: OK when every layer the source wrote hashes here as it did there.
  Status VerifyChecksums(const ConsumerRequest& r, const internal::Source& s, const Message& completion);
};

}  // namespace ferry::kv

namespace ferry::kv::internal {

// Tests reach a connector's insides through this.
struct ConnectorAccess {
  static void DropOnArrival(Connector& c, std::function<bool(const Message&)> drop) {
    c.impl_->Post([impl = c.impl_.get(), drop = std::move(drop)]() mutable { impl->drop_on_arrival = std::move(drop); });
  }
};

}  // namespace ferry::kv::internal
