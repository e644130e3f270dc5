#include "ferry/embed.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "base/thread_pool.h"
#include "base/os.h"
#include "cuda/runtime.h"
#include "embed/config.h"
#include "embed/parallel.h"
#include "embed/safetensors.h"

namespace ferry::embed {
namespace {

constexpr uint64_t kHugePage = 2ull << 20;

struct TensorRows {
  Dtype dtype;
  uint64_t rows;  // table rows (of one head's values) the tensor holds
};

// The row dtype and row count of a file tensor: shape [rows, d] (one head's values a row), or
// [rows / G, E] (a token's G heads a row: the same bytes), in units of the dtype's elements.
Result<TensorRows> TensorLayout(const SafetensorsTensor& t, const Layout& layout,
                                const std::string& where) {
  Dtype dtype;
  if (t.dtype == "BF16")
    dtype = Dtype::kBf16;
  else if (t.dtype == "F16")
    dtype = Dtype::kF16;
  else if (t.dtype == "F32")
    dtype = Dtype::kF32;
  else if (t.dtype == "F8_E4M3")
    dtype = Dtype::kF8E4M3;
  else if (t.dtype == "U8")
    dtype = Dtype::kNvfp4;
  else
    return Status(Code::kInvalidArgument, where + ": dtype " + t.dtype +
                                              " is not a table dtype (BF16, F16, F32, "
                                              "F8_E4M3, or U8 for packed NVFP4)");
  FERRY_ASSIGN_OR_RETURN(uint64_t row_bytes, RowBytes(dtype, layout.head_dim()));
  const uint64_t columns = row_bytes / t.element_bytes;
  const uint64_t heads = static_cast<uint64_t>(layout.num_heads());
  if (t.shape.size() == 2 && t.shape[1] == columns) return TensorRows{dtype, t.shape[0]};
  if (t.shape.size() == 2 && t.shape[1] == columns * heads)
    return TensorRows{dtype, t.shape[0] * heads};  // no overflow: the bytes exist
  return Status(Code::kInvalidArgument,
                where + ": shape must be [rows, " + std::to_string(columns) + "] or [rows, " +
                    std::to_string(columns * heads) + "] for " + std::string(DtypeName(dtype)) +
                    " rows of head dim " + std::to_string(layout.head_dim()));
}

}  // namespace

void SyntheticRow(uint64_t row, uint64_t row_bytes, uint8_t* out) {
  const uint64_t base = SplitMix64(row);
  uint64_t w = 0;
  for (; (w + 1) * 8 <= row_bytes; ++w) {
    uint64_t v = base + w * kGolden;
    std::memcpy(out + w * 8, &v, 8);
  }
  if (w * 8 < row_bytes) {
    uint64_t v = base + w * kGolden;
    std::memcpy(out + w * 8, &v, row_bytes - w * 8);
  }
}

Result<std::unique_ptr<Table>> Table::Synthetic(const Layout& layout, Dtype dtype, ThreadPool* pool,
                                                uint64_t rows) {
  FERRY_ASSIGN_OR_RETURN(uint64_t row_bytes, RowBytes(dtype, layout.head_dim()));
  if (rows == 0) rows = layout.table_rows();
  if (rows < layout.used_rows())
    return Status(Code::kInvalidArgument,
                  "a synthetic table of " + std::to_string(rows) + " rows cannot hold the " +
                      std::to_string(layout.used_rows()) + " rows of the layout");
  uint64_t bytes;
  if (__builtin_mul_overflow(rows, row_bytes, &bytes) || bytes > (1ull << 48))
    return Status(Code::kInvalidArgument, "synthetic table too large");
  const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* addr = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (addr == MAP_FAILED)
    return os::ErrnoStatus("mmap of a " + std::to_string(mapped) + "-byte table", errno);
  (void)madvise(addr, mapped, MADV_HUGEPAGE);  // advice only: EINVAL without THP

  auto table = std::unique_ptr<Table>(new Table());
  table->rows_ = rows;
  table->row_bytes_ = row_bytes;
  table->dtype_ = dtype;
  table->synthetic_ = true;
  table->mappings_.push_back({addr, mapped});
  auto* data = static_cast<uint8_t*>(addr);
  table->segments_.push_back({0, rows, data});

  constexpr uint64_t kChunkRows = 1 << 14;
  std::atomic<uint64_t> cursor{0};
  const int workers = pool == nullptr ? 1 : pool->size() + 1;
  RunOnWorkers(pool, workers, [&](int) {
    for (;;) {
      uint64_t b = cursor.fetch_add(kChunkRows, std::memory_order_relaxed);
      if (b >= rows) return;
      uint64_t e = std::min(rows, b + kChunkRows);
      for (uint64_t r = b; r < e; ++r) SyntheticRow(r, row_bytes, data + r * row_bytes);
    }
  });
  return table;
}

Result<std::unique_ptr<Table>> Table::Open(const Layout& layout, std::span<const std::string> paths,
                                           const OpenOptions& options) {
  if (paths.empty()) return Status(Code::kInvalidArgument, "a table needs at least one file");
  auto table = std::unique_ptr<Table>(new Table());
  uint64_t rows = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    // O_NONBLOCK: a FIFO (or a device) would block the open until a writer comes.
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return os::ErrnoStatus("open " + path, errno);
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      int err = errno;
      close(fd);
      return os::ErrnoStatus("fstat " + path, err);
    }
    if (!S_ISREG(st.st_mode)) {
      close(fd);
      return Status(Code::kInvalidArgument, path + ": not a regular file");
    }
    if (st.st_size < 8) {
      close(fd);
      return Status(Code::kInvalidArgument, path + ": not a safetensors file (too short)");
    }
    const size_t size = static_cast<size_t>(st.st_size);
    int flags = MAP_SHARED | (options.populate ? MAP_POPULATE : 0);
    void* addr = mmap(nullptr, size, PROT_READ, flags, fd, 0);
    int err = errno;
    close(fd);  // the mapping keeps the file
    if (addr == MAP_FAILED) return os::ErrnoStatus("mmap " + path, err);
    table->mappings_.push_back({addr, size});  // unmapped by ~Table on any error below
    (void)madvise(addr, size, MADV_HUGEPAGE);
    if (!options.populate) (void)madvise(addr, size, MADV_RANDOM);

    auto file = std::span<const uint8_t>(static_cast<const uint8_t*>(addr), size);
    Result<SafetensorsHeader> header = ParseSafetensors(file);
    if (!header.ok()) return header.status().WithContext(path);
    const SafetensorsTensor* tensor = nullptr;
    if (options.tensor_name.empty()) {
      if (header->tensors.size() != 1)
        return Status(Code::kInvalidArgument, path + ": holds " +
                                                  std::to_string(header->tensors.size()) +
                                                  " tensors; name the table's tensor");
      tensor = &header->tensors[0];
    } else {
      for (const auto& t : header->tensors)
        if (t.name == options.tensor_name) tensor = &t;
      if (tensor == nullptr)
        return Status(Code::kInvalidArgument,
                      path + ": has no tensor \"" + options.tensor_name + "\"");
    }
    const std::string where = path + ": tensor \"" + tensor->name + "\"";
    FERRY_ASSIGN_OR_RETURN(TensorRows tr, TensorLayout(*tensor, layout, where));
    const Dtype dtype = tr.dtype;
    if (i == 0) {
      table->dtype_ = dtype;
      table->row_bytes_ = RowBytes(dtype, layout.head_dim()).value();
    } else if (dtype != table->dtype_) {
      return Status(Code::kInvalidArgument, where + ": dtype " + std::string(DtypeName(dtype)) +
                                                " differs from the first file's " +
                                                std::string(DtypeName(table->dtype_)));
    }
    const uint64_t file_rows = tr.rows;
    if (file_rows > 0)
      table->segments_.push_back(
          {rows, file_rows, static_cast<const uint8_t*>(addr) + tensor->begin});
    rows += file_rows;  // cannot overflow: each file's rows fit in its bytes
  }
  if (rows != layout.table_rows() && rows != layout.used_rows())
    return Status(Code::kInvalidArgument, "the files hold " + std::to_string(rows) +
                                              " rows; the layout needs " +
                                              std::to_string(layout.table_rows()) + " (or " +
                                              std::to_string(layout.used_rows()) + " unpadded)");
  table->rows_ = rows;
  return table;
}

Table::~Table() {
  if (pinned_) (void)Unpin();
  for (const Mapping& m : mappings_) munmap(m.addr, m.bytes);
}

const uint8_t* Table::RowInSegments(uint64_t row) const {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), row,
                             [](uint64_t r, const TableSegment& s) { return r < s.first_row; });
  const TableSegment& s = *(it - 1);
  return s.data + (row - s.first_row) * row_bytes_;
}

Status Table::Pin() {
  if (pinned_) return Status::Ok();
  for (size_t i = 0; i < mappings_.size(); ++i) {
    // File mappings are read-only: registered as such (the GPU only reads rows).
    Status s = synthetic_ ? cuda::HostRegister(mappings_[i].addr, mappings_[i].bytes)
                          : cuda::HostRegisterReadOnly(mappings_[i].addr, mappings_[i].bytes);
    if (!s.ok()) {
      for (size_t j = 0; j < i; ++j) (void)cuda::HostUnregister(mappings_[j].addr);
      return s.WithContext("pinning the embedding table");
    }
  }
  pinned_ = true;
  return Status::Ok();
}

Status Table::Unpin() {
  if (!pinned_) return Status::Ok();
  Status first;
  for (const Mapping& m : mappings_) {
    Status s = cuda::HostUnregister(m.addr);
    if (first.ok() && !s.ok()) first = s;
  }
  pinned_ = false;
  return first;
}

}  // namespace ferry::embed
