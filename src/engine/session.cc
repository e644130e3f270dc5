#include <algorithm>
#include <mutex>
#include <string>

#include "engine/coalesce.h"
#include "engine/engine_core.h"

namespace ferry {
namespace internal {
namespace {

Status OutOfRange(size_t index, const TransferOp& op, const MemoryDesc& local,
                  const MemoryDesc& remote, bool local_side) {
  const MemoryDesc& d = local_side ? local : remote;
  uint64_t offset = local_side ? op.local_offset : op.remote_offset;
  return Status(Code::kOutOfRange,
                "op " + std::to_string(index) + ": " + (local_side ? "local" : "remote") +
                    " offset " + std::to_string(offset) + " + " + std::to_string(op.size) +
                    " bytes exceeds region " + std::to_string(static_cast<uint64_t>(d.region)) +
                    " of " + std::to_string(d.size) + " bytes");
}

// Holds a write batch's notification until every write posted before the batch has finished
// and the batch's own data is in place (Arrive once for each). If one of those writes failed,
// the notification is not sent and the batch fails with that write's error.
class NotifyGate {
 public:
  NotifyGate(std::shared_ptr<Endpoint> endpoint, std::string message, int arrivals)
      : endpoint_(std::move(endpoint)), message_(std::move(message)), left_(arrivals) {}

  // The batch's continuation: its data is in place. Holds a part of the batch until the
  // notification is handed to the endpoint.
  void DataPlaced(const std::shared_ptr<TransferState>& batch) {
    batch->AddParts(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch_ = batch;
    }
    Arrive(Status::Ok());
  }
  // An earlier write finished with `status`.
  void EarlierFinished(const Status& status, TransferId id) {
    Arrive(status.ok() ? status
                       : Status(status.code(), "notification not sent: earlier write " +
                                                   std::to_string(static_cast<uint64_t>(id)) +
                                                   " of this session failed: " + std::string(status.message())));
  }

 private:
  void Arrive(const Status& status) {
    std::shared_ptr<TransferState> batch;
    Status error;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!status.ok() && error_.ok()) error_ = status;
      if (--left_ > 0) return;
      batch = std::move(batch_);
      error = error_;
    }
    if (!error.ok()) return batch->PartDone(error);
    if (!batch->finished()) endpoint_->NotifyPart(std::move(message_), batch);
    batch->PartDone(Status::Ok());
  }

  const std::shared_ptr<Endpoint> endpoint_;
  std::string message_;
  std::mutex mu_;
  int left_;                             // GUARDED_BY(mu_)
  Status error_;                         // GUARDED_BY(mu_)
  std::shared_ptr<TransferState> batch_;  // GUARDED_BY(mu_)
};

}  // namespace

Transfer SessionCore::Post(Op op, std::span<const TransferOp> ops, const TransferOptions& options) const {
  std::vector<TransferOp> owned(ops.begin(), ops.end());
  return PostOwned(op, owned, options);
}

Transfer SessionCore::PostOwned(Op op, std::span<TransferOp> ops, const TransferOptions& options) const {
  TransferId id = options.id ? *options.id : engine_->AllocateTransferId();
  if (engine_->closed())
    return Transfer(TransferState::Failed(Status(Code::kAborted, "the engine was shut down"), id, path_));
  if (options.deadline && *options.deadline <= Duration::zero())
    return Transfer(TransferState::Failed(
        Status(Code::kInvalidArgument, "a transfer's deadline must be positive, not " +
                                           std::to_string(options.deadline->count()) + " ns"),
        id, path_));
  if (options.notification && op != Op::kWrite)
    return Transfer(TransferState::Failed(
        Status(Code::kInvalidArgument, "only writes carry a notification"), id, path_));
  if (options.notification && options.notification->size() > engine_->options().max_notification_bytes)
    return Transfer(TransferState::Failed(
        Status(Code::kInvalidArgument, "notification exceeds max_notification_bytes"), id, path_));
  if (options.notification && !notify_)
    return Transfer(TransferState::Failed(
        Status(Code::kUnavailable, "no transport carries notifications to " + remote_.engine_key +
                                       " (the " + path_.transport + " transport has none of its own)"),
        id, path_));

  // Validate every op against both regions before any byte moves. `ops` is the engine's own
  // copy: what is checked here is what the transport gets.
  const uint64_t local_size = local_.size;
  const uint64_t remote_size = remote_.size;
  uint64_t total = 0;
  JoinCounter joins;
  for (size_t i = 0; i < ops.size(); ++i) {
    const TransferOp& o = ops[i];
    if (!InBounds(o.local_offset, o.size, local_size)) [[unlikely]]
      return Transfer(TransferState::Failed(OutOfRange(i, o, local_, remote_, true), id, path_));
    if (!InBounds(o.remote_offset, o.size, remote_size)) [[unlikely]]
      return Transfer(TransferState::Failed(OutOfRange(i, o, local_, remote_, false), id, path_));
    if (__builtin_add_overflow(total, o.size, &total)) [[unlikely]]
      return Transfer(TransferState::Failed(
          Status(Code::kOutOfRange, "batch size overflows 64 bits"), id, path_));
    joins.Add(o);
  }
  if (engine_->options().merge_adjacent_ops && WorthCoalescing(joins.joins(), ops.size())) {
    const size_t merged = CoalesceInPlace(ops);
    engine_->CountMerged(ops.size() - merged);
    ops = ops.first(merged);
  }

  Duration deadline = options.deadline ? *options.deadline : engine_->options().default_deadline;
  auto state = std::make_shared<TransferState>(id, total, path_, Deadline::After(deadline));
  if (op == Op::kWrite) {
    std::vector<std::shared_ptr<TransferState>> earlier;
    {
      std::lock_guard<std::mutex> lock(writes_mu_);
      if (options.notification || writes_.size() >= prune_at_) {
        // Drop the finished writes; a notification waits for the rest.
        size_t kept = 0;
        for (auto& w : writes_) {
          std::shared_ptr<TransferState> live = w.lock();
          if (!live || live->finished()) continue;
          if (options.notification) earlier.push_back(live);
          writes_[kept++] = std::move(w);
        }
        writes_.resize(kept);
        prune_at_ = std::max<size_t>(64, 2 * kept);
      }
      writes_.push_back(state);
    }
    if (options.notification) {
      // The notification leaves once every byte of the batch is in place at the target and
      // every earlier write of the session has finished; the transfer completes when the
      // receiver has it.
      if (earlier.empty()) {
        state->SetContinuation([endpoint = notify_, message = *options.notification](
                                   const std::shared_ptr<TransferState>& s) {
          endpoint->NotifyPart(message, s);
        });
      } else {
        auto gate = std::make_shared<NotifyGate>(notify_, *options.notification,
                                                 static_cast<int>(earlier.size()) + 1);
        state->SetContinuation([gate](const std::shared_ptr<TransferState>& s) { gate->DataPlaced(s); });
        for (const auto& w : earlier)
          w->OnFinish([gate, id = w->id()](const Status& st) { gate->EarlierFinished(st, id); });
      }
    }
  }
  if (!ops.empty()) {
    Status posted = channel_->Post(op, ops, total, state);
    if (!posted.ok()) state->Finish(std::move(posted));
  }
  state->PartDone(Status::Ok());  // the poster's own part
  return Transfer(std::move(state));
}

}  // namespace internal

namespace {
std::shared_ptr<internal::TransferState> NoSession() {
  return internal::TransferState::Failed(Status(Code::kFailedPrecondition, "empty session handle"));
}
}  // namespace

Transfer Session::Post(Op op, std::span<const TransferOp> ops, const TransferOptions& options) const {
  if (!core_) return Transfer(NoSession());
  return core_->Post(op, ops, options);
}

Transfer Session::Post(Op op, std::vector<TransferOp>&& ops, const TransferOptions& options) const {
  if (!core_) return Transfer(NoSession());
  std::vector<TransferOp> owned = std::move(ops);
  return core_->PostOwned(op, owned, options);
}

Transfer Session::Write(uint64_t local_offset, uint64_t remote_offset, uint64_t bytes,
                        const TransferOptions& options) const {
  if (!core_) return Transfer(NoSession());
  TransferOp op{local_offset, remote_offset, bytes};
  return core_->PostOwned(Op::kWrite, std::span<TransferOp>(&op, 1), options);
}

Transfer Session::Read(uint64_t local_offset, uint64_t remote_offset, uint64_t bytes,
                       const TransferOptions& options) const {
  if (!core_) return Transfer(NoSession());
  TransferOp op{local_offset, remote_offset, bytes};
  return core_->PostOwned(Op::kRead, std::span<TransferOp>(&op, 1), options);
}

Transfer Session::WriteBatch(std::span<const TransferOp> ops, const TransferOptions& options) const {
  return Post(Op::kWrite, ops, options);
}

Transfer Session::ReadBatch(std::span<const TransferOp> ops, const TransferOptions& options) const {
  return Post(Op::kRead, ops, options);
}

namespace {
const MemoryDesc& EmptyDesc() {
  static const MemoryDesc d;
  return d;
}
}  // namespace

const MemoryDesc& Session::local() const { return core_ ? core_->local() : EmptyDesc(); }
const MemoryDesc& Session::remote() const { return core_ ? core_->remote() : EmptyDesc(); }
TransferPath Session::path() const { return core_ ? core_->path() : TransferPath{}; }

// Transfer: a handle over TransferState.

bool Transfer::Test() const { return state_ ? state_->Test() : true; }

Status Transfer::Wait() const {
  if (!state_) return Status(Code::kFailedPrecondition, "empty transfer handle");
  return state_->Wait(Deadline());
}

Status Transfer::WaitFor(Duration timeout) const {
  if (!state_) return Status(Code::kFailedPrecondition, "empty transfer handle");
  return state_->Wait(Deadline::After(timeout));
}

Status Transfer::status() const {
  if (!state_) return Status(Code::kFailedPrecondition, "empty transfer handle");
  return state_->status();
}

uint64_t Transfer::bytes() const { return state_ ? state_->bytes() : 0; }
TransferPath Transfer::path() const { return state_ ? state_->path() : TransferPath{}; }
TransferId Transfer::id() const { return state_ ? state_->id() : TransferId{}; }


}  // namespace ferry
