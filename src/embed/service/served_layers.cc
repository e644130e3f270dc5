// Setting up a server (ferry/embed_server.h): the layers it serves (MakeServedLayers), the
// memory it may take (AvailableMemoryBytes) and the path it listens at (CheckListenPath).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <string>

#include "embed/service/unix_socket.h"
#include "ferry/embed.h"
#include "ferry/embed_server.h"

namespace ferry::embed::service {
namespace {

// The first number in a file ("max" and unreadable files: nullopt).
std::optional<uint64_t> ReadNumber(const char* path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

// "95.10 GiB", "32.0 MiB".
std::string Size(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  else
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1ull << 20));
  return buf;
}

}  // namespace

Status CheckListenPath(const std::string& path) { return os::CheckListenPath(path); }

uint64_t AvailableMemoryBytes() {
  uint64_t avail = std::numeric_limits<uint64_t>::max();
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      avail = kib * 1024;
      break;
    }
  }
  std::optional<uint64_t> max = ReadNumber("/sys/fs/cgroup/memory.max");
  std::optional<uint64_t> current = ReadNumber("/sys/fs/cgroup/memory.current");
  if (max && current) avail = std::min(avail, *max > *current ? *max - *current : 0);
  return avail;
}

Result<std::vector<ServedLayer>> MakeServedLayers(const Config& base,
                                                  std::span<const uint32_t> layers, Dtype dtype,
                                                  std::span<const std::string> files,
                                                  uint64_t synthetic_rows, ThreadPool* pool,
                                                  Status* pin, uint64_t memory_limit) {
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
    const uint64_t want_rows = synthetic_rows != 0 ? synthetic_rows : rows;
    FERRY_ASSIGN_OR_RETURN(uint64_t row_bytes, RowBytes(dtype, layouts[0].head_dim()));
    uint64_t bytes = 0;
    const uint64_t limit = memory_limit != 0 ? memory_limit : AvailableMemoryBytes();
    const bool overflow = __builtin_mul_overflow(want_rows, row_bytes, &bytes);
    if (overflow || bytes > limit)
      return Status(Code::kResourceExhausted,
                    "the synthetic table of " + std::to_string(want_rows) + " rows x " +
                        std::to_string(row_bytes) + " bytes needs " +
                        (overflow ? std::string("more than 2^64 bytes") : Size(bytes)) +
                        ", more than the " + Size(limit) + " of memory available");
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
