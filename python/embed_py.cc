// ferry.embed: the embedding-offload core (ferry/embed.h) for Python: Config and Layout (row ids
// of numpy inputs), Table (synthetic or safetensors), Gatherer (rows into a numpy array).
// Integer inputs may be any numpy integer dtype; values are read as int32 with out-of-range
// values saturated (so a huge id still fails as >= V and a huge query start as past the end).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "binding.h"
#include "ferry/embed.h"

namespace ferry::python {
namespace {

using embed::Config;
using embed::Layout;
using embed::Table;

std::vector<int32_t> Int32s(const py::handle& obj, const char* what) {
  py::array arr = py::array::ensure(obj);
  if (!arr) ThrowInvalid(std::string(what) + " must be an array of integers");
  const char kind = arr.dtype().kind();
  if (arr.size() > 0 && kind != 'i' && kind != 'u')
    ThrowInvalid(std::string(what) + " must have an integer dtype, not " +
                 std::string(py::str(arr.dtype())));
  auto wide = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  if (!wide) ThrowInvalid(std::string(what) + " could not be read as integers");
  std::vector<int32_t> out(static_cast<size_t>(wide.size()));
  const int64_t* p = wide.data();
  // forcecast wraps uint64 values above 2^63 - 1 to negative int64: saturate them instead.
  const bool unsigned_src = kind == 'u';
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t v = p[i];
    if (unsigned_src && v < 0) v = std::numeric_limits<int64_t>::max();
    out[i] = static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(),
                                                      std::numeric_limits<int32_t>::max()));
  }
  return out;
}

struct StepArrays {
  std::vector<int32_t> tokens, qsl, ctx;
  embed::StepInput input() const { return embed::StepInput{tokens, qsl, ctx}; }
};

StepArrays Step(const py::handle& tokens, const py::handle& qsl, const py::handle& ctx) {
  return StepArrays{Int32s(tokens, "tokens"), Int32s(qsl, "query_start_loc"),
                    Int32s(ctx, "ngram_context")};
}

// A writable, C-contiguous numpy array's bytes.
std::span<uint8_t> Writable(py::array& out) {
  if (!(out.flags() & py::array::c_style)) ThrowInvalid("out must be C-contiguous");
  if (!out.writeable()) ThrowInvalid("out must be writable");
  return std::span<uint8_t>(static_cast<uint8_t*>(out.mutable_data()),
                            static_cast<size_t>(out.nbytes()));
}

// threads - 1 workers (the caller is the first); RESOURCE_EXHAUSTED when one cannot start.
embed::Workers PoolFor(int threads) {
  if (threads < 1 || threads > embed::kMaxGatherThreads)
    ThrowInvalid("threads must be in [1, " + std::to_string(embed::kMaxGatherThreads) + "]");
  if (threads == 1) return nullptr;
  return Unwrap(embed::MakeWorkers(threads - 1, "embed-py"));
}

}  // namespace

void BindEmbed(py::module_& parent) {
  py::module_ m =
      parent.def_submodule("embed", "The embedding-offload core: row ids, tables, gathers.");
  m.attr("PADDING_ROW") = embed::kPaddingRow;

  py::class_<Config>(m, "Config", "The n-gram embedding configuration (see ferry/embed.h).")
      .def(py::init([](int64_t vocab_size, int64_t eos_id, int ngram_size, int heads_per_ngram,
                       int64_t embed_dim, uint64_t base_vocab, uint64_t row_padding, uint64_t seed,
                       int layer) {
             Config c;
             c.vocab_size = vocab_size;
             c.eos_id = eos_id;
             c.ngram_size = ngram_size;
             c.heads_per_ngram = heads_per_ngram;
             c.embed_dim = embed_dim;
             c.base_vocab = base_vocab;
             c.row_padding = row_padding;
             c.seed = seed;
             c.layer = layer;
             return c;
           }),
           py::kw_only(), py::arg("vocab_size"), py::arg("eos_id"), py::arg("ngram_size"),
           py::arg("heads_per_ngram"), py::arg("embed_dim"), py::arg("base_vocab"),
           py::arg("row_padding") = 128, py::arg("seed") = 1234, py::arg("layer") = 0)
      .def_static("model", &Config::Model, py::arg("eos_id"), py::arg("layer") = 0,
                  "The model's configuration: V 248320, N 3, H 8, E 2560, B 2e7, P 128, S 1234.")
      .def_readwrite("vocab_size", &Config::vocab_size)
      .def_readwrite("eos_id", &Config::eos_id)
      .def_readwrite("ngram_size", &Config::ngram_size)
      .def_readwrite("heads_per_ngram", &Config::heads_per_ngram)
      .def_readwrite("embed_dim", &Config::embed_dim)
      .def_readwrite("base_vocab", &Config::base_vocab)
      .def_readwrite("row_padding", &Config::row_padding)
      .def_readwrite("seed", &Config::seed)
      .def_readwrite("layer", &Config::layer)
      .def("__repr__", [](const Config& c) { return "ferry.embed.Config(" + c.ToString() + ")"; });

  py::class_<Layout>(m, "Layout", "Multipliers, head sizes and offsets derived from a Config.")
      .def(py::init([](const Config& c) { return Unwrap(Layout::Create(c)); }), py::arg("config"))
      .def_property_readonly("config", &Layout::config)
      .def_property_readonly("ngram_size", &Layout::ngram_size)
      .def_property_readonly("num_heads", &Layout::num_heads)
      .def_property_readonly("head_dim", &Layout::head_dim)
      .def_property_readonly("multipliers", &Layout::multipliers)
      .def_property_readonly("head_sizes", &Layout::head_sizes)
      .def_property_readonly("head_offsets", &Layout::head_offsets)
      .def_property_readonly("used_rows", &Layout::used_rows)
      .def_property_readonly("table_rows", &Layout::table_rows)
      .def(
          "row_ids",
          [](const Layout& l, const py::handle& tokens, const py::handle& qsl,
             const py::handle& ctx, int threads) {
            StepArrays step = Step(tokens, qsl, ctx);
            auto pool = PoolFor(threads);
            py::array_t<uint64_t> out({static_cast<py::ssize_t>(step.tokens.size()),
                                       static_cast<py::ssize_t>(l.num_heads())});
            std::span<uint64_t> ids(out.mutable_data(), static_cast<size_t>(out.size()));
            Status s;
            {
              py::gil_scoped_release nogil;
              s = embed::ComputeRowIds(l, step.input(), ids, pool.get());
            }
            Check(s);
            return out;
          },
          py::arg("tokens"), py::arg("query_start_loc"), py::arg("ngram_context"),
          py::arg("threads") = 1,
          "Row ids [num_tokens, G] (uint64; PADDING_ROW for tokens past the last request).");

  py::class_<Table, std::shared_ptr<Table>>(m, "Table", "Embedding rows in host memory.")
      .def_static(
          "synthetic",
          [](const Layout& l, const std::string& dtype, uint64_t rows, int threads) {
            embed::Dtype d = Unwrap(embed::ParseDtype(dtype));
            auto pool = PoolFor(threads);
            Result<std::unique_ptr<Table>> t = Status(Code::kInternal, "unset");
            {
              py::gil_scoped_release nogil;
              t = Table::Synthetic(l, d, pool.get(), rows);
            }
            return std::shared_ptr<Table>(Unwrap(std::move(t)));
          },
          py::arg("layout"), py::arg("dtype") = "bf16", py::arg("rows") = 0, py::arg("threads") = 1,
          "A table filled with synthetic_row(r) (rows 0: the layout's).")
      .def_static(
          "open",
          [](const Layout& l, const std::vector<std::string>& paths, const std::string& name,
             bool populate) {
            Table::OpenOptions options;
            options.tensor_name = name;
            options.populate = populate;
            Result<std::unique_ptr<Table>> t = Status(Code::kInternal, "unset");
            {
              py::gil_scoped_release nogil;
              t = Table::Open(l, paths, options);
            }
            return std::shared_ptr<Table>(Unwrap(std::move(t)));
          },
          py::arg("layout"), py::arg("paths"), py::arg("tensor_name") = "",
          py::arg("populate") = false, "Memory-maps the table from safetensors files.")
      .def_property_readonly("rows", &Table::rows)
      .def_property_readonly("row_bytes", &Table::row_bytes)
      .def_property_readonly("nbytes", &Table::bytes)
      .def_property_readonly(
          "dtype", [](const Table& t) { return std::string(embed::DtypeName(t.dtype())); })
      .def_property_readonly("num_segments", [](const Table& t) { return t.segments().size(); })
      .def(
          "row",
          [](const Table& t, uint64_t r) {
            if (r >= t.rows())
              Throw(Status(Code::kOutOfRange,
                           "row " + std::to_string(r) + " >= " + std::to_string(t.rows())));
            return py::bytes(reinterpret_cast<const char*>(t.Row(r)), t.row_bytes());
          },
          py::arg("row"), "The bytes of one row.")
      .def(
          "array",
          [](const std::shared_ptr<Table>& t) {
            if (t->data() == nullptr)
              Throw(Status(Code::kFailedPrecondition,
                           "a table of several files has no single array"));
            py::array_t<uint8_t> a(
                {static_cast<py::ssize_t>(t->rows()), static_cast<py::ssize_t>(t->row_bytes())},
                t->data(), py::cast(t));
            py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            return a;
          },
          "A read-only uint8 view [rows, row_bytes] of the rows (no copy; keeps the table alive).");

  py::class_<embed::Gatherer>(m, "Gatherer", "Gathers a step's rows with a pool of threads.")
      .def(py::init([](int threads, int64_t chunk_tokens, int prefetch_rows) {
             return Unwrap(embed::Gatherer::Create({.threads = threads,
                                                    .chunk_tokens = chunk_tokens,
                                                    .prefetch_rows = prefetch_rows}));
           }),
           py::arg("threads") = 1, py::arg("chunk_tokens") = 32, py::arg("prefetch_rows") = 32)
      .def(
          "gather",
          [](embed::Gatherer& g, const Table& t, py::array_t<uint64_t, py::array::c_style> ids,
             py::array out) {
            if (ids.ndim() != 2) ThrowInvalid("row_ids must be [num_tokens, heads]");
            std::span<uint8_t> dst = Writable(out);
            std::span<const uint64_t> span(ids.data(), static_cast<size_t>(ids.size()));
            Status s;
            {
              py::gil_scoped_release nogil;
              s = g.Gather(t, static_cast<int>(ids.shape(1)), span, dst);
            }
            Check(s);
          },
          py::arg("table"), py::arg("row_ids"), py::arg("out"),
          "Writes the rows of row_ids ([T, G] uint64) into out (T x G x row_bytes bytes).")
      .def(
          "gather_step",
          [](embed::Gatherer& g, const Layout& l, const Table& t, const py::handle& tokens,
             const py::handle& qsl, const py::handle& ctx, py::array out) {
            StepArrays step = Step(tokens, qsl, ctx);
            std::span<uint8_t> dst = Writable(out);
            Status s;
            {
              py::gil_scoped_release nogil;
              s = g.GatherStep(l, t, step.input(), dst);
            }
            Check(s);
          },
          py::arg("layout"), py::arg("table"), py::arg("tokens"), py::arg("query_start_loc"),
          py::arg("ngram_context"), py::arg("out"),
          "Computes a step's row ids and writes its rows into out ([T, E] values).");

  m.def(
      "synthetic_row",
      [](uint64_t row, uint64_t row_bytes) {
        if (row_bytes > (1u << 20)) ThrowInvalid("row_bytes too large");
        std::string out(row_bytes, '\0');
        embed::SyntheticRow(row, row_bytes, reinterpret_cast<uint8_t*>(out.data()));
        return py::bytes(out);
      },
      py::arg("row"), py::arg("row_bytes"), "The synthetic table's bytes of one row.");
}

}  // namespace ferry::python
