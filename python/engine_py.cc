// ferry.Engine: a ferry::Engine plus the Python objects whose memory it borrows.
//
// Buffers lent to an engine through register_memory() are held (as memoryviews, or as the
// caller's `owner` object) until deregistration succeeds or the engine is gone, so Python
// cannot free memory that a transfer may still touch. Calls that can block release the GIL.
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "binding.h"
#include "ferry/log.h"

namespace ferry::python {
namespace {

// The Python-side Engine: a ferry::Engine plus the Python objects whose memory it borrows.
class PyEngine {
 public:
  explicit PyEngine(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}

  ~PyEngine() {  // the GIL is held
    if (Finalizing()) {
      engine_.reset();
    } else {
      ShutDown();
    }
    owners_.clear();
  }

  // The engine, for one call; raises ABORTED once closed. Call with the GIL held.
  std::shared_ptr<Engine> engine() const {
    if (!engine_) Throw(Status(Code::kAborted, "the engine was closed"));
    return engine_;
  }

  // Destroys the engine (ending its sessions and transfers), then releases borrowed buffers.
  void Close() {
    std::weak_ptr<Engine> weak = engine_;
    ShutDown();
    // A call still running on another thread holds the engine; its buffers wait for ~PyEngine.
    if (weak.expired()) owners_.clear();
  }
  bool closed() const { return engine_ == nullptr; }

  MemoryDesc RegisterBuffer(const py::buffer& obj, std::vector<std::string> allowed_peers) {
    auto e = engine();
    py::object view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(obj.ptr()));
    if (!view) throw py::error_already_set();
    const Py_buffer* b = PyMemoryView_GET_BUFFER(view.ptr());
    if (b->readonly) ThrowInvalid("register_memory needs a writable buffer");
    if (!PyBuffer_IsContiguous(b, 'C')) ThrowInvalid("register_memory needs a C-contiguous buffer");
    void* ptr = b->buf;
    uint64_t size = static_cast<uint64_t>(b->len);
    MemoryDesc desc;
    {
      py::gil_scoped_release nogil;
      desc = Unwrap(e->RegisterMemory(ptr, size, MemoryKind::kHost, -1, RegionOptions{std::move(allowed_peers)}));
    }
    owners_[static_cast<uint64_t>(desc.region)] = std::move(view);
    return desc;
  }

  MemoryDesc RegisterPointer(uint64_t ptr, uint64_t size, const std::string& kind, int device,
                             py::object owner, std::vector<std::string> allowed_peers) {
    auto e = engine();
    MemoryKind k = ParseKind(kind);
    MemoryDesc desc;
    {
      py::gil_scoped_release nogil;
      desc = Unwrap(e->RegisterMemory(reinterpret_cast<void*>(ptr), size, k, device,
                                      RegionOptions{std::move(allowed_peers)}));
    }
    if (!owner.is_none()) owners_[static_cast<uint64_t>(desc.region)] = std::move(owner);
    return desc;
  }

  void Deregister(uint64_t region) {
    auto e = engine();
    Status s;
    {
      py::gil_scoped_release nogil;
      s = e->DeregisterMemory(static_cast<RegionId>(region));
    }
    // On failure (e.g. a transfer outlived the deadline) the buffer stays held.
    Check(s);
    owners_.erase(region);
  }

  size_t held_buffers() const { return owners_.size(); }

 private:
  void ShutDown() {
    std::shared_ptr<Engine> e = std::move(engine_);
    py::gil_scoped_release nogil;
    e.reset();  // ~Engine waits for transfers on its regions to end
  }

  std::shared_ptr<Engine> engine_;
  std::unordered_map<uint64_t, py::object> owners_;  // region id -> memoryview or owner
};

// A notification's bytes: bytes-like, or str sent as UTF-8.
std::string MessageBytes(const py::object& message) {
  return PyUnicode_Check(message.ptr()) ? message.cast<std::string>() : BytesOf(message, "message");
}

// Runs `f` with the GIL released on the engine of `self`.
template <typename F>
auto Call(const PyEngine& self, F&& f) {
  auto e = self.engine();
  py::gil_scoped_release nogil;
  return f(*e);
}

// An integer option, range-checked for its C++ field. Errors here are INVALID_ARGUMENT naming the
// field (ferry.InvalidArgumentError, a ValueError), as the engine's own range checks are.
template <typename T>
T IntOption(int64_t v, const char* name, int64_t lo = 0) {
  const int64_t hi = static_cast<int64_t>(std::min<uint64_t>(std::numeric_limits<T>::max(), INT64_MAX));
  if (v < lo || v > hi)
    ThrowInvalid(std::string(name) + " must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", not " +
                 std::to_string(v));
  return static_cast<T>(v);
}

// Every EngineOptions field, by its Python name (the ucx and shm fields without a prefix).
std::unique_ptr<PyEngine> MakeEngine(
    std::string key, double default_deadline_ms, std::optional<double> deregister_timeout_ms,
    int64_t copy_threads, int64_t parallel_copy_bytes, bool pin_host_memory, bool merge_adjacent_ops,
    std::vector<std::string> transports, int64_t max_notification_bytes, int64_t max_pending_notifications,
    int64_t max_pending_notification_bytes, std::string listen_host, int64_t listen_port,
    int64_t max_pending_handshakes, int64_t max_connections, double handshake_timeout_ms, int64_t lanes,
    int64_t workers, int64_t post_batch, const std::string& progress, const std::string& rma,
    int64_t max_am_bytes, double connect_timeout_ms, double revoke_timeout_ms, double call_timeout_ms,
    int64_t metrics_port, std::string secret, std::string secret_file,
    int64_t max_pending_notifications_per_peer, int64_t shm_max_connections,
    std::vector<int64_t> shm_allowed_uids, double wait_spin_ms) {
  EngineOptions o;
  o.secret = std::move(secret);
  o.secret_file = std::move(secret_file);
  o.key = std::move(key);
  o.default_deadline = Millis(default_deadline_ms, "default_deadline_ms");
  if (deregister_timeout_ms) o.deregister_timeout = Millis(*deregister_timeout_ms, "deregister_timeout_ms");
  o.wait_spin = Millis(wait_spin_ms, "wait_spin_ms");
  o.copy_threads = IntOption<int>(copy_threads, "copy_threads");
  o.parallel_copy_bytes = IntOption<uint64_t>(parallel_copy_bytes, "parallel_copy_bytes");
  o.pin_host_memory = pin_host_memory;
  o.merge_adjacent_ops = merge_adjacent_ops;
  o.transports = std::move(transports);
  o.max_notification_bytes = IntOption<size_t>(max_notification_bytes, "max_notification_bytes");
  o.max_pending_notifications = IntOption<size_t>(max_pending_notifications, "max_pending_notifications");
  o.max_pending_notification_bytes = IntOption<size_t>(max_pending_notification_bytes, "max_pending_notification_bytes");
  o.max_pending_notifications_per_peer =
      IntOption<size_t>(max_pending_notifications_per_peer, "max_pending_notifications_per_peer");
  o.shm.max_connections = IntOption<size_t>(shm_max_connections, "shm_max_connections");
  for (int64_t uid : shm_allowed_uids) {
    if (uid < 0 || uid >= int64_t{UINT32_MAX}) ThrowInvalid("shm_allowed_uids: " + std::to_string(uid) + " is not a user id");
    o.shm.allowed_uids.push_back(static_cast<uint32_t>(uid));
  }
  o.ucx.listen_host = std::move(listen_host);
  o.ucx.listen_port = IntOption<uint16_t>(listen_port, "listen_port");
  o.ucx.max_pending_handshakes = IntOption<size_t>(max_pending_handshakes, "max_pending_handshakes");
  o.ucx.max_connections = IntOption<size_t>(max_connections, "max_connections");
  o.ucx.handshake_timeout = MsOption(handshake_timeout_ms, "handshake_timeout_ms");
  o.ucx.lanes = IntOption<int>(lanes, "lanes");
  o.ucx.workers = IntOption<int>(workers, "workers");
  o.ucx.post_batch = IntOption<int>(post_batch, "post_batch");
  o.ucx.progress = ParseProgress(progress);
  o.ucx.rma = ParseRma(rma);
  o.ucx.max_am_bytes = IntOption<uint64_t>(max_am_bytes, "max_am_bytes");
  o.ucx.connect_timeout = MsOption(connect_timeout_ms, "connect_timeout_ms");
  o.shm.revoke_timeout = MsOption(revoke_timeout_ms, "revoke_timeout_ms");
  o.shm.call_timeout = MsOption(call_timeout_ms, "call_timeout_ms");
  if (metrics_port < -1 || metrics_port > 65535)
    ThrowInvalid("metrics_port must be in -1..65535 (0: off, -1: a free port), not " + std::to_string(metrics_port));
  o.metrics_port = static_cast<int>(metrics_port);
  Result<std::unique_ptr<Engine>> engine = [&] {
    py::gil_scoped_release nogil;
    return Engine::Create(o);
  }();
  return std::make_unique<PyEngine>(Unwrap(std::move(engine)));
}

}  // namespace

std::shared_ptr<Engine> EngineOf(const py::handle& obj) {
  if (!py::isinstance<PyEngine>(obj)) throw py::type_error("expected a ferry.Engine");
  return obj.cast<const PyEngine&>().engine();
}

void BindEngine(py::module_& m) {
  BindLog(m);
  m.def("_env_engine_kwargs", &EnvEngineKwargs,
        "Engine()'s keyword arguments from the FERRY_* variables (docs/configuration.md).");
  m.def(
      "_set_invalid_argument_class", [](py::object cls) { InvalidArgumentClass() = std::move(cls); },
      "Sets the class raised for INVALID_ARGUMENT (called by ferry/__init__.py).");
  EngineOptions d;
  py::class_<PyEngine>(
      m, "Engine",
      "ferry's transfer engine: registered memory, peers, sessions.\n\n"
      "Engine(key='', default_deadline_ms=30000, copy_threads=0, ...) takes every field of the\n"
      "C++ EngineOptions (ferry/options.h) by keyword: key, default_deadline_ms,\n"
      "deregister_timeout_ms, wait_spin_ms, copy_threads, parallel_copy_bytes, pin_host_memory,\n"
      "merge_adjacent_ops, transports (names), max_notification_bytes,\n"
      "max_pending_notifications, max_pending_notification_bytes,\n"
      "max_pending_notifications_per_peer; the ucx transport's\n"
      "listen_host, listen_port (default 127.0.0.1, this host only; '0.0.0.0' for every\n"
      "interface), max_pending_handshakes, max_connections, handshake_timeout_ms, lanes,\n"
      "workers, post_batch, progress ('polling'|'event'|'shared'), rma ('auto'|'always'|\n"
      "'never'), max_am_bytes, connect_timeout_ms; the shm transport's revoke_timeout_ms,\n"
      "call_timeout_ms, shm_max_connections and shm_allowed_uids (users besides this one whose\n"
      "processes may connect; empty: the same user only); metrics_port (0 off, -1 a free port: an HTTP GET /metrics endpoint on\n"
      "127.0.0.1, see metrics_port_in_use); secret or secret_file (the deployment's shared\n"
      "secret, 16+ bytes: peers over ucx must prove they hold it). A value out of range raises ferry.InvalidArgumentError (a ValueError\n"
      "and a ferry.Error with code INVALID_ARGUMENT) naming the field; RESOURCE_EXHAUSTED when a\n"
      "thread cannot start. Use as a context manager or call close() to shut it down before it\n"
      "is garbage-collected.")
      .def(py::init(&MakeEngine), py::kw_only(), py::arg("key") = d.key,
           py::arg("default_deadline_ms") = Ms(d.default_deadline),
           py::arg("deregister_timeout_ms") = py::none(), py::arg("copy_threads") = d.copy_threads,
           py::arg("parallel_copy_bytes") = d.parallel_copy_bytes,
           py::arg("pin_host_memory") = d.pin_host_memory,
           py::arg("merge_adjacent_ops") = d.merge_adjacent_ops, py::arg("transports") = d.transports,
           py::arg("max_notification_bytes") = d.max_notification_bytes,
           py::arg("max_pending_notifications") = d.max_pending_notifications,
           py::arg("max_pending_notification_bytes") = d.max_pending_notification_bytes,
           py::arg("listen_host") = d.ucx.listen_host, py::arg("listen_port") = d.ucx.listen_port,
           py::arg("max_pending_handshakes") = d.ucx.max_pending_handshakes,
           py::arg("max_connections") = d.ucx.max_connections,
           py::arg("handshake_timeout_ms") = Ms(d.ucx.handshake_timeout), py::arg("lanes") = d.ucx.lanes,
           py::arg("workers") = d.ucx.workers, py::arg("post_batch") = d.ucx.post_batch,
           py::arg("progress") = "event", py::arg("rma") = "auto",
           py::arg("max_am_bytes") = d.ucx.max_am_bytes,
           py::arg("connect_timeout_ms") = Ms(d.ucx.connect_timeout),
           py::arg("revoke_timeout_ms") = Ms(d.shm.revoke_timeout),
           py::arg("call_timeout_ms") = Ms(d.shm.call_timeout), py::arg("metrics_port") = d.metrics_port,
           py::arg("secret") = "", py::arg("secret_file") = "",
           py::arg("max_pending_notifications_per_peer") = d.max_pending_notifications_per_peer,
           py::arg("shm_max_connections") = d.shm.max_connections,
           py::arg("shm_allowed_uids") = std::vector<int64_t>{}, py::arg("wait_spin_ms") = Ms(d.wait_spin))
      .def_property_readonly(
          "key", [](const PyEngine& s) { return Call(s, [](Engine& e) { return e.key(); }); },
          "Unique key of this engine.")
      .def_property_readonly(
          "transports",
          [](const PyEngine& s) { return Call(s, [](Engine& e) { return e.transports(); }); },
          "Names of the transports this engine started.")
      .def_property_readonly("closed", &PyEngine::closed)
      .def(
          "describe",
          [](const PyEngine& s) { return Call(s, [](Engine& e) { return e.Describe(); }); },
          "This engine's EngineDesc, to hand to peers.")
      .def("register_memory", &PyEngine::RegisterPointer, py::arg("ptr"), py::arg("size"),
           py::kw_only(), py::arg("kind") = "host", py::arg("device") = -1,
           py::arg("owner") = py::none(), py::arg("allowed_peers") = std::vector<std::string>{},
           "Registers [ptr, ptr + size) of host (kind=\"host\") or CUDA memory (kind=\"cuda\",\n"
           "device=ordinal). The memory must stay valid until deregistered; pass `owner` to keep\n"
           "an object alive that long. `allowed_peers`: engine keys of the only peers that may\n"
           "reach the region (empty: every peer); others are refused with PERMISSION_DENIED.\n"
           "Returns a MemoryDesc.")
      .def("register_memory", &PyEngine::RegisterBuffer, py::arg("buffer"), py::kw_only(),
           py::arg("allowed_peers") = std::vector<std::string>{},
           "Registers the memory of a writable, C-contiguous buffer (a numpy array, bytearray,\n"
           "...) as host memory; the buffer is held until deregistered. `allowed_peers`: engine\n"
           "keys of the only peers that may reach the region (empty: every peer). Returns a\n"
           "MemoryDesc.")
      .def(
          "deregister_memory",
          [](PyEngine& s, const MemoryDesc& d) { s.Deregister(static_cast<uint64_t>(d.region)); },
          py::arg("desc"),
          "Waits for transfers on the region to end, then deregisters it (later transfers on it\n"
          "fail with FAILED_PRECONDITION) and releases the buffer. Raises DEADLINE_EXCEEDED if a\n"
          "transfer still uses it then (e.g. one waiting on a stopped peer): the region stays\n"
          "registered, retiring, with its buffer held, and a later call retries and frees it.")
      .def("deregister_memory", &PyEngine::Deregister, py::arg("region"))
      .def(
          "add_peer",
          [](const PyEngine& s, const EngineDesc& peer) {
            Check(Call(s, [&](Engine& e) { return e.AddPeer(peer); }));
          },
          py::arg("peer"), "Adds (or replaces) a peer, from an EngineDesc or its packed bytes.")
      .def(
          "add_peer",
          [](const PyEngine& s, const py::buffer& packed) {
            EngineDesc peer = Unwrap(EngineDesc::Unpack(BytesOf(packed, "peer")));
            Check(Call(s, [&](Engine& e) { return e.AddPeer(peer); }));
          },
          py::arg("peer"))
      .def(
          "remove_peer",
          [](const PyEngine& s, const std::string& key) {
            Check(Call(s, [&](Engine& e) { return e.RemovePeer(key); }));
          },
          py::arg("key"), "Forgets a peer by key.")
      .def(
          "fence_peer",
          [](const PyEngine& s, const std::string& key, double timeout_s) {
            auto t = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(timeout_s));
            Check(Call(s, [&](Engine& e) { return e.FencePeer(key, t); }));
          },
          py::arg("key"), py::arg("timeout_s") = 1.0,
          "Ends the connections peer `key` made to this engine, so nothing it sent before the call\n"
          "lands here afterwards (what a consumer does before reusing blocks a silent producer may\n"
          "still write). Raises ferry.Error DEADLINE_EXCEEDED when writes were still landing at\n"
          "the timeout (call again later).")
      .def(
          "open_session",
          [](const PyEngine& s, const MemoryDesc& local, const MemoryDesc& remote) {
            return Unwrap(Call(s, [&](Engine& e) { return e.OpenSession(local, remote); }));
          },
          py::arg("local"), py::arg("remote"),
          "A Session from a local region of this engine to a region of a peer (or of this\n"
          "engine), over the fastest transport both can use.")
      .def(
          "allocate_transfer_id",
          [](const PyEngine& s) {
            return static_cast<uint64_t>(Call(s, [](Engine& e) { return e.AllocateTransferId(); }));
          },
          "A fresh transfer id, to pass as transfer_id=.")
      .def(
          "notify",
          [](const PyEngine& s, const std::string& peer_key, const py::object& message,
             const std::string& topic) {
            std::string bytes = MessageBytes(message);
            Check(Call(s, [&](Engine& e) { return e.Notify(peer_key, bytes, topic); }));
          },
          py::arg("peer_key"), py::arg("message"), py::kw_only(), py::arg("topic") = "",
          "Sends a small message (bytes, or str sent as UTF-8) to a peer or to this engine, on\n"
          "`topic` (at most 64 bytes; '' is the application's): the receiver's\n"
          "pop_notifications(topic) returns it, no other topic's.")
      .def(
          "notify_after",
          [](const PyEngine& s, const std::string& peer_key, const py::object& message,
             const std::vector<Transfer>& after, const std::string& topic,
             std::optional<double> deadline_ms, std::optional<uint64_t> transfer_id,
             const py::object& on_complete) {
            TransferOptions o;
            o.notification_topic = topic;
            if (deadline_ms) o.deadline = Millis(*deadline_ms, "deadline_ms");
            if (transfer_id) o.id = static_cast<TransferId>(*transfer_id);
            o.on_complete = CompletionCallback(on_complete);
            std::string bytes = MessageBytes(message);
            return Call(s, [&](Engine& e) { return e.NotifyAfter(peer_key, bytes, after, o); });
          },
          py::arg("peer_key"), py::arg("message"), py::arg("after"), py::kw_only(),
          py::arg("topic") = "", py::arg("deadline_ms") = py::none(),
          py::arg("transfer_id") = py::none(), py::arg("on_complete") = py::none(),
          "Returns a Transfer that sends `message` to the peer once every transfer in `after`\n"
          "(of any sessions of this engine, e.g. one per KV layer) finished OK. If one failed,\n"
          "nothing is sent and the returned transfer fails with its error. on_complete as for\n"
          "Session.write().")
      .def(
          "pop_notifications",
          [](const PyEngine& s, const std::string& topic) {
            auto got = Call(s, [&](Engine& e) { return e.PopNotifications(topic); });
            py::list out;
            for (auto& n : got) out.append(py::make_tuple(n.from, py::bytes(n.message)));
            return out;
          },
          py::kw_only(), py::arg("topic") = "",
          "Takes every notification of `topic` ('' by default: the application's) received so\n"
          "far: a list of (from_key, bytes). Other topics' notifications stay for their owners.")
      .def(
          "stats",
          [](const PyEngine& s) {
            auto st = Call(s, [](Engine& e) { return e.stats(); });
            py::dict out;
            out["rejected_messages"] = st.rejected_messages;
            out["auth_failures"] = st.auth_failures;
            out["access_denied"] = st.access_denied;
            out["connections_refused"] = st.connections_refused;
            out["dropped_notifications"] = st.dropped_notifications;
            out["merged_ops"] = st.merged_ops;
            out["gpu_kernel_launches"] = st.gpu_kernel_launches;
            out["gpu_kernel_pieces"] = st.gpu_kernel_pieces;
            out["gpu_dma_calls"] = st.gpu_dma_calls;
            out["gpu_dma_copies"] = st.gpu_dma_copies;
            return out;
          },
          "Counters: {'rejected_messages': malformed or out-of-bounds messages from peers,\n"
          "'auth_failures': connections refused for want of a proof of the secret,\n"
          "'access_denied': requests for a region by a peer not on its access list,\n"
          "'connections_refused': connections refused for want of room (max_connections, pending\n"
          "handshakes),\n"
          "'dropped_notifications': notifications refused here (backlog full, too big),\n"
          "'merged_ops': ops of posted batches that travelled as part of the op before them,\n"
          "'gpu_kernel_launches', 'gpu_kernel_pieces', 'gpu_dma_calls', 'gpu_dma_copies': the GPU\n"
          "copies the engine enqueued: copy kernel launches and their pieces, DMA calls and their copies}.")
      .def(
          "metrics",
          [](const PyEngine& s, const std::string& format) -> py::object {
            MetricsSnapshot m = Call(s, [](Engine& e) { return e.Metrics(); });
            if (format == "prometheus") return py::str(RenderPrometheus(m));
            if (format != "dict") ThrowInvalid("format must be 'dict' or 'prometheus', not '" + format + "'");
            py::list series;
            for (const SeriesSnapshot& x : m.series) {
              py::dict d, hist;
              d["kind"] = x.kind;
              d["transport"] = x.transport;
              d["peer"] = x.peer;
              d["results"] = x.results;
              d["bytes"] = x.bytes;
              d["ops"] = x.ops;
              hist["bounds_seconds"] = x.latency.bounds_seconds;
              hist["counts"] = x.latency.counts;
              hist["count"] = x.latency.count;
              hist["sum_seconds"] = x.latency.sum_seconds;
              d["latency"] = hist;
              series.append(d);
            }
            py::dict out;
            out["engine"] = m.engine;
            out["series"] = series;
            out["failures"] = m.failures;
            out["transfers_in_flight"] = m.transfers_in_flight;
            out["peers"] = m.peers;
            out["registered_regions"] = m.registered_regions;
            out["registered_bytes"] = m.registered_bytes;
            out["dropped_notifications"] = m.dropped_notifications;
            out["rejected_messages"] = m.rejected_messages;
            out["auth_failures"] = m.auth_failures;
            out["access_denied"] = m.access_denied;
            out["connections_refused"] = m.connections_refused;
            return out;
          },
          py::kw_only(), py::arg("format") = "dict",
          "Counters, latency histograms and gauges (ferry/metrics.h). format='dict': {'engine',\n"
          "'series': [{'kind': 'transfer'|'notification', 'transport', 'peer', 'results': {code\n"
          "name: count}, 'bytes', 'ops', 'latency': {'bounds_seconds', 'counts' (one more than the\n"
          "bounds: the last is above them), 'count', 'sum_seconds'}}], 'failures': {cause: count}\n"
          "(peer_dead, deadline, rejected, out_of_range, aborted, other), 'transfers_in_flight',\n"
          "'peers', 'registered_regions', 'registered_bytes', 'dropped_notifications',\n"
          "'rejected_messages', 'auth_failures', 'access_denied', 'connections_refused'};\n"
          "format='prometheus': the same as\n"
          "Prometheus text.")
      .def(
          "in_flight",
          [](const PyEngine& s) {
            auto live = Call(s, [](Engine& e) { return e.InFlight(); });
            py::list out;
            for (const InFlightTransfer& t : live) {
              py::dict d;
              d["id"] = static_cast<uint64_t>(t.id);
              d["peer"] = t.peer;
              d["transport"] = t.path.transport;
              d["path"] = t.path.ToString();
              d["bytes"] = t.bytes;
              d["age_ms"] = Ms(t.age);
              d["deadline_in_ms"] = t.deadline_in == Duration::max() ? py::object(py::none()) : py::float_(Ms(t.deadline_in));
              out.append(d);
            }
            return out;
          },
          "Every transfer still running, oldest first: [{'id', 'peer', 'transport', 'path',\n"
          "'bytes', 'age_ms', 'deadline_in_ms' (negative once past; None without one)}].")
      .def_property_readonly(
          "metrics_port_in_use", [](const PyEngine& s) { return Call(s, [](Engine& e) { return e.MetricsPort(); }); },
          "The port of the GET /metrics endpoint (metrics_port), 0 when off.")
      .def("close", &PyEngine::Close,
           "Shuts the engine down (its sessions' transfers then fail with ABORTED) and releases\n"
           "the buffers it holds. Later calls on the engine raise ferry.Error (ABORTED).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyEngine& s, py::args) { s.Close(); })
      .def("_held_buffers", &PyEngine::held_buffers)
      .def("__repr__", [](const PyEngine& s) {
        if (s.closed()) return std::string("<ferry.Engine closed>");
        return "<ferry.Engine key=" + s.engine()->key() + ">";
      });
}

}  // namespace ferry::python
