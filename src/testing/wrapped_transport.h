// For engine tests: a transport that forwards everything to another one, except what a test
// changes (its capabilities, or the endpoints it hands out).
#pragma once

#include <memory>

#include "transport/transport.h"

namespace ferry::internal {

class WrappedTransport : public Transport {
 public:
  explicit WrappedTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Capabilities caps() const override { return inner_->caps(); }
  TransportData Describe() const override { return inner_->Describe(); }
  Result<TransportData> Register(const std::shared_ptr<Region>& r) override { return inner_->Register(r); }
  Status Deregister(const Region& r) override { return inner_->Deregister(r); }
  bool CanReach(const EngineDesc& peer) const override { return inner_->CanReach(peer); }
  Result<std::shared_ptr<Endpoint>> Connect(const EngineDesc& peer) override {
    FERRY_ASSIGN_OR_RETURN(auto ep, inner_->Connect(peer));
    return Wrap(std::move(ep));
  }

 protected:
  // The endpoint Connect() hands out for the inner transport's `ep`.
  virtual std::shared_ptr<Endpoint> Wrap(std::shared_ptr<Endpoint> ep) = 0;

 private:
  std::unique_ptr<Transport> inner_;
};

}  // namespace ferry::internal
