// The consumer (decode) side of a request, on the connector's worker thread.
//
// Write mode: ExpectWrite() sends the allocation to every partner (producer rank); the request
// is done when each partner's completion arrived (it follows every byte that partner wrote).
// A failure (a partner's kWriteFailed, the transfer timeout, a lost partner, Abort()) turns the
// request to failing: every partner not yet settled is sent kAbort, and the request ends, with
// its blocks handed back, only when each partner is settled: done, failed (it said so after its
// last write ended), confirmed the abort, or is known dead; a partner that does none of these
// is given up after abort_timeout (counted in blocks_expired). A partner given up on without
// proof that its writes ended (silent past abort_timeout, its link lost, or it reports writes
// that ended unanswered) is fenced first (Engine::FencePeer): what it still has queued in a
// cut link is refused when the link comes back. So no late write lands in a block that was
// handed back.
//
// Read mode: StartRead() posts every layer's reads (one batch per layer and partner) and tells
// each partner it reads; WaitLayer() returns as each layer lands. When every read ended the
// partners get kRelease (the reads are this side's own, so once they ended nothing more lands).
#include <algorithm>

#include "base/log.h"
#include "kv/connector_impl.h"

namespace ferry::kv {

using internal::Source;
using SState = internal::Source::State;

void Connector::Impl::OnExpectWrite(const std::string& request, std::vector<Source> sources,
                                    std::vector<uint64_t> blocks, uint64_t num_tokens, uint64_t first_token) {
  auto [it, fresh] = consuming.try_emplace(request);
  ConsumerRequest& r = it->second;
  r.id = request;
  r.blocks = std::move(blocks);
  r.num_tokens = num_tokens;
  r.deadline = Clock::now() + options.transfer_timeout;
  Message m = Base(MsgType::kAllocation, request);
  m.blocks = r.blocks;
  m.num_tokens = num_tokens;
  m.first_token = first_token;
  m.handshake = HandshakeAddress();
  for (auto& s : sources) r.sources.emplace(s.rank, std::move(s));
  for (auto& [rank, s] : r.sources) {
    Status st = Send(s.engine_key, m);
    if (!st.ok()) {
      // It may not have left: the partner is asked to abort like any other, and settles when it
      // confirms or is found dead.
      FailConsumer(r, st.WithContext("sending the allocation of " + request + " to " + s.producer.ToString()));
    }
  }
  ProgressConsumer(r);
}

void Connector::Impl::OnStartRead(ReadParams params, std::vector<std::shared_ptr<const WorkerMetadata>> producers,
                                  std::vector<Source> sources, std::vector<uint64_t> blocks, uint64_t first_token) {
  auto [it, fresh] = consuming.try_emplace(params.request);
  ConsumerRequest& r = it->second;
  r.id = params.request;
  r.read_mode = true;
  r.blocks = std::move(blocks);
  r.num_tokens = params.num_tokens;
  r.deadline = Clock::now() + options.transfer_timeout;
  r.layer_inflight.assign(layout.num_layers, 0);
  for (auto& s : sources) r.sources.emplace(s.rank, std::move(s));

  Message notice = Base(MsgType::kAllocation, r.id);
  notice.blocks = r.blocks;
  notice.first_token = first_token;
  notice.handshake = HandshakeAddress();

  std::weak_ptr<internal::Mailbox> box = mailbox;
  Plan plan;
  for (auto& [rank, s] : r.sources) {
    Status st = Send(s.engine_key, notice);
    const WorkerMetadata& peer = *producers[rank];
    std::span<const uint64_t> src(params.blocks);
    if (st.ok() && first_token % peer.layout.block_tokens != 0) {
      st = Status(Code::kInvalidArgument, "the first token is not on a block boundary of the producer");
    }
    if (st.ok()) {
      const uint64_t skip = first_token / peer.layout.block_tokens;
      if (skip > src.size()) {
        st = Status(Code::kOutOfRange, "the prefix hit is longer than the producer's blocks");
      } else {
        src = src.subspan(skip);
      }
    }
    if (st.ok()) {
      PlanInput in;
      in.src = &peer.layout;
      in.dst = &layout;
      in.src_blocks = src;
      in.dst_blocks = r.blocks;
      in.num_tokens = r.num_tokens > first_token ? r.num_tokens - first_token : 0;
      if (r.num_tokens == 0) in.num_tokens = 0;
      in.poster_is_src = false;
      st = BuildPlan(in, &plan);
    }
    for (size_t g = 0; st.ok() && g < plan.groups.size(); ++g) {
      const OpGroup& grp = plan.groups[g];
      auto session = SessionFor(peer, grp.local_region, grp.remote_region);
      if (!session.ok()) {
        st = session.status();
        break;
      }
      TransferOptions o;
      o.deadline = options.transfer_timeout;
      o.on_complete = [box, impl = this, id = r.id, layer = grp.layer](const Status& s) {
        if (auto m = box.lock()) {
          m->Push(internal::Command{[impl, id, layer, s]() { impl->OnReadDone(id, layer, s); }});
        }
      };
      ++r.layer_inflight[grp.layer];
      ++r.inflight;
      (void)session->Post(Op::kRead, std::span<const TransferOp>(plan.ops.data() + grp.begin, grp.end - grp.begin), o);
      Count(&ConnectorStats::ops_posted, grp.end - grp.begin);
      Count(&ConnectorStats::bytes, grp.bytes);
    }
    if (!st.ok()) FailConsumer(r, st.WithContext("reading " + r.id + " from " + s.producer.ToString()));
  }
  // Layers no partner sends (nothing to move) have landed already.
  {
    MutexLock l(&mu);
    auto b = boards.find(r.id);
    if (b != boards.end()) {
      for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
        if (r.layer_inflight[layer] == 0 && r.error.ok()) b->second.landed[layer] = true;
      }
      finished_cv.NotifyAll();
    }
  }
  ProgressConsumer(r);
}

void Connector::Impl::OnReadDone(const std::string& request, uint32_t layer, Status s) {
  auto it = consuming.find(request);
  if (it == consuming.end()) return;
  ConsumerRequest& r = it->second;
  if (r.inflight > 0) --r.inflight;
  if (layer < r.layer_inflight.size() && r.layer_inflight[layer] > 0) --r.layer_inflight[layer];
  if (!s.ok()) {
    FailConsumer(r, s.WithContext("reading layer " + std::to_string(layer) + " of " + request));
  } else if (r.error.ok() && layer < r.layer_inflight.size() && r.layer_inflight[layer] == 0) {
    Count(&ConnectorStats::layers_read);
    MutexLock l(&mu);
    auto b = boards.find(request);
    if (b != boards.end()) b->second.landed[layer] = true;
    finished_cv.NotifyAll();
  }
  ProgressConsumer(r);
}

void Connector::Impl::OnConsumerAbortLocal(const std::string& request) {
  auto it = consuming.find(request);
  if (it == consuming.end()) return;
  it->second.aborted = true;
  FailConsumer(it->second, Status(Code::kAborted, "request " + request + " aborted by its consumer"));
  ProgressConsumer(it->second);
}

// The partner of (request, from): the message's sender must be the rank the request expects.
static Source* FindSource(std::unordered_map<std::string, ConsumerRequest>& consuming, const Message& m,
                          const std::string& from_key, ConsumerRequest** req) {
  auto it = consuming.find(m.request);
  if (it == consuming.end()) return nullptr;
  auto s = it->second.sources.find(m.from.tp_rank);
  if (s == it->second.sources.end() || s->second.engine_key != from_key || s->second.producer != m.from) return nullptr;
  *req = &it->second;
  return &s->second;
}

void Connector::Impl::OnCompletion(const Message& m, const std::string& from_key) {
  ConsumerRequest* r = nullptr;
  Source* s = FindSource(consuming, m, from_key, &r);
  if (s == nullptr || r->read_mode) {
    Count(&ConnectorStats::messages_rejected);
    return;
  }
  if (s->state == SState::kWaiting || s->state == SState::kAbortSent) {
    s->state = SState::kDone;
    s->layers = m.layers;
    if (options.checksums && r->error.ok()) {
      if (Status c = VerifyChecksums(*r, *s, m); !c.ok()) {
        Count(&ConnectorStats::checksum_failures);
        FailConsumer(*r, c);
      }
    }
  }
  ProgressConsumer(*r);
}

Status Connector::Impl::VerifyChecksums(const ConsumerRequest& r, const Source& s, const Message& m) {
  auto peer = PeerOf(s.producer);
  if (peer == nullptr) return Status(Code::kFailedPrecondition, "producer " + s.producer.ToString() + " is not known");
  if (m.checksums.empty()) return Status(Code::kDataLoss, s.producer.ToString() + " sent no checksums for " + r.id);
  if (m.checksums.size() != layout.num_layers) {
    return Status(Code::kDataLoss, s.producer.ToString() + " sent checksums of " + std::to_string(m.checksums.size()) +
                                       " layers for " + r.id);
  }
  const uint64_t capacity = r.blocks.size() * uint64_t{layout.block_tokens};
  if (m.num_tokens > capacity) return Status(Code::kDataLoss, "the completion of " + r.id + " names more tokens than its blocks hold");
  const HeadRange heads = RouteHeads(TpPair{layout.total_kv_heads, layout.mla, peer->layout.tp_size, layout.tp_size},
                                     s.rank, layout.tp_rank);
  // Every layer is started before any is waited for, so GPU layers hash back to back.
  std::vector<PendingChecksum> jobs(layout.num_layers);
  for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
    if (m.checksums[layer] == 0) continue;  // not written (a hybrid model's skipped layer)
    FERRY_ASSIGN_OR_RETURN(jobs[layer], checksummer->Start(r.blocks, m.num_tokens, heads, layer));
  }
  std::vector<uint64_t> here;
  FERRY_RETURN_IF_ERROR(checksummer->FinishAll(jobs, Deadline::After(options.transfer_timeout), &here));
  for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
    if (here[layer] != m.checksums[layer]) {
      return Status(Code::kDataLoss, "layer " + std::to_string(layer) + " of " + r.id + " from " + s.producer.ToString() +
                                         " does not match its checksum");
    }
  }
  return {};
}

void Connector::Impl::OnWriteFailed(const Message& m, const std::string& from_key) {
  ConsumerRequest* r = nullptr;
  Source* s = FindSource(consuming, m, from_key, &r);
  if (s == nullptr) {
    Count(&ConnectorStats::messages_rejected);
    return;
  }
  Code code = m.code > 0 && m.code <= static_cast<uint32_t>(Code::kInProgress) ? static_cast<Code>(m.code) : Code::kUnknown;
  if (code == Code::kOk) code = Code::kUnknown;
  // Writes that ended unanswered at the producer (its deadline, a lost link) may still land.
  const bool unanswered = code == Code::kDeadlineExceeded || code == Code::kUnavailable;
  if (!s->settled() && s->state != SState::kFencing) {
    if (unanswered && !r->read_mode) GiveUpOn(*s);
    else s->state = SState::kFailed;
  }
  FailConsumer(*r, Status(code, s->producer.ToString() + " could not write request " + m.request + ": " + m.error));
  ProgressConsumer(*r);
}

void Connector::Impl::OnAbortAck(const Message& m, const std::string& from_key) {
  ConsumerRequest* r = nullptr;
  Source* s = FindSource(consuming, m, from_key, &r);
  if (s == nullptr) {
    Count(&ConnectorStats::messages_rejected);
    return;
  }
  if (!s->settled()) s->state = SState::kSettled;
  ProgressConsumer(*r);
}

void Connector::Impl::OnReleaseAck(const Message& m, const std::string& from_key) {
  ConsumerRequest* r = nullptr;
  Source* s = FindSource(consuming, m, from_key, &r);
  if (s == nullptr || !r->read_mode || s->state != SState::kReleaseSent) {
    Count(&ConnectorStats::messages_rejected);
    return;
  }
  s->state = SState::kDone;
  ProgressConsumer(*r);
}

void Connector::Impl::FailConsumer(ConsumerRequest& r, Status why) {
  if (!r.error.ok()) return;
  r.error = std::move(why);
  MutexLock l(&mu);
  auto b = boards.find(r.id);
  if (b != boards.end()) {
    b->second.failed = r.error;
    finished_cv.NotifyAll();
  }
}

void Connector::Impl::ProgressConsumer(ConsumerRequest& r) {
  if (r.ended) return;
  if (r.read_mode) {
    if (r.inflight > 0) return;
    if (!r.released) {
      // The reads were one-sided: only the producer can say that it still held the blocks
      // while they ran (a hold ends at its abort timeout, and the blocks are reused). The
      // request is done once each producer rank confirms the release.
      r.released = true;
      Message rel = Base(MsgType::kRelease, r.id);
      const TimePoint now = Clock::now();
      for (auto& [rank, s] : r.sources) {
        if (s.settled()) continue;
        Status sent = Send(s.engine_key, rel);
        if (sent.ok()) {
          s.state = SState::kReleaseSent;
          s.abort_deadline = now + options.transfer_timeout;
        } else {
          s.state = SState::kSettled;
          FailConsumer(r, Status(Code::kUnavailable, "could not release " + r.id + " to " + s.producer.ToString() +
                                                         ", which cannot confirm it held the blocks read: " +
                                                         std::string(sent.message())));
        }
      }
    }
  } else if (!r.error.ok()) {
    const TimePoint now = Clock::now();
    Message abort = Base(MsgType::kAbort, r.id);
    for (auto& [rank, s] : r.sources) {
      if (s.state == SState::kWaiting) {
        s.state = SState::kAbortSent;
        s.abort_deadline = now + options.abort_timeout;
        Status st = Send(s.engine_key, abort);
        if (st.code() == Code::kUnavailable || st.code() == Code::kFailedPrecondition) GiveUpOn(s);
      }
    }
  }
  bool all_settled = true, all_done = true;
  for (const auto& [rank, s] : r.sources) {
    all_settled = all_settled && s.settled();
    all_done = all_done && s.state == SState::kDone;
  }
  if (!all_settled) return;
  r.ended = true;
  Finished f;
  f.request = r.id;
  f.producer = false;
  f.blocks = r.blocks;
  if (r.error.ok() && (all_done || r.read_mode)) {
    f.outcome = Outcome::kDone;
  } else {
    f.outcome = r.aborted ? Outcome::kAborted : Outcome::kFailed;
    f.status = r.error.ok() ? Status(Code::kUnknown, "request " + r.id + " failed") : r.error;
  }
  std::string rid = r.id;
  consuming.erase(rid);
  Publish(std::move(f), false);
}

void Connector::Impl::ConsumerTimers(TimePoint now) {
  std::vector<std::string> due;
  for (auto& [rid, r] : consuming) {
    if (r.ended) continue;
    bool hit = !r.read_mode && r.error.ok() && now >= r.deadline;
    for (const auto& [rank, s] : r.sources) {
      hit = hit || ((s.state == SState::kAbortSent || s.state == SState::kReleaseSent || s.state == SState::kFencing) &&
                    now >= s.abort_deadline);
    }
    if (hit) due.push_back(rid);
  }
  for (const auto& rid : due) {
    auto it = consuming.find(rid);
    if (it == consuming.end()) continue;
    ConsumerRequest& r = it->second;
    if (!r.read_mode && r.error.ok() && now >= r.deadline) {
      std::string missing;
      for (const auto& [rank, s] : r.sources) {
        if (s.state != SState::kDone) missing += " " + s.producer.ToString();
      }
      FailConsumer(r, Status(Code::kDeadlineExceeded, "request " + rid + " was not complete within the transfer timeout (waiting on" +
                                                          missing + ")"));
    }
    for (auto& [rank, s] : r.sources) {
      if (s.state == SState::kReleaseSent && now >= s.abort_deadline) {
        s.state = SState::kSettled;
        FailConsumer(r, Status(Code::kDeadlineExceeded, s.producer.ToString() + " did not confirm that it held the blocks of " +
                                                            rid + " until they were read"));
      }
      if (s.state == SState::kAbortSent && now >= s.abort_deadline) {
        Count(&ConnectorStats::blocks_expired, r.blocks.size());
        FERRY_LOG_WARN("kv {}: {} never confirmed the abort of {}; its blocks are handed back after the abort timeout, "
                       "once it is fenced",
                       id.ToString(), s.producer.ToString(), rid);
        GiveUpOn(s);
      }
      if (s.state == SState::kFencing && now >= s.abort_deadline) TryFence(s, now);
    }
    ProgressConsumer(r);
  }
}

void Connector::Impl::GiveUpOn(Source& s) {
  s.state = SState::kFencing;
  TryFence(s, Clock::now());
}

void Connector::Impl::TryFence(Source& s, TimePoint now) {
  // Short: this is the worker thread. Writes still landing (a stalled link) are waited for by
  // retrying from the timers, the blocks kept meanwhile.
  Status f = engine->FencePeer(s.engine_key, std::chrono::milliseconds(5));
  if (f.code() == Code::kDeadlineExceeded) {
    s.abort_deadline = now + std::chrono::milliseconds(10);
    return;
  }
  if (!f.ok()) FERRY_LOG_WARN("kv {}: fencing {}: {}", id.ToString(), s.producer.ToString(), f.ToString());
  Count(&ConnectorStats::peers_fenced);
  s.state = SState::kSettled;
}

void Connector::Impl::ConsumerPeerLost(const std::string& engine_key, const Status& why) {
  std::vector<std::string> hit;
  for (auto& [rid, r] : consuming) {
    for (auto& [rank, s] : r.sources) {
      if (s.engine_key != engine_key || s.settled()) continue;
      // A producer that cannot be reached confirms no release. Its link may only be cut, with its
      // writes queued there: fenced before its blocks go back.
      if (s.state == SState::kFencing) continue;
      if (!r.read_mode) GiveUpOn(s);
      else if (s.state == SState::kReleaseSent) s.state = SState::kSettled;
      hit.push_back(rid);
    }
  }
  for (const auto& rid : hit) {
    auto it = consuming.find(rid);
    if (it == consuming.end()) continue;
    FailConsumer(it->second, why);
    ProgressConsumer(it->second);
  }
}

}  // namespace ferry::kv
