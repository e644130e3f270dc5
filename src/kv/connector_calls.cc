// The Connector's public calls that start or end a request, and its queries: each is checked
// on the calling thread and carried out on the worker thread (connector.cc).
#include <string>
#include <utility>
#include <vector>

#include "kv/connector_impl.h"

namespace ferry::kv {

namespace {

Status CheckRequestId(std::string_view request) {
  if (request.empty() || request.size() > kMaxRequestIdBytes) {
    return Status(Code::kInvalidArgument, "request id must be 1.." + std::to_string(kMaxRequestIdBytes) + " bytes");
  }
  return {};
}

// The producer ranks (of `ranks`, one instance's TP ranks in order) a consumer rank of `layout`
// exchanges a request's messages with.
Result<std::vector<internal::Source>> SourcesFor(const CacheLayout& layout,
                                                 const std::vector<std::shared_ptr<const WorkerMetadata>>& ranks) {
  TpPair pair{layout.total_kv_heads, layout.mla, ranks[0]->layout.tp_size, layout.tp_size};
  if (Status s = ValidateTpPair(pair); !s.ok()) return s;
  std::vector<internal::Source> sources;
  for (uint32_t r : SourcesOf(pair, layout.tp_rank)) {
    internal::Source src;
    src.rank = r;
    src.producer = ranks[r]->id;
    src.engine_key = ranks[r]->engine.key;
    sources.push_back(std::move(src));
  }
  return sources;
}

Status CheckBlocks(const CacheLayout& layout, std::span<const uint64_t> blocks) {
  if (blocks.size() > kMaxMessageBlocks) return Status(Code::kOutOfRange, "too many blocks for one request");
  for (uint64_t b : blocks) {
    if (b >= layout.num_blocks) {
      return Status(Code::kOutOfRange, "block " + std::to_string(b) + " is beyond the cache's " +
                                           std::to_string(layout.num_blocks) + " blocks");
    }
  }
  return {};
}

// A save or seal of a request that already ended here (failed or aborted) and was reported:
// it would change nothing, and taking it would leave its caller waiting for a second end.
Status EndedHereError(const std::string& request) {
  return Status(Code::kFailedPrecondition, "request " + request +
                                               " already ended here (failed or aborted) and was reported in finished()");
}

}  // namespace

// ---- the public calls: checked here, carried out on the worker thread ----

Status Connector::ExpectWrite(std::string_view request, std::string_view producer, uint32_t producer_dp,
                              std::span<const uint64_t> blocks, uint64_t num_tokens, uint64_t first_token) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kWrite) return Status(Code::kFailedPrecondition, "ExpectWrite needs write mode");
  if (impl_->options.role == Role::kProducer) return Status(Code::kFailedPrecondition, "a producer does not receive");
  // Checked and used from a copy: the caller's array may change under another thread.
  if (blocks.size() > kMaxMessageBlocks) return Status(Code::kOutOfRange, "too many blocks for one request");
  std::vector<uint64_t> own_blocks(blocks.begin(), blocks.end());
  blocks = own_blocks;
  if (Status s = CheckBlocks(impl_->layout, blocks); !s.ok()) return s;
  if (num_tokens > blocks.size() * uint64_t{impl_->layout.block_tokens}) {
    return Status(Code::kOutOfRange, "more tokens than the blocks hold");
  }
  auto ranks = impl_->InstanceRanks(producer, producer_dp);
  if (!ranks.ok()) return ranks.status();
  auto sources = SourcesFor(impl_->layout, *ranks);
  if (!sources.ok()) return sources.status();
  std::string id(request);
  {
    MutexLock l(&impl_->mu);
    if (!impl_->consumer_ids.emplace(id, true).second) {
      return Status(Code::kAlreadyExists, "request " + id + " is already pending here");
    }
  }
  impl_->Post([impl = impl_.get(), id, sources = std::move(*sources), b = std::move(own_blocks),
               num_tokens, first_token]() mutable {
    impl->OnExpectWrite(id, std::move(sources), std::move(b), num_tokens, first_token);
  });
  return {};
}

Status Connector::StartRead(const ReadParams& params, std::span<const uint64_t> blocks, uint64_t first_token) {
  if (Status s = CheckRequestId(params.request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kRead) return Status(Code::kFailedPrecondition, "StartRead needs read mode");
  if (impl_->options.role == Role::kProducer) return Status(Code::kFailedPrecondition, "a producer does not receive");
  // Checked and used from a copy: the caller's array may change under another thread.
  if (blocks.size() > kMaxMessageBlocks) return Status(Code::kOutOfRange, "too many blocks for one request");
  std::vector<uint64_t> own_blocks(blocks.begin(), blocks.end());
  blocks = own_blocks;
  if (Status s = CheckBlocks(impl_->layout, blocks); !s.ok()) return s;
  auto ranks = impl_->InstanceRanks(params.producer.instance, params.producer.dp_rank);
  if (!ranks.ok() && params.producer_tp_size == 1 && !params.handshake.empty()) {
    if (Status s = AddPeerFrom(params.handshake); !s.ok()) return s;
    ranks = impl_->InstanceRanks(params.producer.instance, params.producer.dp_rank);
  }
  if (!ranks.ok()) return ranks.status();
  if ((*ranks)[0]->layout.tp_size != params.producer_tp_size) {
    return Status(Code::kInvalidArgument, "the read parameters name a TP size the producer does not have");
  }
  for (uint64_t b : params.blocks) {
    if (b >= (*ranks)[0]->layout.num_blocks) return Status(Code::kOutOfRange, "the read parameters name a block beyond the producer's cache");
  }
  auto sources = SourcesFor(impl_->layout, *ranks);
  if (!sources.ok()) return sources.status();
  {
    MutexLock l(&impl_->mu);
    if (!impl_->consumer_ids.emplace(params.request, true).second) {
      return Status(Code::kAlreadyExists, "request " + params.request + " is already pending here");
    }
    internal::LayerBoard board;
    board.landed.assign(impl_->layout.num_layers, false);
    impl_->boards[params.request] = std::move(board);
  }
  impl_->Post([impl = impl_.get(), params, ranks = std::move(*ranks), sources = std::move(*sources),
               b = std::move(own_blocks), first_token]() mutable {
    impl->OnStartRead(std::move(params), std::move(ranks), std::move(sources), std::move(b), first_token);
  });
  return {};
}

Status Connector::WaitLayer(std::string_view request, uint32_t layer, Duration timeout) {
  if (layer >= impl_->layout.num_layers) return Status(Code::kOutOfRange, "no layer " + std::to_string(layer));
  const TimePoint until = Clock::now() + timeout;
  std::string id(request);
  MutexLock l(&impl_->mu);
  for (;;) {
    auto it = impl_->boards.find(id);
    if (it == impl_->boards.end()) return Status(Code::kNotFound, "no read of request " + id + " here");
    const auto& b = it->second;
    if (b.landed[layer]) return {};
    if (!b.failed.ok()) return b.failed;
    if (b.ended) return Status(Code::kAborted, "request " + id + " ended");
    if (!impl_->finished_cv.WaitUntil(&impl_->mu, until)) {
      auto again = impl_->boards.find(id);
      if (again != impl_->boards.end() && again->second.landed[layer]) return {};
      return Status(Code::kDeadlineExceeded, "layer " + std::to_string(layer) + " of " + id + " has not landed");
    }
  }
}

Status Connector::SaveLayer(std::string_view request, uint32_t layer, std::span<const uint64_t> blocks,
                            ReadyFn ready) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kWrite) return Status(Code::kFailedPrecondition, "SaveLayer needs write mode");
  if (impl_->options.role == Role::kConsumer) return Status(Code::kFailedPrecondition, "a consumer does not send");
  if (layer >= impl_->layout.num_layers) return Status(Code::kOutOfRange, "no layer " + std::to_string(layer));
  // Checked and used from a copy: the caller's array may change under another thread.
  if (blocks.size() > kMaxMessageBlocks) return Status(Code::kOutOfRange, "too many blocks for one request");
  std::vector<uint64_t> own_blocks(blocks.begin(), blocks.end());
  blocks = own_blocks;
  if (Status s = CheckBlocks(impl_->layout, blocks); !s.ok()) return s;
  std::string id(request);
  {
    MutexLock l(&impl_->mu);
    if (impl_->ended_ids.count(id)) return EndedHereError(id);
    impl_->producer_ids.emplace(id, true);
  }
  std::vector<uint64_t> b = std::move(own_blocks);  // `blocks` views it: not used past here
  if (!ready) {
    impl_->Post([impl = impl_.get(), id, layer, b = std::move(b)]() mutable {
      impl->OnSaved(id, layer, std::move(b), {}, false);
    });
    return {};
  }
  // Counted now, so that a Seal() right after sees it even while its data is not ready.
  impl_->Post([impl = impl_.get(), id]() { impl->OnSaveCounted(id); });
  std::weak_ptr<internal::Mailbox> box = impl_->mailbox;
  impl_->ready->Push(std::move(ready), [box, impl = impl_.get(), id, layer, b = std::move(b)](Status s) mutable {
    auto m = box.lock();
    if (!m) return;
    m->Push(internal::Command{[impl, id, layer, b = std::move(b), s = std::move(s)]() mutable {
      impl->OnSaved(id, layer, std::move(b), std::move(s), true);
    }});
  });
  return {};
}

Status Connector::Seal(std::string_view request, uint32_t layers_saved) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kWrite) return Status(Code::kFailedPrecondition, "Seal needs write mode");
  if (layers_saved > impl_->layout.num_layers) return Status(Code::kOutOfRange, "more layers than the model has");
  std::string id(request);
  {
    MutexLock l(&impl_->mu);
    if (impl_->ended_ids.count(id)) return EndedHereError(id);
  }
  impl_->Post([impl = impl_.get(), id, layers_saved]() { impl->OnSeal(id, layers_saved); });
  return {};
}

Result<ReadParams> Connector::HoldForRead(std::string_view request, std::span<const uint64_t> blocks,
                                          uint64_t num_tokens) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kRead) return Status(Code::kFailedPrecondition, "HoldForRead needs read mode");
  if (impl_->options.role == Role::kConsumer) return Status(Code::kFailedPrecondition, "a consumer does not send");
  // Checked and used from a copy: the caller's array may change under another thread.
  if (blocks.size() > kMaxMessageBlocks) return Status(Code::kOutOfRange, "too many blocks for one request");
  std::vector<uint64_t> own_blocks(blocks.begin(), blocks.end());
  blocks = own_blocks;
  if (Status s = CheckBlocks(impl_->layout, blocks); !s.ok()) return s;
  if (num_tokens > blocks.size() * uint64_t{impl_->layout.block_tokens}) {
    return Status(Code::kOutOfRange, "more tokens than the blocks hold");
  }
  std::string id(request);
  {
    MutexLock l(&impl_->mu);
    if (!impl_->producer_ids.emplace(id, true).second) {
      return Status(Code::kAlreadyExists, "request " + id + " is already pending here");
    }
  }
  ReadParams p;
  p.request = id;
  p.producer = impl_->id;
  p.producer_tp_size = impl_->layout.tp_size;
  p.handshake = impl_->HandshakeAddress();
  p.blocks = std::move(own_blocks);
  p.num_tokens = num_tokens;
  impl_->Post([impl = impl_.get(), id, b = p.blocks, num_tokens]() mutable { impl->OnHold(id, std::move(b), num_tokens); });
  return p;
}

Status Connector::Abort(std::string_view request) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  std::string id(request);
  bool producer = false, consumer = false;
  {
    MutexLock l(&impl_->mu);
    producer = impl_->producer_ids.count(id) > 0;
    consumer = impl_->consumer_ids.count(id) > 0;
  }
  if (!producer && !consumer) return Status(Code::kNotFound, "request " + id + " is not pending here");
  impl_->Post([impl = impl_.get(), id, producer, consumer]() {
    if (producer) impl->OnProducerAbort(id);
    if (consumer) impl->OnConsumerAbortLocal(id);
  });
  return {};
}

std::vector<Finished> Connector::PopFinished() {
  MutexLock l(&impl_->mu);
  std::vector<Finished> out(std::make_move_iterator(impl_->finished.begin()),
                            std::make_move_iterator(impl_->finished.end()));
  impl_->finished.clear();
  for (const auto& f : out) {
    if (!f.producer) impl_->boards.erase(f.request);
  }
  return out;
}

std::vector<Finished> Connector::WaitFinished(Duration timeout) {
  {
    MutexLock l(&impl_->mu);
    impl_->finished_cv.WaitUntil(&impl_->mu, Clock::now() + timeout,
                                 [&]() REQUIRES(impl_->mu) { return !impl_->finished.empty(); });
  }
  return PopFinished();
}

size_t Connector::pending() const {
  MutexLock l(&impl_->mu);
  return impl_->producer_ids.size() + impl_->consumer_ids.size();
}

ConnectorStats Connector::stats() const {
  MutexLock l(&impl_->mu);
  return impl_->stats;
}

}  // namespace ferry::kv
