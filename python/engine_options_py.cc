// EngineOptions and Python: the FERRY_* variables as Engine()'s keyword arguments, and the
// conversions of the options that are not plain numbers.
#include <pybind11/stl.h>

#include <chrono>
#include <string>

#include "binding.h"
#include "ferry/options.h"

namespace ferry::python {

std::chrono::milliseconds MsOption(double ms, const char* name) {
  Duration d = Millis(ms, name);
  auto out = std::chrono::duration_cast<std::chrono::milliseconds>(d);
  if (d > Duration::zero() && out < d) out += std::chrono::milliseconds(1);
  return out;
}

UcxOptions::Progress ParseProgress(const std::string& s) {
  if (s == "polling") return UcxOptions::Progress::kPolling;
  if (s == "event") return UcxOptions::Progress::kEvent;
  if (s == "shared") return UcxOptions::Progress::kShared;
  ThrowInvalid("progress must be 'polling', 'event' or 'shared', not '" + s + "'");
}

UcxOptions::Rma ParseRma(const std::string& s) {
  if (s == "auto") return UcxOptions::Rma::kAuto;
  if (s == "always") return UcxOptions::Rma::kAlways;
  if (s == "never") return UcxOptions::Rma::kNever;
  ThrowInvalid("rma must be 'auto', 'always' or 'never', not '" + s + "'");
}

// EngineOptions::FromEnv() as Engine()'s keyword arguments (ferry/__init__.py lays the
// caller's keyword arguments over them).
py::dict EnvEngineKwargs() {
  const EngineOptions o = Unwrap(EngineOptions::FromEnv());
  py::dict k;
  k["key"] = o.key;
  k["default_deadline_ms"] = Ms(o.default_deadline);
  k["deregister_timeout_ms"] = o.deregister_timeout ? py::object(py::float_(Ms(*o.deregister_timeout))) : py::none();
  k["wait_spin_ms"] = Ms(o.wait_spin);
  k["copy_threads"] = o.copy_threads;
  k["parallel_copy_bytes"] = o.parallel_copy_bytes;
  k["pin_host_memory"] = o.pin_host_memory;
  k["merge_adjacent_ops"] = o.merge_adjacent_ops;
  k["transports"] = o.transports;
  k["max_notification_bytes"] = o.max_notification_bytes;
  k["max_pending_notifications"] = o.max_pending_notifications;
  k["max_pending_notification_bytes"] = o.max_pending_notification_bytes;
  k["max_pending_notifications_per_peer"] = o.max_pending_notifications_per_peer;
  k["shm_max_connections"] = o.shm.max_connections;
  k["shm_allowed_uids"] = o.shm.allowed_uids;
  k["metrics_port"] = o.metrics_port;
  k["secret"] = o.secret;
  k["secret_file"] = o.secret_file;
  k["listen_host"] = o.ucx.listen_host;
  k["listen_port"] = o.ucx.listen_port;
  k["max_pending_handshakes"] = o.ucx.max_pending_handshakes;
  k["max_connections"] = o.ucx.max_connections;
  k["handshake_timeout_ms"] = Ms(o.ucx.handshake_timeout);
  k["lanes"] = o.ucx.lanes;
  k["workers"] = o.ucx.workers;
  k["post_batch"] = o.ucx.post_batch;
  k["progress"] = o.ucx.progress == UcxOptions::Progress::kPolling ? "polling"
                  : o.ucx.progress == UcxOptions::Progress::kEvent ? "event" : "shared";
  k["rma"] = o.ucx.rma == UcxOptions::Rma::kAuto ? "auto" : o.ucx.rma == UcxOptions::Rma::kAlways ? "always" : "never";
  k["max_am_bytes"] = o.ucx.max_am_bytes;
  k["connect_timeout_ms"] = Ms(o.ucx.connect_timeout);
  k["revoke_timeout_ms"] = Ms(o.shm.revoke_timeout);
  k["call_timeout_ms"] = Ms(o.shm.call_timeout);
  return k;
}

double Ms(Duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace ferry::python
