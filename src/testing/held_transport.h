// For engine tests: the `local` transport behind an interposer (testing/wrapped_transport.h)
// that holds every posted batch until the test releases it (HeldBatches), so that batches complete in the order the test chooses,
// or fail, or never complete. Notifications pass through at once.
//
//   const TransportEntry entries[] = {{"local", &MakeHeldLocalTransport}};
//   auto engine = EngineCore::Create(options, entries);
//   ... post ...; HeldBatches::Get().Release(1); HeldBatches::Get().Release(0, failure);
//
// Thread safety: HeldBatches may be used from any thread. It is one per process: a test that
// uses it clears it at its end (Clear()), which drops the batches still held (their transfers
// then end unfinished, kAborted).
#pragma once

#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "testing/wrapped_transport.h"

namespace ferry::internal {

class HeldBatches {
 public:
  static HeldBatches& Get() {
    static HeldBatches* held = new HeldBatches();
    return *held;
  }
  size_t count() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return held_.size();
  }
  // Runs the i-th batch still held (in posting order), or fails it with `fail`. False when
  // fewer are held.
  bool Release(size_t i, Status fail = Status::Ok()) EXCLUDES(mu_) {
    Batch b;
    {
      MutexLock lock(&mu_);
      if (i >= held_.size()) return false;
      b = std::move(held_[i]);
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (fail.ok()) {
      Status s = b.inner->Post(b.op, b.ops, b.total, b.state);
      if (!s.ok()) b.state->Finish(s);
    }
    b.state->PartDone(fail);  // the part the holding interposer took
    return true;
  }
  void Clear() EXCLUDES(mu_) {
    std::deque<Batch> gone;
    MutexLock lock(&mu_);
    gone.swap(held_);
  }

 private:
  friend class HoldBatches;
  struct Batch {
    Channel* inner = nullptr;
    Op op = Op::kWrite;
    std::vector<TransferOp> ops;
    uint64_t total = 0;
    std::shared_ptr<TransferState> state;
  };
  void Hold(Batch b) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    held_.push_back(std::move(b));
  }
  Mutex mu_;
  std::deque<Batch> held_ GUARDED_BY(mu_);
};

// Takes a part of each batch's transfer and keeps the batch in HeldBatches.
class HoldBatches final : public Interposer {
 public:
  Status Post(Channel& inner, const std::shared_ptr<Region>&, Op op, std::span<const TransferOp> ops,
              uint64_t total_bytes, const std::shared_ptr<TransferState>& state) override {
    state->AddParts(1);
    HeldBatches::Get().Hold({&inner, op, std::vector<TransferOp>(ops.begin(), ops.end()), total_bytes, state});
    return Status::Ok();
  }
};

inline Result<std::unique_ptr<Transport>> MakeHeldLocalTransport(const TransportContext& ctx) {
  return MakeInterposedLocal<HoldBatches>(ctx);
}

}  // namespace ferry::internal
