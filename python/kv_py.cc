// ferry.kv: the KV-cache connector (ferry/kv.h) for Python: CacheLayout and its parts,
// make_layout / check_compatible, WorkerId, WorkerMetadata, ReadParams, Finished and Connector.
//
// Enums travel as strings, as elsewhere in the binding: tensor orders by TensorOrderName
// ("kv_first", ...), role "producer" | "consumer" | "both", mode "write" | "read", outcome
// "done" | "failed" | "aborted". Durations are milliseconds (floats) in arguments named *_ms.
// Every Connector call releases the GIL; a Connector keeps its engine alive (a closed
// ferry.Engine's C++ engine lives on until its connectors are closed).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "ferry/kv.h"

namespace ferry::python {
namespace {

using kv::CacheLayout;
using kv::Connector;

template <typename E, size_t N>
using Names = std::array<std::pair<E, const char*>, N>;
constexpr Names<kv::Role, 3> kRoles = {{{kv::Role::kProducer, "producer"},
                                        {kv::Role::kConsumer, "consumer"},
                                        {kv::Role::kBoth, "both"}}};
constexpr Names<kv::Mode, 2> kModes = {{{kv::Mode::kWrite, "write"}, {kv::Mode::kRead, "read"}}};
constexpr Names<kv::Outcome, 3> kOutcomes = {{{kv::Outcome::kDone, "done"},
                                              {kv::Outcome::kFailed, "failed"},
                                              {kv::Outcome::kAborted, "aborted"}}};

template <typename E, size_t N>
E Parse(const Names<E, N>& names, const std::string& s, const char* what) {
  std::string options;
  for (const auto& [e, name] : names) {
    if (s == name) return e;
    options += (options.empty() ? "'" : ", '") + std::string(name) + "'";
  }
  ThrowInvalid(std::string(what) + " must be one of " + options + ", not '" + s.substr(0, 64) + "'");
}

template <typename E, size_t N>
std::string NameOf(const Names<E, N>& names, E e) {
  for (const auto& [v, name] : names) {
    if (v == e) return name;
  }
  return "unknown";
}

kv::TensorOrder ParseOrder(const std::string& s) { return Unwrap(kv::ParseTensorOrder(s)); }

// Block ids from a sequence of ints or an integer array (1-D); a negative id is refused.
std::vector<uint64_t> BlockIds(const py::handle& obj, const char* what) {
  // A tensor on a GPU (torch's block tables often are) is copied to the host first.
  py::object host = py::reinterpret_borrow<py::object>(obj);
  if (py::hasattr(obj, "__cuda_array_interface__") && py::hasattr(obj, "cpu")) host = obj.attr("cpu")();
  py::array arr = py::array::ensure(host);
  if (!arr) ThrowInvalid(std::string(what) + " must be a sequence of block ids (ints, an integer array or tensor)");
  if (arr.size() == 0) return {};
  if (arr.ndim() != 1) ThrowInvalid(std::string(what) + " must be one-dimensional");
  const char kind = arr.dtype().kind();
  if (kind == 'u') {
    auto u = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    return std::vector<uint64_t>(u.data(), u.data() + u.size());
  }
  if (kind != 'i') ThrowInvalid(std::string(what) + " must hold integers, not " + std::string(py::str(arr.dtype())));
  auto s = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  std::vector<uint64_t> out(static_cast<size_t>(s.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (s.data()[i] < 0) ThrowInvalid(std::string(what) + "[" + std::to_string(i) + "] is negative");
    out[i] = static_cast<uint64_t>(s.data()[i]);
  }
  return out;
}

// A Python object referenced from C++ threads: released with the GIL held, or leaked when the
// interpreter is finalizing (no Python code may run then).
std::shared_ptr<py::object> Hold(py::object obj) {
  return std::shared_ptr<py::object>(new py::object(std::move(obj)), [](py::object* o) {
    if (Finalizing()) {
      (void)o->release();
    } else {
      py::gil_scoped_acquire gil;
      delete o;
      return;
    }
    delete o;
  });
}

// A Python exception as a Status: a ferry.Error keeps its code; anything else is UNKNOWN.
// REQUIRES: the GIL.
Status StatusOf(py::error_already_set& e, const std::string& context) {
  Code code = Code::kUnknown;
  std::string message = std::string(py::str(e.value()));
  if (ErrorClass() && py::isinstance(e.value(), ErrorClass())) {
    std::string name = py::str(e.value().attr("code"));
    for (int c = 0; c <= static_cast<int>(Code::kInProgress); ++c) {
      if (CodeName(static_cast<Code>(c)) == name && c != 0) code = static_cast<Code>(c);
    }
    message = py::str(e.value().attr("message"));
  } else {
    message = std::string(py::str(e.type().attr("__name__"))) + ": " + message;
  }
  return Status(code, context + message);
}

// SaveLayer's `ready`: None, an object with .synchronize() (torch.cuda.Event / Stream) or a
// callable ready(timeout_ms) -> truthy/None when ready, falsy when not ready in time; a raise
// fails the request. Runs on the connector's ready thread with the GIL acquired.
kv::ReadyFn ReadyOf(const py::object& ready) {
  if (ready.is_none()) return nullptr;
  const bool sync = py::hasattr(ready, "synchronize");
  if (!sync && !PyCallable_Check(ready.ptr()))
    throw py::type_error("ready must be None, callable(timeout_ms) or have .synchronize()");
  auto held = Hold(ready);
  return [held, sync](Duration timeout) -> Status {
    if (Finalizing()) return Status(Code::kAborted, "the interpreter is shutting down");
    py::gil_scoped_acquire gil;
    try {
      if (sync) {
        held->attr("synchronize")();
        return {};
      }
      py::object r = (*held)(Ms(timeout));
      if (r.is_none() || py::bool_(r)) return {};
      return Status(Code::kDeadlineExceeded, "ready() returned false within " + std::to_string(Ms(timeout)) + " ms");
    } catch (py::error_already_set& e) {
      return StatusOf(e, "ready raised ");
    } catch (const std::exception& e) {
      return Status(Code::kUnknown, std::string("ready raised ") + e.what());
    }
  };
}

// The connector and the engine it uses, destroyed in that order with the GIL released: the
// connector's threads may be waiting for the GIL (a ready callable) when it joins them.
struct Held {
  std::shared_ptr<Engine> engine;
  std::unique_ptr<Connector> conn;
};

std::shared_ptr<Held> MakeHeld(std::shared_ptr<Engine> engine, std::unique_ptr<Connector> conn) {
  return std::shared_ptr<Held>(new Held{std::move(engine), std::move(conn)}, [](Held* h) {
    if (!Finalizing() && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      h->conn.reset();
      delete h;
      return;
    }
    h->conn.reset();
    delete h;
  });
}

class PyConnector {
 public:
  PyConnector(py::object engine_obj, std::shared_ptr<Held> held, CacheLayout layout)
      : engine_obj_(std::move(engine_obj)), held_(std::move(held)), layout_(std::move(layout)) {}
  ~PyConnector() { Close(); }

  // The connector, for one call; raises ABORTED once closed. Call with the GIL held.
  std::shared_ptr<Held> held() const {
    if (!held_) Throw(Status(Code::kAborted, "the connector was closed"));
    return held_;
  }
  // Stops the connector (its requests end, their blocks handed back); a call still running
  // on another thread keeps it until that call returns.
  void Close() { held_.reset(); }
  bool closed() const { return held_ == nullptr; }
  const CacheLayout& layout() const { return layout_; }
  const py::object& engine() const { return engine_obj_; }

 private:
  py::object engine_obj_;  // keeps the ferry.Engine (and the buffers it holds) alive
  std::shared_ptr<Held> held_;
  CacheLayout layout_;
};

// Runs `f` on the connector with the GIL released.
template <typename F>
auto Call(const PyConnector& self, F&& f) {
  auto h = self.held();
  py::gil_scoped_release nogil;
  return f(*h->conn);
}

std::unique_ptr<PyConnector> MakeConnector(py::object engine, const CacheLayout& layout,
                                           std::vector<MemoryDesc> regions, std::string instance,
                                           const std::string& role, const std::string& mode,
                                           double deferred_write_timeout_ms, double transfer_timeout_ms,
                                           double abort_timeout_ms, double liveness_interval_ms, bool checksums,
                                           double handshake_timeout_ms, bool eager_connect, bool busy_poll) {
  kv::ConnectorOptions o;
  o.instance = std::move(instance);
  o.role = Parse(kRoles, role, "role");
  o.mode = Parse(kModes, mode, "mode");
  o.deferred_write_timeout = Millis(deferred_write_timeout_ms, "deferred_write_timeout_ms");
  o.transfer_timeout = Millis(transfer_timeout_ms, "transfer_timeout_ms");
  o.abort_timeout = Millis(abort_timeout_ms, "abort_timeout_ms");
  o.liveness_interval = Millis(liveness_interval_ms, "liveness_interval_ms");
  o.checksums = checksums;
  o.handshake_timeout = Millis(handshake_timeout_ms, "handshake_timeout_ms");
  o.eager_connect = eager_connect;
  o.busy_poll = busy_poll;
  std::shared_ptr<Engine> e = EngineOf(engine);
  Result<std::unique_ptr<Connector>> c = [&] {
    py::gil_scoped_release nogil;
    return Connector::Create(e.get(), layout, std::move(regions), o);
  }();
  auto held = MakeHeld(std::move(e), Unwrap(std::move(c)));
  return std::make_unique<PyConnector>(std::move(engine), std::move(held), layout);
}

py::dict StatsDict(const kv::ConnectorStats& s) {
  py::dict d;
  d["requests_done"] = s.requests_done;
  d["requests_failed"] = s.requests_failed;
  d["requests_aborted"] = s.requests_aborted;
  d["layers_written"] = s.layers_written;
  d["layers_read"] = s.layers_read;
  d["layers_deferred"] = s.layers_deferred;
  d["bytes"] = s.bytes;
  d["ops_posted"] = s.ops_posted;
  d["messages_sent"] = s.messages_sent;
  d["messages_received"] = s.messages_received;
  d["messages_rejected"] = s.messages_rejected;
  d["blocks_expired"] = s.blocks_expired;
  d["checksum_failures"] = s.checksum_failures;
  d["peers_lost"] = s.peers_lost;
  d["peers_fenced"] = s.peers_fenced;
  return d;
}

kv::ReadParams ParamsOf(const py::object& obj) {
  if (py::isinstance<kv::ReadParams>(obj)) return obj.cast<kv::ReadParams>();
  return Unwrap(kv::ReadParams::Unpack(BytesOf(obj, "params")));
}

}  // namespace

// The value types (layouts, ids, metadata, read params): kv_values_py.cc.
void BindKvValues(py::module_& m);

void BindKv(py::module_& parent) {
  py::module_ m = parent.def_submodule("kv", "The KV-cache connector (ferry/kv.h); use ferry.kv.");
  BindKvValues(m);

  py::class_<kv::Finished>(m, "Finished",
                           "A request that ended on this side; its blocks are the caller's again.")
      .def_readonly("request", &kv::Finished::request)
      .def_property_readonly(
          "outcome", [](const kv::Finished& f) { return NameOf(kOutcomes, f.outcome); },
          "\"done\", \"failed\" or \"aborted\".")
      .def_property_readonly(
          "code", [](const kv::Finished& f) { return std::string(CodeName(f.status.code())); },
          "Why it did not finish, as a code name (\"OK\" when done).")
      .def_property_readonly(
          "message", [](const kv::Finished& f) { return std::string(f.status.message()); })
      .def_readonly("blocks", &kv::Finished::blocks,
                    "The local blocks; on a consumer failure, those to recompute.")
      .def_readonly("producer", &kv::Finished::producer, "True when this worker produced the request.")
      .def_property_readonly(
          "at_ns",
          [](const kv::Finished& f) {
            return std::chrono::duration_cast<std::chrono::nanoseconds>(f.at.time_since_epoch()).count();
          },
          "When the connector ended it, in ns of the monotonic clock (time.monotonic_ns()).")
      .def("__repr__", [](const kv::Finished& f) {
        std::string s = "<ferry.kv.Finished " + f.request + " " + NameOf(kOutcomes, f.outcome);
        if (!f.status.ok()) s += " " + f.status.ToString();
        return s + (f.producer ? " producer>" : " consumer>");
      });

  kv::ConnectorOptions d;
  py::class_<PyConnector>(
      m, "Connector", py::dynamic_attr(),
      "One worker's KV connector: moves requests' KV blocks to and from peer workers.\n\n"
      "Connector(engine, layout, regions, *, instance, role='both', mode='write',\n"
      "deferred_write_timeout_ms=60000, transfer_timeout_ms=30000, abort_timeout_ms=480000,\n"
      "liveness_interval_ms=1000, checksums=False, handshake_timeout_ms=5000, eager_connect=False,\n"
      "busy_poll=False):\n"
      "`regions` are the\n"
      "engine's MemoryDescs of the layout's regions, in order (ferry.kv.register_kv_caches builds\n"
      "all three from tensors). Every call releases the GIL. Requests end on each side exactly\n"
      "once (pop_finished / wait_finished). close() (or leaving a `with` block) stops it.")
      .def(py::init(&MakeConnector), py::arg("engine"), py::arg("layout"), py::arg("regions"),
           py::kw_only(), py::arg("instance"), py::arg("role") = "both", py::arg("mode") = "write",
           py::arg("deferred_write_timeout_ms") = Ms(d.deferred_write_timeout),
           py::arg("transfer_timeout_ms") = Ms(d.transfer_timeout),
           py::arg("abort_timeout_ms") = Ms(d.abort_timeout),
           py::arg("liveness_interval_ms") = Ms(d.liveness_interval), py::arg("checksums") = d.checksums,
           py::arg("handshake_timeout_ms") = Ms(d.handshake_timeout), py::arg("eager_connect") = d.eager_connect,
           py::arg("busy_poll") = d.busy_poll)
      .def_property_readonly(
          "id", [](const PyConnector& s) { return Call(s, [](Connector& c) { return c.id(); }); },
          "This worker's WorkerId.")
      .def_property_readonly("layout", &PyConnector::layout, "The CacheLayout it was made with.")
      .def_property_readonly("engine", &PyConnector::engine, "The ferry.Engine it uses.")
      .def_property_readonly("closed", &PyConnector::closed)
      .def(
          "metadata",
          [](const PyConnector& s) { return py::bytes(Call(s, [](Connector& c) { return c.Metadata(); })); },
          "This worker's packed WorkerMetadata (bytes), for peers' add_peer().")
      .def(
          "serve_handshake",
          [](const PyConnector& s, const std::string& host, uint16_t port) {
            return Unwrap(Call(s, [&](Connector& c) { return c.ServeHandshake(host, port); }));
          },
          py::arg("host") = "127.0.0.1", py::arg("port") = 0,
          "Serves metadata() on host:port (0: a free port); returns \"host:port\".")
      .def(
          "add_peer",
          [](const PyConnector& s, const py::object& metadata) {
            std::string bytes = BytesOf(metadata, "metadata");
            Check(Call(s, [&](Connector& c) { return c.AddPeer(bytes); }));
          },
          py::arg("metadata"),
          "Learns a peer worker from its metadata() bytes. Raises InvalidArgumentError naming the\n"
          "first field that must agree and does not (\"head_dim: 128 vs 64\"). A worker learnt again\n"
          "under another engine (its process restarted) replaces the one before; the connections to\n"
          "its old engine are let go once they are found dead.")
      .def(
          "add_peer_from",
          [](const PyConnector& s, const std::string& address) {
            Check(Call(s, [&](Connector& c) { return c.AddPeerFrom(address); }));
          },
          py::arg("address"), "Fetches a peer's metadata from its serve_handshake() address, then add_peer().")
      .def(
          "expect_write",
          [](const PyConnector& s, const std::string& request, const std::string& producer, uint32_t producer_dp,
             const py::object& blocks, uint64_t num_tokens, uint64_t first_token) {
            auto ids = BlockIds(blocks, "blocks");
            Check(Call(s, [&](Connector& c) {
              return c.ExpectWrite(request, producer, producer_dp, ids, num_tokens, first_token);
            }));
          },
          py::arg("request"), py::arg("producer"), py::arg("producer_dp"), py::arg("blocks"),
          py::arg("num_tokens") = 0, py::arg("first_token") = 0,
          "Consumer, write mode: `blocks` (a list or integer array of block ids) wait for the KV of\n"
          "`request` from instance `producer`, DP rank producer_dp. num_tokens: 0 = as many as the\n"
          "blocks hold; first_token: the first token that moves after a prefix hit.")
      .def(
          "start_read",
          [](const PyConnector& s, const py::object& params, const py::object& blocks, uint64_t first_token) {
            kv::ReadParams p = ParamsOf(params);
            auto ids = BlockIds(blocks, "blocks");
            Check(Call(s, [&](Connector& c) { return c.StartRead(p, ids, first_token); }));
          },
          py::arg("params"), py::arg("blocks"), py::arg("first_token") = 0,
          "Consumer, read mode: reads every layer of the request of `params` (a ReadParams or its\n"
          "pack() bytes, from the producer's hold_for_read) into `blocks`.")
      .def(
          "wait_layer",
          [](const PyConnector& s, const std::string& request, uint32_t layer, double timeout_ms) {
            Duration t = Millis(timeout_ms, "timeout_ms");
            Check(Call(s, [&](Connector& c) { return c.WaitLayer(request, layer, t); }));
          },
          py::arg("request"), py::arg("layer"), py::arg("timeout_ms"),
          "Read mode: returns once `layer` of `request` landed. Raises the request's error if it\n"
          "failed, DEADLINE_EXCEEDED when timeout_ms passed, NOT_FOUND for a request not pending.")
      .def(
          "save_layer",
          [](const PyConnector& s, const std::string& request, uint32_t layer, const py::object& blocks,
             const py::object& ready) {
            auto ids = BlockIds(blocks, "blocks");
            kv::ReadyFn fn = ReadyOf(ready);
            Check(Call(s, [&](Connector& c) { return c.SaveLayer(request, layer, ids, std::move(fn)); }));
          },
          py::arg("request"), py::arg("layer"), py::arg("blocks"), py::arg("ready") = py::none(),
          "Producer, write mode: `layer` of `request` (source `blocks`) is computed once `ready`\n"
          "says so, and is written as soon as the consumer's allocation is known. `ready` is None\n"
          "(ready now), an object with .synchronize() (a torch.cuda.Event or Stream: called) or a\n"
          "callable ready(timeout_ms) that returns truthy or None when ready, falsy when not ready\n"
          "in time, or raises (the request fails). It is called on ferry's ready thread, not the\n"
          "caller's, with the GIL held, one save at a time in the order they were made: keep it\n"
          "short and do not wait in it for the thread that called save_layer.")
      .def(
          "seal",
          [](const PyConnector& s, const std::string& request, uint32_t layers_saved) {
            Check(Call(s, [&](Connector& c) { return c.Seal(request, layers_saved); }));
          },
          py::arg("request"), py::arg("layers_saved"),
          "Producer, write mode: `request` saved layers_saved layers and no more will come.")
      .def(
          "hold_for_read",
          [](const PyConnector& s, const std::string& request, const py::object& blocks, uint64_t num_tokens) {
            auto ids = BlockIds(blocks, "blocks");
            return Unwrap(Call(s, [&](Connector& c) { return c.HoldForRead(request, ids, num_tokens); }));
          },
          py::arg("request"), py::arg("blocks"), py::arg("num_tokens") = 0,
          "Producer, read mode: keeps `blocks` until the consumer releases them; returns the\n"
          "ReadParams (pack() them for the router) that the consumer's start_read takes.")
      .def(
          "abort",
          [](const PyConnector& s, const std::string& request) {
            Check(Call(s, [&](Connector& c) { return c.Abort(request); }));
          },
          py::arg("request"), "Gives up on `request`; it ends (\"aborted\") once no peer can touch its blocks.")
      .def(
          "pop_finished",
          [](const PyConnector& s) { return Call(s, [](Connector& c) { return c.PopFinished(); }); },
          "The requests (Finished) that ended since the last call, on either side.")
      .def(
          "wait_finished",
          [](const PyConnector& s, double timeout_ms) {
            Duration t = Millis(timeout_ms, "timeout_ms");
            return Call(s, [&](Connector& c) { return c.WaitFinished(t); });
          },
          py::arg("timeout_ms"),
          "Waits until a request ended or timeout_ms passed; then as pop_finished() (maybe []).")
      .def_property_readonly(
          "pending", [](const PyConnector& s) { return Call(s, [](Connector& c) { return c.pending(); }); },
          "Requests not yet ended on this side.")
      .def(
          "stats", [](const PyConnector& s) { return StatsDict(Call(s, [](Connector& c) { return c.stats(); })); },
          "Counters, as a dict: requests_done, requests_failed, requests_aborted, layers_written,\n"
          "layers_read, layers_deferred, bytes, ops_posted, messages_sent, messages_received,\n"
          "messages_rejected, blocks_expired, checksum_failures, peers_lost, peers_fenced.")
      .def("close", &PyConnector::Close,
           "Stops the connector (pending requests end; later calls raise ferry.Error ABORTED).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyConnector& s, py::args) { s.Close(); })
      .def("__repr__", [](const PyConnector& s) {
        if (s.closed()) return std::string("<ferry.kv.Connector closed>");
        return "<ferry.kv.Connector " + s.held()->conn->id().ToString() + ">";
      });
}

}  // namespace ferry::python
