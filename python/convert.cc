// The Status -> ferry.Error bridge and the argument conversions of the binding.
#include <chrono>
#include <cmath>
#include <memory>
#include <string>

#include "binding.h"

namespace ferry::python {

py::object& ErrorClass() {
  static py::object* cls = new py::object();  // leaked: lives as long as the interpreter
  return *cls;
}

py::object& InvalidArgumentClass() {
  static py::object* cls = new py::object();  // leaked: lives as long as the interpreter
  return *cls;
}

void RaiseError(const Status& s) {
  std::string code(CodeName(s.code()));
  std::string message(s.message());
  if (!ErrorClass()) {  // only if _ferry is imported without its package
    PyErr_SetString(PyExc_RuntimeError, s.ToString().c_str());
    return;
  }
  py::object& cls = s.code() == Code::kInvalidArgument && InvalidArgumentClass() ? InvalidArgumentClass() : ErrorClass();
  py::object error = cls(code, message);
  PyErr_SetObject(cls.ptr(), error.ptr());
}

std::function<void(const Status&)> CompletionCallback(const py::object& fn) {
  if (fn.is_none()) return {};
  if (!PyCallable_Check(fn.ptr())) throw py::type_error("on_complete must be callable (code, message)");
  // The callable is released with the GIL held, on whichever thread drops the last copy.
  std::shared_ptr<py::object> held(new py::object(fn), [](py::object* o) {
    if (Finalizing()) {
      (void)o->release();  // no Python call may run now: leak the reference
    } else {
      py::gil_scoped_acquire gil;
      delete o;
      return;
    }
    delete o;
  });
  return [held](const Status& s) {
    if (Finalizing()) return;
    py::gil_scoped_acquire gil;
    try {
      (*held)(std::string(CodeName(s.code())), std::string(s.message()));
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("ferry on_complete callback");
    } catch (...) {  // nothing may escape onto the completion thread
      PyErr_Clear();
    }
  };
}

Duration Millis(double ms, const char* what) {
  if (!std::isfinite(ms) || std::abs(ms) > 1e12)
    ThrowInvalid(std::string(what) + " must be a finite number of milliseconds");
  Duration d = std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(ms));
  // A positive time under a nanosecond stays positive (a zero or negative deadline is refused).
  if (ms > 0 && d <= Duration::zero()) d = Duration(1);
  return d;
}

MemoryKind ParseKind(const std::string& kind) {
  if (kind == "host") return MemoryKind::kHost;
  if (kind == "cuda") return MemoryKind::kCuda;
  ThrowInvalid("memory kind must be \"host\" or \"cuda\", not \"" + kind + "\"");
}

std::string BytesOf(const py::handle& obj, const char* what) {
  if (PyBytes_Check(obj.ptr())) return std::string(py::reinterpret_borrow<py::bytes>(obj));
  Py_buffer view;
  if (!PyObject_CheckBuffer(obj.ptr()) || PyObject_GetBuffer(obj.ptr(), &view, PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    throw py::type_error(std::string(what) + " must be a contiguous bytes-like object, not " +
                         std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  std::string out(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return out;
}

}  // namespace ferry::python
