// ferry.embed_service: the embedding-offload client (ferry/embed_service.h) for Python.
// The shared inputs and the host-mode outputs are numpy views of the client's shared memory
// (writable, no copies); they keep the client object alive. Blocking calls release the GIL.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "binding.h"
#include "ferry/embed_service.h"

namespace ferry::python {
namespace {

using embed::service::Client;
using embed::service::ClientOptions;

template <typename T>
py::array View(std::span<T> data, std::vector<py::ssize_t> shape, py::handle owner) {
  return py::array_t<T>(shape, data.data(), owner);
}

std::chrono::nanoseconds Nanos(double ms, const char* what) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Millis(ms, what));
}

}  // namespace

void BindEmbedService(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "embed_service", "The embedding-offload client: shared inputs, outputs, flags, waits.");
  m.attr("FLAG_RESET") = embed::service::kFlagReset;
  m.attr("FLAG_DONE") = embed::service::kFlagDone;
  m.attr("FLAG_FAILED") = embed::service::kFlagFailed;
  m.attr("PROTOCOL_VERSION") = embed::service::ProtocolVersion();

  py::class_<Client>(m, "Client", py::dynamic_attr(),
                     "One GPU worker's connection to `ferry embed-serve` (host-mode outputs).")
      .def(py::init([](const std::string& socket_path, uint32_t dp_rank, uint32_t tp_rank,
                       uint32_t tp_size, uint64_t max_tokens, uint64_t max_reqs,
                       uint64_t context_len, uint64_t token_bytes, std::vector<uint32_t> layers,
                       double connect_timeout_ms, double step_timeout_ms, const std::string& mode,
                       int device, std::vector<uintptr_t> cuda_outputs,
                       std::vector<uintptr_t> cuda_flags) {
             ClientOptions o;
             o.socket_path = socket_path;
             o.dp_rank = dp_rank;
             o.tp_rank = tp_rank;
             o.tp_size = tp_size;
             o.max_tokens = max_tokens;
             o.max_reqs = max_reqs;
             o.context_len = context_len;
             o.token_bytes = token_bytes;
             o.layers = std::move(layers);
             o.connect_timeout = Nanos(connect_timeout_ms, "connect_timeout_ms");
             o.step_timeout = Nanos(step_timeout_ms, "step_timeout_ms");
             if (mode != "host" && mode != "cuda") ThrowInvalid("mode must be 'host' or 'cuda'");
             o.mode = mode == "cuda" ? embed::service::OutputMode::kCuda
                                     : embed::service::OutputMode::kHost;
             o.device = device;
             for (uintptr_t p : cuda_outputs) o.cuda_outputs.push_back(reinterpret_cast<void*>(p));
             for (uintptr_t p : cuda_flags) o.cuda_flags.push_back(reinterpret_cast<void*>(p));
             Result<std::unique_ptr<Client>> c = Status(Code::kUnknown, "");
             {
               py::gil_scoped_release nogil;
               c = Client::Create(o);
             }
             return Unwrap(std::move(c));
           }),
           py::arg("socket_path"), py::kw_only(), py::arg("dp_rank") = 0, py::arg("tp_rank") = 0,
           py::arg("tp_size") = 1, py::arg("max_tokens"), py::arg("max_reqs"),
           py::arg("context_len"), py::arg("token_bytes"), py::arg("layers"),
           py::arg("connect_timeout_ms") = 10000.0, py::arg("step_timeout_ms") = 30000.0,
           py::arg("mode") = "host", py::arg("device") = 0,
           py::arg("cuda_outputs") = std::vector<uintptr_t>{},
           py::arg("cuda_flags") = std::vector<uintptr_t>{})
      .def_property_readonly("slots", &Client::slots)
      .def_property_readonly("layers", [](const Client& c) { return c.options().layers; })
      .def_property_readonly(
          "input_ids",
          [](py::object self) {
            Client& c = self.cast<Client&>();
            return View(c.input_ids(), {static_cast<py::ssize_t>(c.input_ids().size())}, self);
          },
          "int32 [max_tokens], tensor-parallel rank 0 only (empty elsewhere)")
      .def_property_readonly(
          "query_start_loc",
          [](py::object self) {
            Client& c = self.cast<Client&>();
            auto s = c.query_start_loc();
            return View(s, {static_cast<py::ssize_t>(s.size())}, self);
          },
          "int32 [max_reqs + 1]")
      .def_property_readonly(
          "ngram_context",
          [](py::object self) {
            Client& c = self.cast<Client&>();
            auto s = c.ngram_context();
            py::ssize_t cols = static_cast<py::ssize_t>(c.options().context_len);
            py::ssize_t rows = s.empty() ? 0 : static_cast<py::ssize_t>(c.options().max_reqs);
            return View(s, {rows, cols}, self);
          },
          "int32 [max_reqs, context_len]")
      .def(
          "output",
          [](py::object self, size_t slot) {
            Client& c = self.cast<Client&>();
            if (slot >= c.slots())
              Throw(Status(Code::kOutOfRange, "no slot " + std::to_string(slot)));
            return View(c.output(slot),
                        {static_cast<py::ssize_t>(c.options().max_tokens),
                         static_cast<py::ssize_t>(c.options().token_bytes)},
                        self);
          },
          py::arg("slot"), "The slot's output rows: uint8 [max_tokens, token_bytes]")
      .def("flag", &Client::flag, py::arg("slot"))
      .def(
          "device_output",
          [](const Client& c, size_t slot) {
            return reinterpret_cast<uintptr_t>(c.device_output(slot));
          },
          py::arg("slot"), "CUDA mode: the slot's output's device address (0 in host mode)")
      .def(
          "device_flag",
          [](const Client& c, size_t slot) {
            return reinterpret_cast<uintptr_t>(c.device_flag(slot));
          },
          py::arg("slot"))
      .def(
          "prepare_forward",
          [](Client& c, uint32_t num_reqs, uint32_t num_tokens, bool dummy, uintptr_t stream,
             std::optional<std::tuple<uintptr_t, uintptr_t, uintptr_t>> sources) {
            Status s;
            embed::service::StepSources src;
            if (sources) {
              src.input_ids = reinterpret_cast<const int32_t*>(std::get<0>(*sources));
              src.query_start_loc = reinterpret_cast<const int32_t*>(std::get<1>(*sources));
              src.ngram_context = reinterpret_cast<const int32_t*>(std::get<2>(*sources));
            }
            {
              py::gil_scoped_release nogil;
              s = c.PrepareForward(num_reqs, num_tokens, dummy, reinterpret_cast<void*>(stream),
                                   sources ? &src : nullptr);
            }
            Check(s);
          },
          py::arg("num_reqs"), py::arg("num_tokens"), py::arg("dummy") = false,
          py::arg("stream") = 0, py::arg("sources") = py::none(),
          "stream: a CUDA stream handle (torch's .cuda_stream); sources: device addresses of "
          "(input ids, query start locations, n-gram context) to copy on it")
      .def(
          "wait",
          [](Client& c, size_t slot, uintptr_t stream) {
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c.Wait(slot, reinterpret_cast<void*>(stream));
            }
            Check(s);
          },
          py::arg("slot"), py::arg("stream") = 0)
      .def(
          "release_outputs",
          [](Client& c, uintptr_t stream) {
            Check(c.ReleaseOutputs(reinterpret_cast<void*>(stream)));
          },
          py::arg("stream") = 0)
      .def("close", [](Client& c) {
        py::gil_scoped_release nogil;
        c.Close();
      });
}

}  // namespace ferry::python
