// Shared by the files of ferry's pybind11 binding (python/*.cc): the Status -> ferry.Error
// bridge and the argument conversions. Internal to the binding.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "ferry/engine.h"
#include "ferry/options.h"
#include "ferry/status.h"

namespace py = pybind11;

namespace ferry::python {

// A non-OK Status on its way to Python; the translator registered by the module raises
// ferry.Error from it (RaiseError).
struct StatusError : std::exception {
  explicit StatusError(Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "ferry::Status"; }
  Status status;
};

[[noreturn]] inline void Throw(Status status) { throw StatusError(std::move(status)); }
[[noreturn]] inline void ThrowInvalid(std::string message) {
  Throw(Status(Code::kInvalidArgument, std::move(message)));
}
inline void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}
template <typename T>
T Unwrap(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(r).value();
}

// The Python class raised for a failed Status (ferry.Error, set at import by __init__.py),
// and for INVALID_ARGUMENT (ferry.InvalidArgumentError: a ferry.Error and a ValueError).
py::object& ErrorClass();
py::object& InvalidArgumentClass();
// Sets the Python error indicator to ferry.Error(code name, message). REQUIRES: the GIL.
void RaiseError(const Status& s);

// Whether the interpreter is shutting down (no Python code may run then).
inline bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// A Python callable as a completion callback (TransferOptions::on_complete): called as
// fn(code, message) with the GIL acquired, on the engine's completion thread (or at once on
// the posting thread when the transfer was refused). An exception it raises is reported as
// unraisable (sys.unraisablehook) and ignored. None gives an empty function. Raises TypeError
// for anything else that is not callable.
std::function<void(const Status&)> CompletionCallback(const py::object& fn);

// Milliseconds (float) to a Duration; raises INVALID_ARGUMENT for NaN, infinities and values
// a Duration cannot hold. `what` names the argument in the message.
Duration Millis(double ms, const char* what);
// "host" or "cuda".
MemoryKind ParseKind(const std::string& kind);
// The bytes of a bytes-like object (bytes, bytearray, memoryview, a contiguous array);
// raises TypeError for anything else.
std::string BytesOf(const py::handle& obj, const char* what);

// Engine options (engine_options_py.cc): milliseconds as a std::chrono::milliseconds option (a
// positive time under 1 ms is 1 ms), the ucx progress and RMA modes by name, a duration in
// milliseconds, and EngineOptions::FromEnv() as Engine()'s keyword arguments.
std::chrono::milliseconds MsOption(double ms, const char* name);
UcxOptions::Progress ParseProgress(const std::string& s);
UcxOptions::Rma ParseRma(const std::string& s);
double Ms(Duration d);
py::dict EnvEngineKwargs();

void BindDescriptors(py::module_& m);
void BindTransfer(py::module_& m);
void BindSession(py::module_& m);
void BindEngine(py::module_& m);
void BindLog(py::module_& m);  // log_py.cc
void BindEmbed(py::module_& m);  // the submodule ferry.embed
void BindEmbedService(py::module_& m);  // the submodule ferry.embed_service
void BindShared(py::module_& m);
void BindKv(py::module_& m);  // the submodule ferry.kv

// The C++ engine of a ferry.Engine (engine_py.cc), for bindings that hold it (ferry.kv's
// Connector): the pointer keeps it alive past Engine.close(). Raises TypeError for another
// object, ferry.Error (ABORTED) for a closed engine. REQUIRES: the GIL.
std::shared_ptr<Engine> EngineOf(const py::handle& engine);

}  // namespace ferry::python
