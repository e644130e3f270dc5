// The producer side of a request in read mode, on the connector's worker thread: HoldForRead()
// keeps the request's blocks for the consumer ranks, which read them and release them
// (kRelease); the rest of a producer's life (timers, aborts, a lost peer, the end) is
// connector_producer.cc's.
#include "kv/connector_impl.h"

namespace ferry::kv {

using TState = internal::Target::State;

void Connector::Impl::OnHold(const std::string& request, std::vector<uint64_t> blocks, uint64_t num_tokens) {
  ProducerRequest& r = NewProducer(request, true);
  r.blocks = std::move(blocks);
  r.have_blocks = true;
  r.num_tokens = num_tokens;
  ProgressProducer(r);
}

// A release is answered: kReleaseAck when the blocks were still held for that consumer rank (so
// they were, all the while it read them), kWriteFailed when they were not (the hold ended at
// its abort timeout or on a failure, and the blocks may have been reused): the consumer must
// not take what it read for done.
void Connector::Impl::OnRelease(const Message& m, const std::string& from_key) {
  auto not_held = [&](const std::string& why) {
    Message no = Base(MsgType::kWriteFailed, m.request);
    no.code = static_cast<uint32_t>(Code::kDeadlineExceeded);
    no.error = why;
    (void)Send(from_key, no);
  };
  auto it = producing.find(m.request);
  if (it == producing.end() || !it->second.read_mode || it->second.ended) {
    Count(&ConnectorStats::messages_rejected);
    not_held("request " + m.request + " is not held here (its hold ended: the abort timeout passed or it failed)");
    return;
  }
  ProducerRequest& r = it->second;
  if (!SetConsumerTp(r, m.from_tp_size)) {
    Count(&ConnectorStats::messages_rejected);
    return;
  }
  auto t = r.targets.find(m.from.tp_rank);
  if (t == r.targets.end()) {
    Count(&ConnectorStats::messages_rejected);
    return;
  }
  t->second.allocated = true;
  t->second.engine_key = from_key;
  t->second.consumer = m.from;
  if (!r.have_blocks) {
    // Opened by the read's announcement alone (e.g. long after this side's hold of it ended
    // and was forgotten): nothing was held while it read.
    if (t->second.state == TState::kOpen) t->second.state = TState::kFailed;
    if (r.error.ok()) r.error = Status(Code::kFailedPrecondition, "request " + r.id + " was read but not held here");
    not_held("request " + r.id + " is not held here (no HoldForRead of it, or its hold ended and was forgotten)");
  } else if (t->second.state == TState::kOpen) {
    t->second.state = TState::kDone;
    (void)Send(from_key, Base(MsgType::kReleaseAck, r.id));
  } else if (t->second.state != TState::kDone) {
    not_held("request " + r.id + " is not held here any more for " + m.from.ToString() + ": " + r.error.ToString());
  }
  ProgressProducer(r);
}

}  // namespace ferry::kv
