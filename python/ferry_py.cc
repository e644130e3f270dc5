// ferry._ferry: the pybind11 binding under the Python package `ferry` (python/ferry/).
//
// A thin layer: it converts arguments and results and turns a non-OK Status into the Python
// exception ferry.Error (defined in python/ferry/__init__.py and handed over at import through
// _set_error_class). Every call that can block (waits, posting a transfer, registration,
// deregistration, peer and notification calls) releases the GIL. One file per family of
// classes: descriptors_py.cc, session_py.cc, engine_py.cc; binding.h holds what they share.
#include <pybind11/stl.h>

#include <exception>
#include <string>

#include "binding.h"
#include "ferry/descriptors.h"
#include "ferry/system.h"

namespace ferry::python {
namespace {

py::dict SystemInfoDict() {
  SystemInfo info;
  {
    py::gil_scoped_release nogil;
    info = Probe();
  }
  py::list gpus;
  for (const auto& g : info.gpus) {
    py::dict d;
    d["ordinal"] = g.ordinal;
    d["name"] = g.name;
    d["memory_bytes"] = g.memory_bytes;
    d["sm"] = py::make_tuple(g.sm_major, g.sm_minor);
    d["kernels"] = g.kernels;
    gpus.append(d);
  }
  py::list transports;
  for (const auto& t : info.transports) {
    py::dict e;
    e["name"] = t.name;
    e["host_memory"] = t.host_memory;
    e["cuda_memory"] = t.cuda_memory;
    e["notifications"] = t.notifications;
    e["reach"] = t.reach;
    transports.append(e);
  }
  py::dict d;
  d["version"] = info.version;
  d["transports"] = transports;
  d["transports_compiled"] = info.transports_compiled;
  d["transports_usable"] = info.transports_usable;
  d["cuda_built"] = info.cuda_built;
  d["cuda_available"] = info.cuda_available;
  d["cuda_unavailable_reason"] = info.cuda_unavailable_reason;
  d["cuda_architectures"] = info.cuda_architectures;
  d["gpus"] = gpus;
  return d;
}

}  // namespace
}  // namespace ferry::python

PYBIND11_MODULE(_ferry, m) {
  using namespace ferry;
  using namespace ferry::python;
  m.doc() = "ferry's C++ binding; import the package `ferry` instead.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseError(e.status);
    }
  });
  m.def(
      "_set_error_class", [](py::object cls) { ErrorClass() = std::move(cls); },
      "Sets the exception class raised for a failed Status (called by ferry/__init__.py).");

  // Classes are named ferry.X (in reprs, signatures and pickles): the package re-exports them.
  py::object module_name = m.attr("__name__");
  m.attr("__name__") = "ferry";
  BindDescriptors(m);
  BindTransfer(m);
  BindSession(m);
  BindEngine(m);
  m.attr("__name__") = module_name;
  BindShared(m);
  // Submodules after the name is restored: def_submodule enters "<name>.embed" in sys.modules,
  // which as "ferry.embed" would shadow the package's own python/ferry/embed*.py.
  BindEmbed(m);
  BindEmbedService(m);
  BindKv(m);

  m.def(
      "version", [] { return std::string(Version()); }, "ferry's version, \"MAJOR.MINOR.PATCH\".");
  m.def("system_info", &SystemInfoDict,
        "What this build can do here: version, transports compiled and usable, CUDA state, GPUs.");
  m.def(
      "cuda_available", [] { return CudaAvailable(); },
      "True when CUDA memory can be registered here.");
  m.def(
      "cuda_unavailable_reason",
      [] {
        std::string reason;
        return CudaAvailable(&reason) ? std::string() : reason;
      },
      "Why CUDA memory cannot be registered here (empty when it can).");

  py::list codes;
  for (int c = 0; c <= static_cast<int>(Code::kInProgress); ++c)
    codes.append(std::string(CodeName(static_cast<Code>(c))));
  m.attr("CODES") = py::tuple(codes);
  m.attr("PROTOCOL_VERSION") = kDescriptorVersion;
  m.attr("MAX_DESCRIPTOR_BYTES") = kMaxDescriptorBytes;
}
