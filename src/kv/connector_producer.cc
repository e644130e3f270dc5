// The producer (prefill) side of a request, on the connector's worker thread.
//
// Write mode: SaveLayer() marks layers ready; the consumer ranks' allocations name where they
// go. Each layer is posted to each partner as soon as both are known, in the order the layers
// became ready; layers ready before an allocation wait (deferred). After Seal() and the last
// layer, the completion notice leaves after every write to that partner (`after`). The request
// ends once every partner is done, failed or aborted and nothing is in flight: only then are its
// blocks handed back. A failed write is told to its partner (kWriteFailed) once nothing of the
// request is in flight to it; an abort from a partner is answered (kAbortAck) then too.
//
// Read mode: HoldForRead() keeps the blocks until every partner released them (kRelease), a
// partner is found dead, or abort_timeout passes (counted as expired); its messages are handled
// in connector_producer_read.cc.
#include <algorithm>

#include "base/log.h"
#include "kv/connector_impl.h"

namespace ferry::kv {

using internal::Target;

// Bound of the ended or aborted requests a producer remembers (tombstones).
constexpr size_t kMaxTombstones = 1u << 20;
using TState = internal::Target::State;

ProducerRequest& Connector::Impl::NewProducer(const std::string& request, bool read_mode) {
  auto [it, fresh] = producing.try_emplace(request);
  if (fresh) {
    it->second.id = request;
    it->second.read_mode = read_mode;
    // A backstop for a request whose saves or seal never come: the blocks go back after it.
    it->second.deadline = Clock::now() + options.abort_timeout;
    MutexLock l(&mu);
    producer_ids.emplace(request, true);
  }
  return it->second;
}

// Learns the consumer's TP size from its first message and creates the partner entries.
bool Connector::Impl::SetConsumerTp(ProducerRequest& r, uint32_t consumer_tp) {
  if (r.consumer_tp != 0) return r.consumer_tp == consumer_tp;
  TpPair pair{layout.total_kv_heads, layout.mla, layout.tp_size, consumer_tp};
  if (consumer_tp == 0 || !ValidateTpPair(pair).ok()) return false;
  r.consumer_tp = consumer_tp;
  for (uint32_t d : DestinationsOf(pair, layout.tp_rank)) {
    Target t;
    t.rank = d;
    r.targets.emplace(d, std::move(t));
  }
  return true;
}

bool Connector::Impl::EndedHere(const std::string& request) {
  auto it = tombstones.find(request);
  if (it == tombstones.end() || !it->second.ended_here || producing.count(request)) return false;
  MutexLock l(&mu);
  producer_ids.erase(request);
  return true;
}

void Connector::Impl::OnSaveCounted(const std::string& request) {
  if (EndedHere(request)) return;
  ProducerRequest& r = NewProducer(request, false);
  ++r.saves;
  if (tombstones.count(request) && r.error.ok()) {
    r.error = Status(Code::kAborted, "the consumer aborted request " + request);
  }
  ProgressProducer(r);
}

void Connector::Impl::OnSaved(const std::string& request, uint32_t layer, std::vector<uint64_t> blocks,
                              Status ready, bool counted) {
  if (EndedHere(request)) return;
  ProducerRequest& r = NewProducer(request, false);
  if (!counted) ++r.saves;
  if (r.saved.empty() && !r.have_blocks) {
    r.blocks = std::move(blocks);
    r.have_blocks = true;
  }
  if (tombstones.count(request) && r.error.ok()) {
    r.error = Status(Code::kAborted, "the consumer aborted request " + request);
  }
  if (!ready.ok() && r.error.ok()) {
    r.error = ready.WithContext("layer " + std::to_string(layer) + " of " + request + " never became ready");
  }
  if (r.error.ok() && !r.aborted) {
    r.saved.push_back(layer);
    r.last_layer_ready = Clock::now();
    bool all_allocated = r.consumer_tp != 0;
    for (const auto& [d, t] : r.targets) all_allocated = all_allocated && t.allocated;
    if (!all_allocated) {
      Count(&ConnectorStats::layers_deferred);
      if (r.alloc_deadline == TimePoint::max()) r.alloc_deadline = Clock::now() + options.deferred_write_timeout;
    }
    for (auto& [d, t] : r.targets) PostLayers(r, t);
  }
  ProgressProducer(r);
}

void Connector::Impl::OnSeal(const std::string& request, uint32_t layers) {
  auto it = producing.find(request);
  if (it == producing.end() || it->second.ended) return;
  ProducerRequest& r = it->second;
  if (layers < r.saves && r.error.ok()) {
    r.error = Status(Code::kInvalidArgument, "request " + request + " was sealed at " + std::to_string(layers) +
                                                 " layers after " + std::to_string(r.saves) + " saves");
  }
  r.sealed = layers;
  for (auto& [d, t] : r.targets) PostLayers(r, t);
  ProgressProducer(r);
}

void Connector::Impl::OnProducerAbort(const std::string& request) {
  auto it = producing.find(request);
  if (it == producing.end() || it->second.ended) return;
  ProducerRequest& r = it->second;
  r.aborted = true;
  // Read mode: a consumer may be reading the blocks, so the hold still ends only on its release,
  // its death or the abort timeout.
  if (!r.read_mode && r.error.ok()) r.error = Status(Code::kAborted, "request " + request + " aborted by its producer");
  ProgressProducer(r);
}

void Connector::Impl::PlanTarget(ProducerRequest& r, Target& t) {
  if (t.planned || !t.allocated || !r.have_blocks) return;
  auto peer = PeerOf(t.consumer);
  Status s;
  if (peer == nullptr) s = Status(Code::kFailedPrecondition, "consumer " + t.consumer.ToString() + " is not known");
  std::span<const uint64_t> src(r.blocks);
  if (s.ok() && t.first_token % layout.block_tokens != 0) {
    s = Status(Code::kInvalidArgument, "the consumer's first token is not on a block boundary of the producer");
  }
  if (s.ok()) {
    const uint64_t skip = t.first_token / layout.block_tokens;
    if (skip > src.size()) {
      s = Status(Code::kOutOfRange, "the consumer's prefix hit is longer than the producer's blocks");
    } else {
      src = src.subspan(skip);
    }
  }
  if (s.ok()) {
    PlanInput in;
    in.src = &layout;
    in.dst = &peer->layout;
    t.src_blocks.assign(src.begin(), src.end());
    in.src_blocks = t.src_blocks;
    in.dst_blocks = t.blocks;
    in.num_tokens = t.num_tokens;
    in.poster_is_src = true;
    s = BuildPlan(in, &t.plan);
  }
  if (!s.ok()) {
    t.state = TState::kFailed;
    t.failed_owed = true;
    if (r.error.ok()) r.error = s.WithContext("planning request " + r.id + " to " + t.consumer.ToString());
    return;
  }
  t.layer_group.assign(layout.num_layers + 1, t.plan.groups.size());
  for (size_t g = t.plan.groups.size(); g-- > 0;) t.layer_group[t.plan.groups[g].layer] = g;
  for (uint32_t l = layout.num_layers; l-- > 0;) {
    t.layer_group[l] = std::min(t.layer_group[l], t.layer_group[l + 1]);
  }
  t.planned = true;
}

// Posts every saved layer not yet posted to `t`, then, once sealed and all posted, the
// completion after them.
void Connector::Impl::PostLayers(ProducerRequest& r, Target& t) {
  if (t.state != TState::kOpen || !t.allocated || !r.error.ok() || r.aborted) return;
  PlanTarget(r, t);
  if (!t.planned) return;
  auto peer = PeerOf(t.consumer);
  if (peer == nullptr) return;
  std::weak_ptr<internal::Mailbox> box = mailbox;
  auto done = [box, impl = this, id = r.id, rank = t.rank](bool completion, uint32_t layer) {
    return [box, impl, id, rank, completion, layer](const Status& s) {
      if (auto m = box.lock()) {
        m->Push(internal::Command{
            [impl, id, rank, completion, layer, s]() { impl->OnWriteDone(id, rank, completion, layer, s); }});
      }
    };
  };
  while (t.posted < r.saved.size()) {
    const uint32_t layer = r.saved[t.posted++];
    t.groups_left.resize(layout.num_layers, 0);
    t.groups_left[layer] = static_cast<uint32_t>(t.layer_group[layer + 1] - t.layer_group[layer]);
    if (options.checksums) {  // on the GPU: enqueued here, collected before the completion
      t.checksum_jobs.resize(layout.num_layers);
      auto job = checksummer->Start(t.src_blocks, t.plan.tokens, t.plan.heads, layer);
      if (!job.ok()) {
        t.state = TState::kFailed;
        t.failed_owed = true;
        if (r.error.ok()) r.error = job.status();
        return;
      }
      t.checksum_jobs[layer] = std::move(*job);
    }
    for (size_t g = t.layer_group[layer]; g < t.layer_group[layer + 1]; ++g) {
      const OpGroup& grp = t.plan.groups[g];
      auto session = SessionFor(*peer, grp.local_region, grp.remote_region);
      if (!session.ok()) {
        t.state = TState::kFailed;
        t.failed_owed = true;
        if (r.error.ok()) r.error = session.status();
        return;
      }
      TransferOptions o;
      o.deadline = options.transfer_timeout;
      o.on_complete = done(false, layer);
      ++t.inflight;
      t.transfers.push_back(session->Post(
          Op::kWrite, std::span<const TransferOp>(t.plan.ops.data() + grp.begin, grp.end - grp.begin), o));
      Count(&ConnectorStats::ops_posted, grp.end - grp.begin);
      Count(&ConnectorStats::bytes, grp.bytes);
    }
  }
  if (r.sealed && r.saves == *r.sealed && r.saved.size() == *r.sealed && !t.completion_posted) {
    Message m = Base(MsgType::kCompletion, r.id);
    m.layers = *r.sealed;
    m.num_tokens = t.plan.tokens;
    if (options.checksums) {
      Status c = checksummer->FinishAll(t.checksum_jobs, Deadline::After(options.transfer_timeout), &t.checksums);
      if (!c.ok()) {
        t.state = TState::kFailed;
        t.failed_owed = true;
        if (r.error.ok()) r.error = c;
        return;
      }
    }
    m.checksums = t.checksums;
    TransferOptions o;
    o.deadline = options.transfer_timeout;
    o.notification_topic = std::string(kTopic);
    o.on_complete = done(true, 0);
    t.completion_posted = true;
    ++t.inflight;
    Transfer c = engine->NotifyAfter(t.engine_key, Encode(m), t.transfers, o);
    // The writes are not needed any more: the completion holds what it waits on.
    t.transfers.clear();
    t.transfers.push_back(std::move(c));
  }
}

void Connector::Impl::OnWriteDone(const std::string& request, uint32_t rank, bool completion, uint32_t layer,
                                  Status s) {
  auto it = producing.find(request);
  if (it == producing.end()) return;
  ProducerRequest& r = it->second;
  auto t = r.targets.find(rank);
  if (t == r.targets.end()) return;
  if (t->second.inflight > 0) --t->second.inflight;
  if (!completion && s.ok() && layer < t->second.groups_left.size() && t->second.groups_left[layer] > 0 &&
      --t->second.groups_left[layer] == 0) {
    Count(&ConnectorStats::layers_written);  // every write of the layer to this consumer landed
  }
  if (!s.ok()) {
    if (s.code() == Code::kDeadlineExceeded || s.code() == Code::kUnavailable) t->second.unanswered = true;
    if (t->second.state == TState::kOpen) {
      t->second.state = TState::kFailed;
      t->second.failed_owed = true;
    }
    if (r.error.ok()) r.error = s.WithContext("writing request " + request + " to " + t->second.consumer.ToString());
  } else if (completion && t->second.state == TState::kOpen) {
    t->second.state = TState::kDone;
  }
  ProgressProducer(r);
}

void Connector::Impl::OnAllocation(const Message& m, const std::string& from_key) {
  auto peer = PeerOf(m.from);
  if (peer == nullptr && !m.handshake.empty()) {
    auto bytes = FetchMetadata(m.handshake, options.handshake_timeout);
    if (bytes.ok()) (void)LearnPeer(*bytes);
    peer = PeerOf(m.from);
  }
  if (peer == nullptr || peer->engine.key != from_key) {
    Count(&ConnectorStats::messages_rejected);
    FERRY_LOG_WARN("kv {}: allocation of {} from unknown consumer {} ({})", id.ToString(), m.request,
                   m.from.ToString(), from_key);
    return;
  }
  auto reject = [&](const std::string& why) {
    Count(&ConnectorStats::messages_rejected);
    Message f = Base(MsgType::kWriteFailed, m.request);
    f.code = static_cast<uint32_t>(Code::kInvalidArgument);
    f.error = why;
    (void)Send(from_key, f);
  };
  if (!producing.count(m.request) && tombstones.count(m.request) && tombstones[m.request].ended_here) {
    return reject("request " + m.request + " already ended on " + id.ToString());
  }
  ProducerRequest& r = NewProducer(m.request, options.mode == Mode::kRead);
  if (!SetConsumerTp(r, m.from_tp_size)) return reject("consumer TP size " + std::to_string(m.from_tp_size) + " does not fit");
  auto t = r.targets.find(m.from.tp_rank);
  if (t == r.targets.end()) return reject("rank " + m.from.ToString() + " is not a partner of " + id.ToString());
  if (t->second.allocated) return reject("a second allocation for " + m.request);
  t->second.allocated = true;
  t->second.consumer = m.from;
  t->second.engine_key = from_key;
  t->second.blocks = m.blocks;
  t->second.num_tokens = m.num_tokens;
  t->second.first_token = m.first_token;
  if (!r.read_mode) PostLayers(r, t->second);
  ProgressProducer(r);
}

void Connector::Impl::OnConsumerAbort(const Message& m, const std::string& from_key) {
  auto it = producing.find(m.request);
  if (it == producing.end() || it->second.ended) {
    // Nothing of it is in flight here: confirm at once, and fail a later save of it fast.
    if (tombstones.size() < kMaxTombstones || tombstones.count(m.request)) {
      auto& t = tombstones[m.request];
      t.until = Clock::now() + options.abort_timeout;
    }
    (void)Send(from_key, Base(MsgType::kAbortAck, m.request));
    return;
  }
  ProducerRequest& r = it->second;
  if (r.read_mode) return OnRelease(m, from_key);
  if (!SetConsumerTp(r, m.from_tp_size)) {
    (void)Send(from_key, Base(MsgType::kAbortAck, m.request));
    return;
  }
  auto t = r.targets.find(m.from.tp_rank);
  if (t == r.targets.end()) {
    (void)Send(from_key, Base(MsgType::kAbortAck, m.request));
    return;
  }
  t->second.engine_key = from_key;
  t->second.consumer = m.from;
  t->second.allocated = true;
  if (t->second.state == TState::kOpen) t->second.state = TState::kAborted;
  t->second.failed_owed = false;
  t->second.ack_owed = true;
  ProgressProducer(r);
}

void Connector::Impl::ProgressProducer(ProducerRequest& r) {
  if (r.ended) return;
  const bool failing = !r.error.ok() || (r.aborted && !r.read_mode);
  bool all_ended = r.consumer_tp != 0;
  bool any_inflight = false;
  for (auto& [d, t] : r.targets) {
    if (failing && t.state == TState::kOpen) {
      t.state = TState::kFailed;
      t.failed_owed = t.allocated;
    }
    if (t.inflight == 0 && !t.engine_key.empty()) {
      // Writes that ended unanswered may still land there: said as such (kDeadlineExceeded),
      // never as a plain confirmation, so the consumer fences this engine before reusing blocks.
      if (t.ack_owed && t.unanswered) {
        t.ack_owed = false;
        t.failed_owed = true;
      }
      if (t.ack_owed) {
        t.ack_owed = false;
        (void)Send(t.engine_key, Base(MsgType::kAbortAck, r.id));
      }
      if (t.failed_owed) {
        t.failed_owed = false;
        Message f = Base(MsgType::kWriteFailed, r.id);
        Status why = r.error.ok() ? Status(Code::kAborted, "aborted") : r.error;
        if (t.unanswered) why = Status(Code::kDeadlineExceeded, "writes of " + r.id + " ended unanswered; they may still land");
        f.code = static_cast<uint32_t>(why.code());
        f.error = std::string(why.message()).substr(0, kMaxErrorBytes);
        (void)Send(t.engine_key, f);
      }
    }
    any_inflight = any_inflight || t.inflight > 0;
    all_ended = all_ended && t.state != TState::kOpen;
  }
  // (A partner is done only after the completion, which follows the seal and every save; one
  // that aborted needs neither: the request ends here, and later saves of it are ignored.)
  if (failing && r.consumer_tp == 0) all_ended = true;  // no partner has heard of it
  if (!all_ended || any_inflight) return;
  // Saves still waiting on their ReadyFn: their data would be read after the blocks went back.
  if (!r.read_mode && r.saves > r.saved.size() && r.error.ok()) return;
  r.ended = true;
  Finished f;
  f.request = r.id;
  f.producer = true;
  f.blocks = r.blocks;
  bool all_done = r.consumer_tp != 0;
  bool any_aborted = r.aborted;
  for (const auto& [d, t] : r.targets) {
    all_done = all_done && t.state == TState::kDone;
    any_aborted = any_aborted || t.state == TState::kAborted;
  }
  if (all_done && r.error.ok()) {
    f.outcome = Outcome::kDone;
  } else if (any_aborted) {
    f.outcome = Outcome::kAborted;
    f.status = r.error.ok() ? Status(Code::kAborted, "the consumer aborted request " + r.id) : r.error;
  } else {
    f.outcome = Outcome::kFailed;
    f.status = r.error.ok() ? Status(Code::kUnknown, "request " + r.id + " failed") : r.error;
  }
  bool remember = false;  // refuse late saves and seals of it (ended_ids)
  if (f.outcome != Outcome::kDone) {
    // Late calls and messages about it (a save after a deferred-write timeout, an allocation
    // that crossed the failure) are ignored or refused for a while, not taken as a new request.
    // Kept as long as a consumer may still abort or a save may still come (abort_timeout), at
    // most kMaxTombstones of them (past that, a late save opens a request that fails by its
    // deferred-write timeout).
    if (tombstones.size() < kMaxTombstones || tombstones.count(r.id)) {
      auto& tomb = tombstones[r.id];
      tomb.until = Clock::now() + options.abort_timeout;
      tomb.ended_here = true;
      remember = true;
    }
  }
  std::string rid = r.id;
  producing.erase(rid);
  Publish(std::move(f), true, remember);
}

void Connector::Impl::ProducerTimers(TimePoint now) {
  for (auto it = tombstones.begin(); it != tombstones.end();) {
    if (it->second.until >= now) {
      ++it;
      continue;
    }
    if (it->second.ended_here) {
      MutexLock l(&mu);
      ended_ids.erase(it->first);
    }
    it = tombstones.erase(it);
  }
  std::vector<std::string> due;
  for (auto& [rid, r] : producing) {
    if (!r.ended && (now >= r.deadline || now >= r.alloc_deadline)) due.push_back(rid);
  }
  for (const auto& rid : due) {
    auto it = producing.find(rid);
    if (it == producing.end()) continue;
    ProducerRequest& r = it->second;
    bool all_allocated = r.consumer_tp != 0;
    std::string missing;
    for (const auto& [d, t] : r.targets) {
      all_allocated = all_allocated && t.allocated;
      if (!t.allocated) missing += " tp" + std::to_string(d);
    }
    if (now >= r.deadline) {
      if (r.read_mode) Count(&ConnectorStats::blocks_expired, r.blocks.size());
      if (r.error.ok()) {
        r.error = Status(Code::kDeadlineExceeded, r.read_mode ? "request " + rid + " was not released within the abort timeout"
                                                               : "request " + rid + " did not complete within the abort timeout");
      }
      // Read mode: the consumer had its time; write mode: what is in flight still ends first.
      for (auto& [d, t] : r.targets) {
        if (t.state == TState::kOpen) t.state = TState::kFailed;
        if (r.read_mode) t.failed_owed = false;
      }
      r.deadline = TimePoint::max();
    } else if (!all_allocated && r.error.ok()) {
      r.error = Status(Code::kDeadlineExceeded, "no allocation for request " + rid + " arrived" +
                                                    (missing.empty() ? std::string() : " from consumer ranks" + missing) +
                                                    " within the deferred-write timeout");
    }
    r.alloc_deadline = TimePoint::max();
    ProgressProducer(r);
  }
}

void Connector::Impl::ProducerPeerLost(const std::string& engine_key, const Status& why) {
  std::vector<std::string> hit;
  for (auto& [rid, r] : producing) {
    for (auto& [d, t] : r.targets) {
      if (t.engine_key == engine_key && t.state == TState::kOpen) {
        t.state = TState::kFailed;
        t.failed_owed = false;
        t.ack_owed = false;
        if (r.error.ok()) r.error = why;
        hit.push_back(rid);
      }
    }
  }
  for (const auto& rid : hit) {
    auto it = producing.find(rid);
    if (it != producing.end()) ProgressProducer(it->second);
  }
}

}  // namespace ferry::kv
