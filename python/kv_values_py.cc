// ferry.kv's value types: TensorLayout, LayerLayout, CacheLayout (make_layout, check_compatible),
// WorkerId, WorkerMetadata and ReadParams, with pack()/unpack() and pickling where C++ has them.
// The Connector is in kv_py.cc.
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "ferry/kv.h"

namespace ferry::python {
namespace {

using kv::CacheLayout;
using kv::LayerLayout;
using kv::TensorLayout;

std::string Repr(const TensorLayout& t) {
  return "TensorLayout(region=" + std::to_string(t.region) + ", offset=" + std::to_string(t.offset) +
         ", block_stride=" + std::to_string(t.block_stride) + ", token_stride=" + std::to_string(t.token_stride) +
         ", head_stride=" + std::to_string(t.head_stride) + ")";
}

// pack() / unpack() / pickling for a type with Pack() and static Unpack().
template <typename T, typename Class>
void Packable(Class& cls) {
  cls.def(
         "pack", [](const T& v) { return py::bytes(v.Pack()); }, "The versioned msgpack encoding, as bytes.")
      .def_static(
          "unpack", [](const py::object& b) { return Unwrap(T::Unpack(BytesOf(b, "packed"))); },
          py::arg("packed"), "Decodes pack()'s bytes; raises ferry.Error on malformed input.")
      .def(py::pickle([](const T& v) { return py::make_tuple(py::bytes(v.Pack())); },
                      [](const py::tuple& t) { return Unwrap(T::Unpack(BytesOf(t[0], "state"))); }));
}

CacheLayout MakeCacheLayout(std::string model, uint32_t dtype_bytes, uint32_t head_dim, uint32_t total_kv_heads,
                            bool mla, uint32_t num_layers, uint32_t tp_rank, uint32_t tp_size, uint32_t dp_rank,
                            uint32_t block_tokens, uint32_t kernel_block_tokens, uint64_t num_blocks,
                            std::vector<uint64_t> region_bytes, std::vector<LayerLayout> layers) {
  CacheLayout l;
  l.model = std::move(model);
  l.dtype_bytes = dtype_bytes;
  l.head_dim = head_dim;
  l.total_kv_heads = total_kv_heads;
  l.mla = mla;
  l.num_layers = num_layers;
  l.tp_rank = tp_rank;
  l.tp_size = tp_size;
  l.dp_rank = dp_rank;
  l.block_tokens = block_tokens;
  l.kernel_block_tokens = kernel_block_tokens;
  l.num_blocks = num_blocks;
  l.region_bytes = std::move(region_bytes);
  l.layers = std::move(layers);
  return l;
}

}  // namespace

void BindKvValues(py::module_& m) {
  m.attr("KV_VERSION") = kv::kKvVersion;
  m.attr("TOPIC") = std::string(kv::kTopic);
  m.attr("MAX_LAYERS") = kv::kMaxLayers;
  m.attr("MAX_REGIONS") = kv::kMaxRegions;
  m.attr("MAX_TP_SIZE") = kv::kMaxTpSize;
  m.attr("MAX_HEADS") = kv::kMaxHeads;
  py::list orders;
  for (auto o : {kv::TensorOrder::kKvFirst, kv::TensorOrder::kKvFirstHnd, kv::TensorOrder::kBlocksFirst,
                 kv::TensorOrder::kBlocksFirstHnd, kv::TensorOrder::kSeparate, kv::TensorOrder::kSeparateHnd,
                 kv::TensorOrder::kMla})
    orders.append(std::string(kv::TensorOrderName(o)));
  m.attr("TENSOR_ORDERS") = py::tuple(orders);

  py::class_<TensorLayout>(m, "TensorLayout",
                           "Where one tensor (K, V or an MLA latent) of one layer lives in a region, as byte\n"
                           "strides: (kernel block b, token t, local head h, byte i) is at offset +\n"
                           "b * block_stride + t * token_stride + h * head_stride + i.")
      .def(py::init([](uint32_t region, uint64_t offset, uint64_t block_stride, uint64_t token_stride,
                       uint64_t head_stride) {
             return TensorLayout{region, offset, block_stride, token_stride, head_stride};
           }),
           py::kw_only(), py::arg("region") = 0, py::arg("offset") = 0, py::arg("block_stride") = 0,
           py::arg("token_stride") = 0, py::arg("head_stride") = 0)
      .def_readwrite("region", &TensorLayout::region)
      .def_readwrite("offset", &TensorLayout::offset)
      .def_readwrite("block_stride", &TensorLayout::block_stride)
      .def_readwrite("token_stride", &TensorLayout::token_stride)
      .def_readwrite("head_stride", &TensorLayout::head_stride)
      .def(py::self == py::self)
      .def("__repr__", &Repr);

  py::class_<LayerLayout>(m, "LayerLayout", "One layer: K and V (v is None for MLA).")
      .def(py::init([](const TensorLayout& k, std::optional<TensorLayout> v) { return LayerLayout{k, v}; }),
           py::arg("k"), py::arg("v") = py::none())
      .def_readwrite("k", &LayerLayout::k)
      .def_readwrite("v", &LayerLayout::v)
      .def(py::self == py::self)
      .def("__repr__", [](const LayerLayout& l) {
        return "LayerLayout(k=" + Repr(l.k) + ", v=" + (l.v ? Repr(*l.v) : std::string("None")) + ")";
      });

  CacheLayout d;
  py::class_<CacheLayout> layout(
      m, "CacheLayout",
      "A worker's KV cache: the model's identity (model, dtype_bytes, head_dim, total_kv_heads,\n"
      "mla, num_layers: these must agree between peers), its TP/DP slice, block sizes, the\n"
      "regions' sizes and every layer's K/V placement. make_layout() fills region_bytes and\n"
      "layers for the standard tensor orders; ferry.kv.register_kv_caches() reads them from\n"
      "tensors. List fields (region_bytes, layers) are copies: assign a whole list to change them.");
  layout
      .def(py::init(&MakeCacheLayout), py::kw_only(), py::arg("model") = d.model,
           py::arg("dtype_bytes") = d.dtype_bytes, py::arg("head_dim") = d.head_dim,
           py::arg("total_kv_heads") = d.total_kv_heads, py::arg("mla") = d.mla,
           py::arg("num_layers") = d.num_layers, py::arg("tp_rank") = d.tp_rank, py::arg("tp_size") = d.tp_size,
           py::arg("dp_rank") = d.dp_rank, py::arg("block_tokens") = d.block_tokens,
           py::arg("kernel_block_tokens") = d.kernel_block_tokens, py::arg("num_blocks") = d.num_blocks,
           py::arg("region_bytes") = d.region_bytes, py::arg("layers") = d.layers)
      .def_readwrite("model", &CacheLayout::model)
      .def_readwrite("dtype_bytes", &CacheLayout::dtype_bytes)
      .def_readwrite("head_dim", &CacheLayout::head_dim)
      .def_readwrite("total_kv_heads", &CacheLayout::total_kv_heads)
      .def_readwrite("mla", &CacheLayout::mla)
      .def_readwrite("num_layers", &CacheLayout::num_layers)
      .def_readwrite("tp_rank", &CacheLayout::tp_rank)
      .def_readwrite("tp_size", &CacheLayout::tp_size)
      .def_readwrite("dp_rank", &CacheLayout::dp_rank)
      .def_readwrite("block_tokens", &CacheLayout::block_tokens)
      .def_readwrite("kernel_block_tokens", &CacheLayout::kernel_block_tokens)
      .def_readwrite("num_blocks", &CacheLayout::num_blocks)
      .def_readwrite("region_bytes", &CacheLayout::region_bytes)
      .def_readwrite("layers", &CacheLayout::layers)
      .def_property_readonly("head_bytes", &CacheLayout::head_bytes)
      .def_property_readonly("kernel_block", &CacheLayout::kernel_block,
                             "The attention kernel's block in tokens (block_tokens when 0).")
      .def_property_readonly("heads", &CacheLayout::heads, "How many of the model's KV heads this worker holds.")
      .def_property_readonly("first_head", &CacheLayout::first_head)
      .def(
          "validate", [](const CacheLayout& l) { Check(l.Validate()); },
          "Raises InvalidArgumentError naming the field (and layer) that is out of bounds.")
      .def("compatibility_hash", &CacheLayout::CompatibilityHash)
      .def("copy", [](const CacheLayout& l) { return l; })
      .def(py::self == py::self)
      .def("__repr__", [](const CacheLayout& l) {
        return "<ferry.kv.CacheLayout " + l.model + " layers=" + std::to_string(l.num_layers) +
               " heads=" + std::to_string(l.heads()) + "/" + std::to_string(l.total_kv_heads) +
               " tp=" + std::to_string(l.tp_rank) + "/" + std::to_string(l.tp_size) +
               " blocks=" + std::to_string(l.num_blocks) + "x" + std::to_string(l.block_tokens) + ">";
      });
  Packable<CacheLayout>(layout);

  m.def(
      "make_layout",
      [](const CacheLayout& identity, const std::string& order, bool one_region) {
        return Unwrap(kv::MakeLayout(identity, Unwrap(kv::ParseTensorOrder(order)), one_region));
      },
      py::arg("layout"), py::arg("order"), py::kw_only(), py::arg("one_region") = false,
      "A copy of `layout` (identity fields set) with region_bytes and layers filled for `order`\n"
      "(one of TENSOR_ORDERS): one region per layer (per tensor for 'separate*'), or every layer\n"
      "in one region when one_region. Validated.");
  m.def(
      "check_compatible", [](const CacheLayout& a, const CacheLayout& b) { Check(kv::CheckCompatible(a, b)); },
      py::arg("a"), py::arg("b"),
      "Returns when a producer and a consumer of these layouts may exchange KV; otherwise raises\n"
      "InvalidArgumentError naming the first field that differs (\"head_dim: 128 vs 64\").");

  py::class_<kv::WorkerId>(m, "WorkerId", "A worker's name: its instance, DP rank and TP rank.")
      .def(py::init([](std::string instance, uint32_t dp_rank, uint32_t tp_rank) {
             return kv::WorkerId{std::move(instance), dp_rank, tp_rank};
           }),
           py::arg("instance") = "", py::arg("dp_rank") = 0, py::arg("tp_rank") = 0)
      .def_readwrite("instance", &kv::WorkerId::instance)
      .def_readwrite("dp_rank", &kv::WorkerId::dp_rank)
      .def_readwrite("tp_rank", &kv::WorkerId::tp_rank)
      .def(py::self == py::self)
      .def(py::self < py::self)
      .def("__hash__",
           [](const kv::WorkerId& w) { return py::hash(py::make_tuple(w.instance, w.dp_rank, w.tp_rank)); })
      .def("__str__", &kv::WorkerId::ToString)
      .def("__repr__", [](const kv::WorkerId& w) { return "<ferry.kv.WorkerId " + w.ToString() + ">"; });

  py::class_<kv::WorkerMetadata> meta(m, "WorkerMetadata",
                                      "What a worker tells its peers (Connector.metadata(), unpacked).");
  meta.def_readonly("version", &kv::WorkerMetadata::version)
      .def_readonly("id", &kv::WorkerMetadata::id)
      .def_readonly("engine", &kv::WorkerMetadata::engine)
      .def_readonly("layout", &kv::WorkerMetadata::layout)
      .def_readonly("regions", &kv::WorkerMetadata::regions)
      .def_readonly("compatibility_hash", &kv::WorkerMetadata::compatibility_hash)
      .def("__repr__", [](const kv::WorkerMetadata& w) {
        return "<ferry.kv.WorkerMetadata " + w.id.ToString() + " engine=" + w.engine.key + ">";
      });
  Packable<kv::WorkerMetadata>(meta);

  py::class_<kv::ReadParams> params(m, "ReadParams",
                                    "What a producer's hold_for_read() returns, for the router to pass to\n"
                                    "the consumer's start_read() (as pack() bytes, or pickled).");
  params
      .def(py::init([](std::string request, kv::WorkerId producer, uint32_t producer_tp_size, std::string handshake,
                       std::vector<uint64_t> blocks, uint64_t num_tokens) {
             return kv::ReadParams{std::move(request), std::move(producer), producer_tp_size,
                                   std::move(handshake), std::move(blocks), num_tokens};
           }),
           py::kw_only(), py::arg("request") = "", py::arg("producer") = kv::WorkerId{},
           py::arg("producer_tp_size") = 1, py::arg("handshake") = "",
           py::arg("blocks") = std::vector<uint64_t>{}, py::arg("num_tokens") = 0)
      .def_readwrite("request", &kv::ReadParams::request)
      .def_readwrite("producer", &kv::ReadParams::producer)
      .def_readwrite("producer_tp_size", &kv::ReadParams::producer_tp_size)
      .def_readwrite("handshake", &kv::ReadParams::handshake)
      .def_readwrite("blocks", &kv::ReadParams::blocks)
      .def_readwrite("num_tokens", &kv::ReadParams::num_tokens)
      .def("__eq__", [](const kv::ReadParams& a, const kv::ReadParams& b) { return a.Pack() == b.Pack(); })
      .def("__repr__", [](const kv::ReadParams& p) {
        return "<ferry.kv.ReadParams " + p.request + " from " + p.producer.ToString() + " blocks=" +
               std::to_string(p.blocks.size()) + " tokens=" + std::to_string(p.num_tokens) + ">";
      });
  Packable<kv::ReadParams>(params);
}

}  // namespace ferry::python
