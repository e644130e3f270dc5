// ferry.set_log_level, ferry.get_log_level and the sink behind ferry.log_to_python.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <string_view>

#include "binding.h"
#include "ferry/log.h"

namespace ferry::python {
namespace {

// Python logging's level for each of ferry's (TRACE below DEBUG, as 5).
int PythonLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return 5;
    case LogLevel::kDebug: return 10;
    case LogLevel::kInfo: return 20;
    case LogLevel::kWarn: return 30;
    default: return 40;
  }
}

}  // namespace

// ferry.set_log_level, get_log_level, and the sink behind ferry.log_to_python. The sink runs on
// whichever thread logs and takes the GIL there; that cannot deadlock because ferry holds no
// lock of its log while calling it and every binding that waits on ferry releases the GIL.
// While the interpreter finalizes, messages are dropped.
void BindLog(py::module_& m) {
  m.def(
      "set_log_level", [](const std::string& level) { Check(SetLogLevel(level)); }, py::arg("level"),
      "Sets ferry's log level: 'trace', 'debug', 'info', 'warn', 'error' or 'off' (FERRY_LOG sets\n"
      "the first one). An unknown name raises ferry.InvalidArgumentError.");
  m.def(
      "get_log_level", [] { return std::string(GetLogLevel()); }, "ferry's log level, by name.");
  m.def(
      "_log_to_python",
      [](std::optional<std::string> logger_name) {
        if (!logger_name) {
          SetLogSink(nullptr);
          return;
        }
        SetLogSink([name = *logger_name](LogLevel level, std::string_view message) {
          if (!Py_IsInitialized() || Finalizing()) return;
          py::gil_scoped_acquire gil;
          PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace");
          if (text == nullptr) {
            PyErr_Clear();
            return;
          }
          try {
            py::object logger = py::module_::import("logging").attr("getLogger")(name);
            logger.attr("log")(PythonLevel(level), py::reinterpret_steal<py::str>(text));
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("ferry's log sink");
          }
        });
      },
      py::arg("logger_name"), "Sends ferry's messages to logging.getLogger(name); None: back to stderr.");
}

}  // namespace ferry::python
