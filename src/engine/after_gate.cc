#include "engine/after_gate.h"

#include <utility>

#include "base/mutex.h"

namespace ferry::internal {
namespace {

// Counts the arrivals: one for the gated transfer's own data (its continuation), one for each
// input. The last one sends the notification (or fails the transfer).
class Gate {
 public:
  Gate(std::shared_ptr<Endpoint> endpoint, std::optional<std::string> wire, int arrivals)
      : endpoint_(std::move(endpoint)), wire_(std::move(wire)), left_(arrivals) {}

  // The gated transfer's continuation: its data is in place. Holds a part of it until the
  // notification is handed to the endpoint.
  void DataPlaced(const std::shared_ptr<TransferState>& gated) EXCLUDES(mu_) {
    gated->AddParts(1);
    {
      MutexLock lock(&mu_);
      gated_ = gated;
    }
    Arrive(Status::Ok());
  }
  void InputFinished(const Status& status, const std::string& what) EXCLUDES(mu_) {
    if (status.ok()) return Arrive(status);
    const std::string prefix = wire_ ? "notification not sent: " : "";
    Arrive(Status(status.code(), prefix + what + " failed: " + std::string(status.message())));
  }

 private:
  void Arrive(const Status& status) EXCLUDES(mu_) {
    std::shared_ptr<TransferState> gated;
    Status error;
    {
      MutexLock lock(&mu_);
      if (!status.ok() && error_.ok()) error_ = status;
      if (--left_ > 0) return;
      gated = std::move(gated_);
      error = error_;
    }
    if (!error.ok()) return gated->PartDone(error);
    if (wire_ && !gated->finished()) endpoint_->NotifyPart(std::move(*wire_), gated);
    gated->PartDone(Status::Ok());
  }

  const std::shared_ptr<Endpoint> endpoint_;
  std::optional<std::string> wire_;
  Mutex mu_;
  int left_ GUARDED_BY(mu_);
  Status error_ GUARDED_BY(mu_);
  std::shared_ptr<TransferState> gated_ GUARDED_BY(mu_);
};

}  // namespace

void InstallAfterGate(const std::shared_ptr<TransferState>& state, std::vector<GateInput> inputs,
                      std::shared_ptr<Endpoint> endpoint, std::optional<std::string> wire) {
  if (inputs.empty()) {
    if (!wire) return;
    state->SetContinuation([endpoint = std::move(endpoint), wire = std::move(*wire)](
                               const std::shared_ptr<TransferState>& s) { endpoint->NotifyPart(wire, s); });
    return;
  }
  auto gate = std::make_shared<Gate>(std::move(endpoint), std::move(wire), static_cast<int>(inputs.size()) + 1);
  state->SetContinuation([gate](const std::shared_ptr<TransferState>& s) { gate->DataPlaced(s); });
  for (GateInput& in : inputs)
    (void)in.state->OnFinish([gate, what = std::move(in.what)](const Status& st) { gate->InputFinished(st, what); });
}

}  // namespace ferry::internal
