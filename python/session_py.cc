// ferry.Session, ferry.Transfer, ferry.TransferPath, ferry.wait_all and ferry.wait_any.
// Posting and waiting release the GIL; an (n, 3) integer ops array is copied (with the GIL
// held) without a Python object per op, in one block when it is C-ordered uint64.
#include <pybind11/stl.h>

#include <cctype>
#include <cstring>
#include <optional>
#include <string_view>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "binding.h"

namespace ferry::python {
namespace {

static_assert(sizeof(TransferOp) == 3 * sizeof(uint64_t) && std::is_standard_layout_v<TransferOp>,
              "an (n, 3) uint64 array is copied as n TransferOps");

// The ops of a batch, copied into the binding's own vector while the GIL is held: a sequence
// of (local_offset, remote_offset, size) tuples, or an (n, 3) C-contiguous uint64 array (numpy
// or any buffer) copied in one block, without a Python object per op. The engine checks and
// moves that copy, so a thread that changes the array while the batch is posted changes
// nothing the engine reads.
class Ops {
 public:
  explicit Ops(const py::object& obj) {
    if (PyObject_CheckBuffer(obj.ptr()) && !PyBytes_Check(obj.ptr()) &&
        !PyByteArray_Check(obj.ptr())) {
      FromBuffer(obj);
    } else {
      FromSequence(obj);
    }
  }
  // The ops, moved out. Call once.
  std::vector<TransferOp> Take() { return std::move(ops_); }

 private:
  // An (n, 3) array of any integer type (numpy's default int64, int32, uint32, ...), any
  // strides; negative values are refused. uint64 in C order is copied in one block.
  void FromBuffer(const py::object& obj) {
    py::buffer_info b = py::reinterpret_borrow<py::buffer>(obj).request();
    std::string format = b.format;
    char order = '@';
    if (!format.empty() && std::string_view("@=<>!").find(format[0]) != std::string_view::npos) {
      order = format[0];
      format.erase(0, 1);
    }
    const bool little = order == '@' || order == '=' || order == '<';
    const bool integer = format.size() == 1 && std::string_view("bBhHiIlLqQnN").find(format[0]) != std::string_view::npos;
    if (b.ndim != 2 || b.shape[1] != 3 || !integer || !little || b.itemsize > 8)
      ThrowInvalid("an ops array must be integers of shape (n, 3); got format '" + b.format + "' with " +
                   std::to_string(b.ndim) + " dimensions" +
                   (b.ndim == 2 ? " of shape (" + std::to_string(b.shape[0]) + ", " + std::to_string(b.shape[1]) + ")" : ""));
    const size_t n = static_cast<size_t>(b.shape[0]);
    const bool is_signed = std::islower(static_cast<unsigned char>(format[0])) != 0;
    if (!is_signed && b.itemsize == 8 && (n <= 1 || b.strides[0] == 24) && b.strides[1] == 8) {
      const auto* first = static_cast<const TransferOp*>(b.ptr);
      ops_.assign(first, first + n);
      return;
    }
    ops_.resize(n);
    const auto* base = static_cast<const char*>(b.ptr);
    const size_t size = static_cast<size_t>(b.itemsize);
    for (size_t i = 0; i < n; ++i) {
      uint64_t v[3];
      for (size_t j = 0; j < 3; ++j) {
        const char* at = base + static_cast<ptrdiff_t>(i) * b.strides[0] + static_cast<ptrdiff_t>(j) * b.strides[1];
        uint64_t raw = 0;
        std::memcpy(&raw, at, size);  // little-endian: the low bytes
        if (is_signed && size < 8 && (raw >> (8 * size - 1)) & 1) raw |= ~uint64_t{0} << (8 * size);
        if (is_signed && static_cast<int64_t>(raw) < 0)
          ThrowInvalid("op " + std::to_string(i) + " has a negative value (" +
                       std::to_string(static_cast<int64_t>(raw)) + "); offsets and sizes are non-negative");
        v[j] = raw;
      }
      ops_[i] = TransferOp{v[0], v[1], v[2]};
    }
  }

  void FromSequence(const py::object& obj) {
    if (!PySequence_Check(obj.ptr()) || PyUnicode_Check(obj.ptr()))
      throw py::type_error(
          "ops must be a sequence of (local_offset, remote_offset, size) or an "
          "(n, 3) uint64 array");
    py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    ops_.reserve(seq.size());
    for (size_t i = 0; i < seq.size(); ++i) {
      py::object item = seq[i];
      try {
        auto [l, r, n] = item.cast<std::tuple<uint64_t, uint64_t, uint64_t>>();
        ops_.push_back({l, r, n});
      } catch (const py::cast_error&) {
        ThrowInvalid("op " + std::to_string(i) +
                     " is not three non-negative integers: " + std::string(py::repr(item)));
      }
    }
  }

  std::vector<TransferOp> ops_;
};

TransferOptions MakeTransferOptions(std::optional<double> deadline_ms,
                                    std::optional<std::string> notification,
                                    std::optional<uint64_t> transfer_id, std::string topic,
                                    std::optional<std::vector<Transfer>> after,
                                    const py::object& on_complete) {
  TransferOptions o;
  if (deadline_ms) o.deadline = Millis(*deadline_ms, "deadline_ms");
  o.notification = std::move(notification);
  if (transfer_id) o.id = static_cast<TransferId>(*transfer_id);
  o.notification_topic = std::move(topic);
  if (after) o.after = std::move(*after);
  o.on_complete = CompletionCallback(on_complete);
  return o;
}

// True / False (timeout) / raises, as Transfer.wait().
bool WaitResult(const Status& s) {
  if (s.code() == Code::kInProgress) return false;
  Check(s);
  return true;
}

std::optional<Duration> Timeout(std::optional<double> timeout_ms) {
  if (!timeout_ms) return std::nullopt;
  return Millis(*timeout_ms, "timeout_ms");
}

}  // namespace

void BindTransfer(py::module_& m) {
  m.def(
      "wait_all",
      [](const std::vector<Transfer>& transfers, std::optional<double> timeout_ms) {
        std::optional<Duration> timeout = Timeout(timeout_ms);
        Status s;
        {
          py::gil_scoped_release nogil;
          s = timeout ? WaitAll(transfers, *timeout) : WaitAll(transfers);
        }
        return WaitResult(s);
      },
      py::arg("transfers"), py::kw_only(), py::arg("timeout_ms") = py::none(),
      "Blocks (without the GIL) until every transfer finished. True when all succeeded; raises\n"
      "the first failure (in finishing order) as soon as one fails; False if timeout_ms passed\n"
      "first. Bounded by the earliest deadline among them (DEADLINE_EXCEEDED).");
  m.def(
      "wait_any",
      [](const std::vector<Transfer>& transfers, std::optional<double> timeout_ms) -> std::optional<size_t> {
        std::optional<Duration> timeout = Timeout(timeout_ms);
        Result<size_t> r = Status(Code::kInternal, "not waited");
        {
          py::gil_scoped_release nogil;
          r = timeout ? WaitAny(transfers, *timeout) : WaitAny(transfers);
        }
        if (!r.ok() && r.status().code() == Code::kInProgress) return std::nullopt;
        if (!r.ok()) Throw(r.status());
        return *r;
      },
      py::arg("transfers"), py::kw_only(), py::arg("timeout_ms") = py::none(),
      "Blocks (without the GIL) until one transfer finished and returns its index (the lowest\n"
      "when several have; check its status); None if timeout_ms passed first. Raises\n"
      "DEADLINE_EXCEEDED when the earliest deadline among them passes with none finished\n"
      "(that transfer has then failed), INVALID_ARGUMENT for an empty list.");

  py::class_<TransferPath>(m, "TransferPath", "How a transfer travels: transport and staging.")
      .def_readonly("transport", &TransferPath::transport, "Name of the transport.")
      .def_readonly("staged", &TransferPath::staged, "True when data goes through a bounce buffer.")
      .def("__str__", &TransferPath::ToString)
      .def("__repr__",
           [](const TransferPath& p) { return "<ferry.TransferPath " + p.ToString() + ">"; })
      .def("__eq__", [](const TransferPath& a, const TransferPath& b) {
        return a.transport == b.transport && a.staged == b.staged;
      });

  py::class_<Transfer>(m, "Transfer",
                       "A posted read or write (single or batch); completes asynchronously.")
      .def("test", &Transfer::Test, "True once finished, successfully or not. Never blocks.")
      .def(
          "wait",
          [](const Transfer& t, std::optional<double> timeout_ms) {
            std::optional<Duration> timeout;
            if (timeout_ms) timeout = Millis(*timeout_ms, "timeout_ms");
            Status s;
            {
              py::gil_scoped_release nogil;
              s = timeout ? t.WaitFor(*timeout) : t.Wait();
            }
            if (s.code() == Code::kInProgress) return false;
            Check(s);
            return true;
          },
          py::arg("timeout_ms") = py::none(),
          "Blocks (without the GIL) until the transfer finishes or its deadline passes.\n\n"
          "Returns True on success, False if timeout_ms elapsed first (the transfer keeps\n"
          "running); raises ferry.Error if the transfer failed.")
      .def(
          "status",
          [](const Transfer& t) {
            Status s = t.status();
            return py::make_tuple(std::string(CodeName(s.code())), std::string(s.message()));
          },
          "(code, message): (\"IN_PROGRESS\", ...) while running, (\"OK\", \"\") on success.")
      .def(
          "succeeded", [](const Transfer& t) { return t.Test() && t.status().ok(); },
          "True once finished successfully. Never blocks.")
      .def_property_readonly("bytes", &Transfer::bytes, "Bytes the transfer moves.")
      .def_property_readonly("path", &Transfer::path, "The TransferPath taken.")
      .def_property_readonly(
          "id", [](const Transfer& t) { return static_cast<uint64_t>(t.id()); },
          "The transfer id (Engine.allocate_transfer_id() by default).")
      .def("__repr__", [](const Transfer& t) {
        Status s = t.status();
        return "<ferry.Transfer id=" + std::to_string(static_cast<uint64_t>(t.id())) + " " +
               std::string(CodeName(s.code())) + " bytes=" + std::to_string(t.bytes()) + " " +
               t.path().ToString() + ">";
      });
}

void BindSession(py::module_& m) {
  auto post_one = [](Op op) {
    return [op](const Session& s, uint64_t local_offset, uint64_t remote_offset, uint64_t size,
                std::optional<double> deadline_ms, std::optional<std::string> notification,
                std::optional<uint64_t> transfer_id, std::string topic,
                std::optional<std::vector<Transfer>> after, const py::object& on_complete) {
      TransferOptions o = MakeTransferOptions(deadline_ms, std::move(notification), transfer_id,
                                              std::move(topic), std::move(after), on_complete);
      py::gil_scoped_release nogil;
      return op == Op::kWrite ? s.Write(local_offset, remote_offset, size, o)
                              : s.Read(local_offset, remote_offset, size, o);
    };
  };
  auto post_batch = [](Op op) {
    return [op](const Session& s, const py::object& ops, std::optional<double> deadline_ms,
                std::optional<std::string> notification, std::optional<uint64_t> transfer_id,
                std::string topic, std::optional<std::vector<Transfer>> after,
                const py::object& on_complete) {
      TransferOptions o = MakeTransferOptions(deadline_ms, std::move(notification), transfer_id,
                                              std::move(topic), std::move(after), on_complete);
      std::vector<TransferOp> batch = Ops(ops).Take();
      py::gil_scoped_release nogil;
      return s.Post(op, std::move(batch), o);
    };
  };
  const char* kWriteDoc =
      "Posts a write of `size` bytes from local[local_offset:] to remote[remote_offset:].\n\n"
      "deadline_ms overrides the engine's default deadline; notification (bytes or str) is\n"
      "delivered to the remote engine after the data is in place, on notification_topic ('' by\n"
      "default; the receiver's pop_notifications(topic=...)); transfer_id sets the id.\n"
      "after=[transfers]: this transfer finishes (and its notification leaves) only once each of\n"
      "them finished OK (any session of the engine); if one failed, it fails with that error and\n"
      "no notification is sent. on_complete=fn: fn(code, message) is called once when the\n"
      "transfer ends, with the GIL acquired, on the engine's completion thread (or at once on\n"
      "this thread if the transfer was refused); it may post transfers, and should be short.\n"
      "Errors (e.g. OUT_OF_RANGE) are reported by the returned Transfer.";
  const char* kReadDoc =
      "Posts a read of `size` bytes from remote[remote_offset:] to local[local_offset:].\n\n"
      "deadline_ms, transfer_id, after and on_complete as for write(); reads carry no\n"
      "notification. Errors are reported by the returned Transfer.";
  const char* kBatchDoc =
      "Posts a batch as one transfer. ops: a list of (local_offset, remote_offset, size)\n"
      "tuples, or an integer array of shape (n, 3) of any integer dtype (numpy's int64,\n"
      "uint64, int32, ...; negative values refused; copied when posted). If any op\n"
      "is out of range the whole batch fails with OUT_OF_RANGE before any byte moves. Options\n"
      "as for write() and read().";

  py::class_<Session>(m, "Session",
                      "A route from one local region to one remote region (Engine.open_session()).")
      .def("write", post_one(Op::kWrite), py::arg("local_offset"), py::arg("remote_offset"),
           py::arg("size"), py::kw_only(), py::arg("deadline_ms") = py::none(),
           py::arg("notification") = py::none(), py::arg("transfer_id") = py::none(),
           py::arg("notification_topic") = "", py::arg("after") = py::none(),
           py::arg("on_complete") = py::none(), kWriteDoc)
      .def("read", post_one(Op::kRead), py::arg("local_offset"), py::arg("remote_offset"),
           py::arg("size"), py::kw_only(), py::arg("deadline_ms") = py::none(),
           py::arg("notification") = py::none(), py::arg("transfer_id") = py::none(),
           py::arg("notification_topic") = "", py::arg("after") = py::none(),
           py::arg("on_complete") = py::none(), kReadDoc)
      .def("write_batch", post_batch(Op::kWrite), py::arg("ops"), py::kw_only(),
           py::arg("deadline_ms") = py::none(), py::arg("notification") = py::none(),
           py::arg("transfer_id") = py::none(), py::arg("notification_topic") = "",
           py::arg("after") = py::none(), py::arg("on_complete") = py::none(), kBatchDoc)
      .def("read_batch", post_batch(Op::kRead), py::arg("ops"), py::kw_only(),
           py::arg("deadline_ms") = py::none(), py::arg("notification") = py::none(),
           py::arg("transfer_id") = py::none(), py::arg("notification_topic") = "",
           py::arg("after") = py::none(), py::arg("on_complete") = py::none(), kBatchDoc)
      .def_property_readonly("local", &Session::local, "The local MemoryDesc.")
      .def_property_readonly("remote", &Session::remote, "The remote MemoryDesc.")
      .def_property_readonly("path", &Session::path, "The TransferPath this session uses.")
      .def_property_readonly("connected", &Session::connected,
                             "False once the connection under the session failed; open a new one.")
      .def("__repr__", [](const Session& s) {
        return "<ferry.Session " + std::to_string(static_cast<uint64_t>(s.local().region)) +
               " -> " + s.remote().engine_key + "/" +
               std::to_string(static_cast<uint64_t>(s.remote().region)) + " via " +
               s.path().ToString() + ">";
      });
}

}  // namespace ferry::python
