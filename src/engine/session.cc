#include <algorithm>
#include <memory>
#include <string>

#include "engine/after_gate.h"
#include "engine/coalesce.h"
#include "engine/engine_core.h"
#include "engine/op_check.h"

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

// The engine's copy of a caller's ops, for the length of one Post. Each thread keeps the storage
// of its copies (up to kKeptBytes) for its next batch: fresh memory for a large batch costs a
// page fault per 4 KiB on first touch (130 us for 80,000 ops on an H200 machine's host, more
// than checking them). A Post made while the thread's storage is in use (from a callback run
// inside another Post) gets storage of its own.
class OpsCopy {
 public:
  explicit OpsCopy(size_t n) {
    Kept& kept = ThreadKept();
    if (!kept.busy && n * sizeof(TransferOp) <= kKeptBytes) {
      if (kept.capacity < n) {
        kept.ops.reset(new TransferOp[n]);
        kept.capacity = n;
      }
      kept.busy = true;
      data_ = kept.ops.get();
      borrowed_ = true;
    } else {
      own_.reset(new TransferOp[n]);
      data_ = own_.get();
    }
  }
  ~OpsCopy() {
    if (borrowed_) ThreadKept().busy = false;
  }
  OpsCopy(const OpsCopy&) = delete;
  OpsCopy& operator=(const OpsCopy&) = delete;
  TransferOp* data() const { return data_; }

 private:
  static constexpr size_t kKeptBytes = 4 << 20;  // 174,762 ops
  struct Kept {
    std::unique_ptr<TransferOp[]> ops;
    size_t capacity = 0;
    bool busy = false;
  };
  static Kept& ThreadKept() {
    thread_local Kept kept;
    return kept;
  }
  std::unique_ptr<TransferOp[]> own_;
  TransferOp* data_ = nullptr;
  bool borrowed_ = false;
};

}  // namespace

std::optional<Transfer> SessionCore::PostReserved(Op op, std::span<const TransferOp> ops,
                                                  const TransferOptions& options) const {
  if (ops.size() < kReserveMinOps) return std::nullopt;
  std::unique_ptr<OpSpace> space = channel_->ReserveOps(op, ops.size());
  if (!space) return std::nullopt;
  const OpCheck check = CopyAndCheckOps(ops, space->data(), local_.size, remote_.size);
  return PostChecked(op, std::span<TransferOp>(space->data(), ops.size()), check, options, space.get());
}

Transfer SessionCore::Post(Op op, std::span<const TransferOp> ops, const TransferOptions& options) const {
  if (std::optional<Transfer> t = PostReserved(op, ops, options)) return std::move(*t);
  // The transports take what they need from the ops before Post returns (the copy is gone then).
  OpsCopy owned(ops.size());
  const OpCheck check = CopyAndCheckOps(ops, owned.data(), local_.size, remote_.size);
  return PostChecked(op, std::span<TransferOp>(owned.data(), ops.size()), check, options, nullptr);
}

Transfer SessionCore::PostOwned(Op op, std::span<TransferOp> ops, const TransferOptions& options) const {
  if (std::optional<Transfer> t = PostReserved(op, ops, options)) return std::move(*t);
  const OpCheck check = CopyAndCheckOps(ops, ops.data(), local_.size, remote_.size);
  return PostChecked(op, ops, check, options, nullptr);
}

Transfer SessionCore::PostChecked(Op op, std::span<TransferOp> ops, const OpCheck& check,
                                  const TransferOptions& options, OpSpace* space) const {
  TransferId id = options.id ? *options.id : engine_->AllocateTransferId();
  auto fail = [&](Status s) {
    return engine_->Issue(TransferState::Failed(std::move(s), id, path_), options.on_complete, {}, series_);
  };
  if (engine_->closed()) return fail(Status(Code::kAborted, "the engine was shut down"));
  if (options.deadline && *options.deadline <= Duration::zero())
    return fail(Status(Code::kInvalidArgument, "a transfer's deadline must be positive, not " +
                                                   std::to_string(options.deadline->count()) + " ns"));
  std::optional<std::string> wire;
  if (options.notification) {
    if (op != Op::kWrite) return fail(Status(Code::kInvalidArgument, "only writes carry a notification"));
    Result<std::string> framed =
        FrameNotification(engine_->options(), options.notification_topic, *options.notification);
    if (!framed.ok()) return fail(framed.status());
    if (!notify_)
      return fail(Status(Code::kUnavailable, "no transport carries notifications to " + remote_.engine_key +
                                                 " (the " + path_.transport + " transport has none of its own)"));
    wire = std::move(framed).value();
  }
  std::vector<GateInput> inputs;
  for (size_t i = 0; i < options.after.size(); ++i) {
    const auto& s = TransferAccess::Of(options.after[i]);
    if (!s)
      return fail(Status(Code::kInvalidArgument, "after[" + std::to_string(i) + "] is an empty transfer handle"));
    inputs.push_back({s, "transfer " + std::to_string(static_cast<uint64_t>(s->id())) + " named in `after`"});
  }

  // Every op was checked against both regions before any byte moves (CopyAndCheckOps). `ops`
  // is the engine's own copy: what was checked is what the transport gets. On a failed check
  // the first offending op is found again in that copy, for the message.
  if (!check.ok) [[unlikely]] {
    uint64_t sum = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const TransferOp& o = ops[i];
      if (!InBounds(o.local_offset, o.size, local_.size)) return fail(OutOfRange(i, o, local_, remote_, true));
      if (!InBounds(o.remote_offset, o.size, remote_.size)) return fail(OutOfRange(i, o, local_, remote_, false));
      if (__builtin_add_overflow(sum, o.size, &sum)) break;
    }
    return fail(Status(Code::kOutOfRange, "batch size overflows 64 bits"));
  }
  const uint64_t total = check.total;
  uint64_t max_size = check.max_size;
  if (engine_->options().merge_adjacent_ops && WorthCoalescing(check.joins, ops.size())) {
    const size_t merged = CoalesceInPlace(ops);
    engine_->CountMerged(ops.size() - merged);
    ops = ops.first(merged);
    max_size = UINT64_MAX;  // runs merged into longer ops
  }
  if (space != nullptr) space->set_max_op_size(max_size);

  Duration deadline = options.deadline ? *options.deadline : engine_->options().default_deadline;
  auto state = std::make_shared<TransferState>(id, total, path_, Deadline::After(deadline));
  state->SetWaitSpin(engine_->options().wait_spin);
  if (op == Op::kWrite) {
    // A notification waits for the session's earlier writes still running.
    {
      MutexLock lock(&writes_mu_);
      if (wire || writes_.size() >= prune_at_) {
        // Drop the finished writes; a notification waits for the rest.
        size_t kept = 0;
        for (auto& w : writes_) {
          std::shared_ptr<TransferState> live = w.lock();
          if (!live || live->finished()) continue;
          if (wire) {
            inputs.push_back({live, "earlier write " + std::to_string(static_cast<uint64_t>(live->id())) +
                                        " of this session"});
          }
          writes_[kept++] = std::move(w);
        }
        writes_.resize(kept);
        prune_at_ = std::max<size_t>(64, 2 * kept);
      }
      writes_.push_back(state);
    }
  }
  // The notification leaves once every byte of the batch is in place at the target, every
  // earlier write of the session and every transfer of `after` has finished; the transfer
  // completes when the receiver has it.
  if (wire || !inputs.empty()) InstallAfterGate(state, std::move(inputs), notify_, std::move(wire));
  if (!ops.empty()) {
    Status posted = space != nullptr ? channel_->PostReserved(op, *space, ops, total, state)
                                     : channel_->Post(op, ops, total, state);
    if (!posted.ok()) state->Finish(std::move(posted));
  }
  state->PartDone(Status::Ok());  // the poster's own part
  return engine_->Issue(std::move(state), options.on_complete, options.after, series_, ops.size());
}

}  // namespace internal

namespace {
// An empty session's transfer: failed, its callback run at once.
Transfer NoSession(const TransferOptions& options) {
  const Status failed(Code::kFailedPrecondition, "empty session handle");
  if (options.on_complete) options.on_complete(failed);
  return internal::TransferAccess::Make(internal::TransferState::Failed(failed));
}
}  // namespace

Transfer Session::Post(Op op, std::span<const TransferOp> ops, const TransferOptions& options) const {
  if (!core_) return NoSession(options);
  return core_->Post(op, ops, options);
}

Transfer Session::Post(Op op, std::vector<TransferOp>&& ops, const TransferOptions& options) const {
  if (!core_) return NoSession(options);
  std::vector<TransferOp> owned = std::move(ops);
  return core_->PostOwned(op, owned, options);
}

Transfer Session::Write(uint64_t local_offset, uint64_t remote_offset, uint64_t bytes,
                        const TransferOptions& options) const {
  if (!core_) return NoSession(options);
  TransferOp op{local_offset, remote_offset, bytes};
  return core_->PostOwned(Op::kWrite, std::span<TransferOp>(&op, 1), options);
}

Transfer Session::Read(uint64_t local_offset, uint64_t remote_offset, uint64_t bytes,
                       const TransferOptions& options) const {
  if (!core_) return NoSession(options);
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
bool Session::connected() const { return core_ != nullptr && core_->connected(); }

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
