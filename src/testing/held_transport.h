// For engine tests: the `local` transport behind channels that hold every posted batch until
// the test releases it (HeldBatches), so that batches complete in the order the test chooses,
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
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "testing/wrapped_transport.h"

namespace ferry::internal {

Result<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx);

class HeldBatches {
 public:
  static HeldBatches& Get() {
    static HeldBatches* held = new HeldBatches();
    return *held;
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  // Runs the i-th batch still held (in posting order), or fails it with `fail`. False when
  // fewer are held.
  bool Release(size_t i, Status fail = Status::Ok()) {
    Batch b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (i >= held_.size()) return false;
      b = std::move(held_[i]);
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (fail.ok()) {
      Status s = b.inner->Post(b.op, b.ops, b.total, b.state);
      if (!s.ok()) b.state->Finish(s);
    }
    b.state->PartDone(fail);  // the part the holding channel took
    return true;
  }
  void Clear() {
    std::deque<Batch> gone;
    std::lock_guard<std::mutex> lock(mu_);
    gone.swap(held_);
  }

 private:
  friend class HeldChannel;
  struct Batch {
    Channel* inner = nullptr;
    Op op = Op::kWrite;
    std::vector<TransferOp> ops;
    uint64_t total = 0;
    std::shared_ptr<TransferState> state;
  };
  void Hold(Batch b) {
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back(std::move(b));
  }
  std::mutex mu_;
  std::deque<Batch> held_;  // GUARDED_BY(mu_)
};

class HeldChannel final : public Channel {
 public:
  explicit HeldChannel(std::unique_ptr<Channel> inner) : inner_(std::move(inner)) {}
  Status Post(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
              const std::shared_ptr<TransferState>& state) override {
    state->AddParts(1);
    HeldBatches::Get().Hold({inner_.get(), op, std::vector<TransferOp>(ops.begin(), ops.end()), total_bytes, state});
    return Status::Ok();
  }
  TransferPath path() const override { return inner_->path(); }

 private:
  std::unique_ptr<Channel> inner_;
};

class HeldEndpoint final : public Endpoint {
 public:
  explicit HeldEndpoint(std::shared_ptr<Endpoint> inner) : inner_(std::move(inner)) {}
  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local, const MemoryDesc& remote) override {
    FERRY_ASSIGN_OR_RETURN(auto ch, inner_->OpenChannel(local, remote));
    return std::unique_ptr<Channel>(new HeldChannel(std::move(ch)));
  }
  Status Notify(std::string_view m) override { return inner_->Notify(m); }
  void NotifyPart(std::string m, const std::shared_ptr<TransferState>& s) override { inner_->NotifyPart(std::move(m), s); }

 private:
  std::shared_ptr<Endpoint> inner_;
};

class HeldTransport final : public WrappedTransport {
 public:
  using WrappedTransport::WrappedTransport;

 protected:
  std::shared_ptr<Endpoint> Wrap(std::shared_ptr<Endpoint> ep) override { return std::make_shared<HeldEndpoint>(std::move(ep)); }
};

inline Result<std::unique_ptr<Transport>> MakeHeldLocalTransport(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto inner, MakeLocalTransport(ctx));
  return std::unique_ptr<Transport>(new HeldTransport(std::move(inner)));
}

}  // namespace ferry::internal
