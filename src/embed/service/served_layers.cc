#include "embed/service/served_layers.h"

#include <algorithm>

#include "embed/table.h"

namespace ferry::embed::service {

Result<std::vector<ServedLayer>> MakeServedLayers(const Config& base,
                                                  std::span<const uint32_t> layers, Dtype dtype,
                                                  std::span<const std::string> files,
                                                  uint64_t synthetic_rows, ThreadPool* pool,
                                                  Status* pin) {
  auto pin_table = [pin](Table& t) {
    if (pin == nullptr) return;
    Status s = t.Pin();
    if (pin->ok()) *pin = s;
  };
  if (pin != nullptr) *pin = Status::Ok();
  if (layers.empty()) return Status(Code::kInvalidArgument, "no layers to serve");
  if (!files.empty() && files.size() != layers.size())
    return Status(Code::kInvalidArgument, std::to_string(files.size()) + " table files for " +
                                              std::to_string(layers.size()) + " layers");
  std::vector<Layout> layouts;
  uint64_t rows = 0;
  for (uint32_t l : layers) {
    Config c = base;
    c.layer = static_cast<int>(l);
    FERRY_ASSIGN_OR_RETURN(Layout layout, Layout::Create(c));
    rows = std::max(rows, layout.table_rows());
    layouts.push_back(std::move(layout));
  }
  std::vector<ServedLayer> out;
  if (files.empty()) {
    FERRY_ASSIGN_OR_RETURN(
        std::unique_ptr<Table> table,
        Table::Synthetic(layouts[0], dtype, pool, synthetic_rows != 0 ? synthetic_rows : rows));
    pin_table(*table);
    std::shared_ptr<const Table> shared = std::move(table);
    for (Layout& l : layouts) out.push_back(ServedLayer{std::move(l), shared});
    return out;
  }
  for (size_t i = 0; i < layouts.size(); ++i) {
    std::string path = files[i];
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Table> table,
                           Table::Open(layouts[i], std::span<const std::string>(&path, 1), {}));
    if (table->dtype() != dtype)
      return Status(Code::kInvalidArgument, path + " holds " +
                                                std::string(DtypeName(table->dtype())) + ", not " +
                                                std::string(DtypeName(dtype)));
    pin_table(*table);
    out.push_back(ServedLayer{std::move(layouts[i]), std::move(table)});
  }
  return out;
}

}  // namespace ferry::embed::service
