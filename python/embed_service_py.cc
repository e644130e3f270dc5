// ferry.embed_service: the embedding-offload client (src/embed/service/client.h) for Python.
// The shared inputs and the host-mode outputs are numpy views of the client's shared memory
// (writable, no copies); they keep the client object alive. Blocking calls release the GIL.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "binding.h"
#include "embed/service/client.h"
#include "embed/service/protocol.h"

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
  m.attr("PROTOCOL_VERSION") = embed::service::kProtocolVersion;

  py::class_<Client>(m, "Client",
                     "One GPU worker's connection to `ferry embed-serve` (host-mode outputs).")
      .def(py::init([](const std::string& socket_path, uint32_t dp_rank, uint32_t tp_rank,
                       uint32_t tp_size, uint64_t max_tokens, uint64_t max_reqs,
                       uint64_t context_len, uint64_t token_bytes,
                       std::vector<uint32_t> layers, double connect_timeout_ms,
                       double step_timeout_ms) {
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
             Result<std::unique_ptr<Client>> c = Status(Code::kUnknown, "");
             {
               py::gil_scoped_release nogil;
               c = Client::Create(o);
             }
             return Unwrap(std::move(c));
           }),
           py::arg("socket_path"), py::kw_only(), py::arg("dp_rank") = 0,
           py::arg("tp_rank") = 0, py::arg("tp_size") = 1, py::arg("max_tokens"),
           py::arg("max_reqs"), py::arg("context_len"), py::arg("token_bytes"),
           py::arg("layers"), py::arg("connect_timeout_ms") = 10000.0,
           py::arg("step_timeout_ms") = 30000.0)
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
            if (slot >= c.slots()) Throw(Status(Code::kOutOfRange, "no slot " + std::to_string(slot)));
            return View(c.output(slot),
                        {static_cast<py::ssize_t>(c.options().max_tokens),
                         static_cast<py::ssize_t>(c.options().token_bytes)},
                        self);
          },
          py::arg("slot"), "The slot's output rows: uint8 [max_tokens, token_bytes]")
      .def("flag", &Client::flag, py::arg("slot"))
      .def(
          "prepare_forward",
          [](Client& c, uint32_t num_reqs, uint32_t num_tokens, bool dummy) {
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c.PrepareForward(num_reqs, num_tokens, dummy);
            }
            Check(s);
          },
          py::arg("num_reqs"), py::arg("num_tokens"), py::arg("dummy") = false)
      .def(
          "wait",
          [](Client& c, size_t slot) {
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c.Wait(slot);
            }
            Check(s);
          },
          py::arg("slot"))
      .def("release_outputs", [](Client& c) { Check(c.ReleaseOutputs()); })
      .def("close", [](Client& c) {
        py::gil_scoped_release nogil;
        c.Close();
      });
}

}  // namespace ferry::python
