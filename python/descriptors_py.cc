// ferry.MemoryDesc and ferry.EngineDesc: read-only values with pack() / unpack() and pickling.
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "binding.h"
#include "ferry/descriptors.h"

namespace ferry::python {
namespace {

py::list TransportDataList(const std::vector<TransportData>& entries) {
  py::list out;
  for (const auto& e : entries) out.append(py::make_tuple(e.transport, py::bytes(e.data)));
  return out;
}

}  // namespace

void BindDescriptors(py::module_& m) {
  py::class_<MemoryDesc>(m, "MemoryDesc",
                         "One registered memory region, as a value that can travel to peers.\n\n"
                         "Made by Engine.register_memory(); pack() gives bytes, "
                         "MemoryDesc.unpack(bytes) reads them back.")
      .def_readonly("engine_key", &MemoryDesc::engine_key, "Key of the engine that registered it.")
      .def_property_readonly(
          "region", [](const MemoryDesc& d) { return static_cast<uint64_t>(d.region); },
          "Region id inside the registering engine.")
      .def_readonly("address", &MemoryDesc::address, "Start address in the registering process.")
      .def_readonly("size", &MemoryDesc::size, "Size in bytes.")
      .def_property_readonly(
          "kind", [](const MemoryDesc& d) { return std::string(MemoryKindName(d.kind)); },
          "\"host\" or \"cuda\".")
      .def_readonly("device", &MemoryDesc::device, "CUDA ordinal, -1 for host memory.")
      .def_readonly("host_id", &MemoryDesc::host_id, "Identity of the registering host.")
      .def_property_readonly(
          "access", [](const MemoryDesc& d) { return TransportDataList(d.access); },
          "List of (transport, opaque bytes) that peers use to reach the region.")
      .def(
          "pack", [](const MemoryDesc& d) { return py::bytes(d.Pack()); },
          "The versioned msgpack encoding, as bytes.")
      .def_static(
          "unpack",
          [](const py::object& b) { return Unwrap(MemoryDesc::Unpack(BytesOf(b, "packed"))); },
          py::arg("packed"),
          "Decodes pack()'s bytes; raises ferry.Error on truncated or malformed input.")
      .def(py::self == py::self)
      .def(py::pickle(
          [](const MemoryDesc& d) { return py::make_tuple(py::bytes(d.Pack())); },
          [](const py::tuple& t) { return Unwrap(MemoryDesc::Unpack(BytesOf(t[0], "state"))); }))
      .def("__repr__", [](const MemoryDesc& d) {
        return "<ferry.MemoryDesc engine=" + d.engine_key +
               " region=" + std::to_string(static_cast<uint64_t>(d.region)) + " " +
               std::string(MemoryKindName(d.kind)) + " size=" + std::to_string(d.size) + ">";
      });

  py::class_<EngineDesc>(m, "EngineDesc",
                         "One engine, as a value that can travel to peers (Engine.describe()).\n\n"
                         "pack() gives bytes, EngineDesc.unpack(bytes) reads them back.")
      .def_readonly("protocol_version", &EngineDesc::protocol_version)
      .def_readonly("key", &EngineDesc::key, "Unique key of the engine.")
      .def_readonly("host_id", &EngineDesc::host_id, "Identity of the engine's host.")
      .def_readonly("pid", &EngineDesc::pid, "Process id of the engine.")
      .def_readonly("addresses", &EngineDesc::addresses, "Where the engine can be reached.")
      .def_property_readonly(
          "transports", [](const EngineDesc& d) { return TransportDataList(d.transports); },
          "List of (transport, opaque bytes) usable by peers.")
      .def(
          "pack", [](const EngineDesc& d) { return py::bytes(d.Pack()); },
          "The versioned msgpack encoding, as bytes.")
      .def_static(
          "unpack",
          [](const py::object& b) { return Unwrap(EngineDesc::Unpack(BytesOf(b, "packed"))); },
          py::arg("packed"),
          "Decodes pack()'s bytes; raises ferry.Error on truncated or malformed input.")
      .def(py::self == py::self)
      .def(py::pickle(
          [](const EngineDesc& d) { return py::make_tuple(py::bytes(d.Pack())); },
          [](const py::tuple& t) { return Unwrap(EngineDesc::Unpack(BytesOf(t[0], "state"))); }))
      .def("__repr__", [](const EngineDesc& d) {
        std::string names;
        for (const auto& t : d.transports) names += (names.empty() ? "" : ",") + t.transport;
        return "<ferry.EngineDesc key=" + d.key + " pid=" + std::to_string(d.pid) +
               " transports=" + names + ">";
      });
}

}  // namespace ferry::python
