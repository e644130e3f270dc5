// For engine tests: the one test transport. It is the `local` transport with an Interposer
// between it and the engine: the interposer sees every batch posted, every notification, the
// capabilities declared and every deregistration, and forwards each by default. A test
// overrides only what it changes (holds batches, rewrites them, hides notifications, refuses a
// deregistration) and names the transport in its entries:
//
//   class Mute : public Interposer { ... };
//   const TransportEntry entries[] = {{"local", &MakeInterposedLocal<Mute>}};
//
// Each transport made gets its own interposer (default-constructed); state shared by the test
// and the interposer lives where the test can reach it (a global or a static).
//
// Thread safety: the transport, endpoints and channels are as thread-safe as `local`; the
// interposer's hooks run on the engine's threads and must be as safe as what they touch.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "transport/transport.h"

namespace ferry::internal {

Result<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx);

class Interposer {
 public:
  virtual ~Interposer() = default;
  virtual Capabilities Caps(Capabilities inner) const { return inner; }
  virtual Status Deregister(Transport& inner, const Region& r) { return inner.Deregister(r); }
  // A batch posted on a channel opened for `local`; `inner` is the `local` channel.
  virtual Status Post(Channel& inner, const std::shared_ptr<Region>& local, Op op,
                      std::span<const TransferOp> ops, uint64_t total_bytes,
                      const std::shared_ptr<TransferState>& state) {
    (void)local;
    return inner.Post(op, ops, total_bytes, state);
  }
  // Storage for a large batch's ops (Channel::ReserveOps): none unless an interposer offers some.
  virtual std::unique_ptr<OpSpace> ReserveOps(Channel& /*inner*/, Op /*op*/, size_t /*n*/) { return nullptr; }
  // A batch checked into the storage ReserveOps gave.
  virtual Status PostReserved(Channel& inner, const std::shared_ptr<Region>& local, Op op, OpSpace& /*space*/,
                              std::span<const TransferOp> ops, uint64_t total_bytes,
                              const std::shared_ptr<TransferState>& state) {
    return Post(inner, local, op, ops, total_bytes, state);
  }
  virtual Status Notify(Endpoint& inner, std::string_view m) { return inner.Notify(m); }
  virtual void NotifyPart(Endpoint& inner, std::string m, const std::shared_ptr<TransferState>& s) {
    inner.NotifyPart(std::move(m), s);
  }
};

// A `local` channel whose batches go through the interposer.
class InterposedChannel final : public Channel {
 public:
  InterposedChannel(std::unique_ptr<Channel> inner, std::shared_ptr<Region> local, std::shared_ptr<Interposer> via)
      : inner_(std::move(inner)), local_(std::move(local)), via_(std::move(via)) {}
  Status Post(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
              const std::shared_ptr<TransferState>& state) override {
    return via_->Post(*inner_, local_, op, ops, total_bytes, state);
  }
  std::unique_ptr<OpSpace> ReserveOps(Op op, size_t n) override { return via_->ReserveOps(*inner_, op, n); }
  Status PostReserved(Op op, OpSpace& space, std::span<const TransferOp> ops, uint64_t total_bytes,
                      const std::shared_ptr<TransferState>& state) override {
    return via_->PostReserved(*inner_, local_, op, space, ops, total_bytes, state);
  }
  TransferPath path() const override { return inner_->path(); }

 private:
  std::unique_ptr<Channel> inner_;
  std::shared_ptr<Region> local_;
  std::shared_ptr<Interposer> via_;
};

// A `local` endpoint whose channels and notifications go through the interposer.
class InterposedEndpoint final : public Endpoint {
 public:
  InterposedEndpoint(std::shared_ptr<Endpoint> inner, std::shared_ptr<Interposer> via)
      : inner_(std::move(inner)), via_(std::move(via)) {}
  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local, const MemoryDesc& remote) override {
    FERRY_ASSIGN_OR_RETURN(auto ch, inner_->OpenChannel(local, remote));
    return std::unique_ptr<Channel>(new InterposedChannel(std::move(ch), local, via_));
  }
  Status Notify(std::string_view m) override { return via_->Notify(*inner_, m); }
  void NotifyPart(std::string m, const std::shared_ptr<TransferState>& s) override {
    via_->NotifyPart(*inner_, std::move(m), s);
  }
  bool healthy() const override { return inner_->healthy(); }

 private:
  std::shared_ptr<Endpoint> inner_;
  std::shared_ptr<Interposer> via_;
};

// The `local` transport, with its capabilities, deregistrations and endpoints through the
// interposer.
class InterposedTransport final : public Transport {
 public:
  InterposedTransport(std::unique_ptr<Transport> inner, std::shared_ptr<Interposer> via)
      : inner_(std::move(inner)), via_(std::move(via)) {}
  std::string_view name() const override { return inner_->name(); }
  Capabilities caps() const override { return via_->Caps(inner_->caps()); }
  TransportData Describe() const override { return inner_->Describe(); }
  Result<TransportData> Register(const std::shared_ptr<Region>& r) override { return inner_->Register(r); }
  Status Deregister(const Region& r) override { return via_->Deregister(*inner_, r); }
  bool CanReach(const EngineDesc& peer) const override { return inner_->CanReach(peer); }
  Result<std::shared_ptr<Endpoint>> Connect(const EngineDesc& peer) override {
    FERRY_ASSIGN_OR_RETURN(auto ep, inner_->Connect(peer));
    return std::shared_ptr<Endpoint>(std::make_shared<InterposedEndpoint>(std::move(ep), via_));
  }

 private:
  std::unique_ptr<Transport> inner_;
  std::shared_ptr<Interposer> via_;
};

// A TransportFactory: `local` behind a new I.
template <typename I>
Result<std::unique_ptr<Transport>> MakeInterposedLocal(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto inner, MakeLocalTransport(ctx));
  return std::unique_ptr<Transport>(new InterposedTransport(std::move(inner), std::make_shared<I>()));
}

}  // namespace ferry::internal
