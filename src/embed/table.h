// Table: the embedding rows in host memory, memory-mapped from safetensors files or synthetic.
//
// Row r is row_bytes() bytes (one head's d values, or an NVFP4 row's d/2 code bytes followed by
// d/16 scale bytes) and is never converted. A table opened from several files is their tensors'
// rows concatenated in file order; each file stays one mapping (a segment), so nothing is
// copied. A synthetic table is anonymous memory filled, in parallel, with SyntheticRow(r), a
// cheap pattern of the row id, so a gathered row can be checked without a second copy.
//
// File tables: each file holds one tensor (the one named OpenOptions::tensor_name, or the
// file's only tensor), shape [rows_i, d] for bf16/f16/f32/f8_e4m3 (dtype BF16, F16, F32,
// F8_E4M3) or [rows_i, d/2 + d/16] of U8 for NVFP4. A last dimension of G times that (E values,
// a token's worth) is the same bytes and counts as G rows each. Every file has the same dtype
// and the rows add up to the layout's table_rows() (padded) or used_rows() (unpadded). Mismatches
// are kInvalidArgument (so is a path that is not a regular file: a FIFO, a folder, a device;
// it is never read), unreadable files kNotFound / kPermissionDenied / kInternal. A file must not
// be truncated while mapped (reads of its pages would fault).
//
// Memory advice: MADV_HUGEPAGE where the kernel allows (always for synthetic tables; file
// mappings only on filesystems with huge pages), MADV_RANDOM for files (rows are read at
// random). Pin() page-locks every segment for GPU access (the UVA mode).
//
// Thread safety: after creation a Table is read-only; Row() and the accessors may be called
// from any thread. Pin() and Unpin() must not race with each other or with destruction.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "embed/config.h"
#include "ferry/status.h"

namespace ferry::embed {

// The synthetic pattern: word w (8 bytes, little-endian; the last word cut at row_bytes) of
// row r is SplitMix64(r) + w * kGolden.
void SyntheticRow(uint64_t row, uint64_t row_bytes, uint8_t* out);

struct TableSegment {
  uint64_t first_row = 0;
  uint64_t rows = 0;
  const uint8_t* data = nullptr;  // rows * row_bytes bytes
};

class Table {
 public:
  struct OpenOptions {
    std::string tensor_name;  // empty: each file's only tensor
    bool populate = false;    // fault every page in at open (MAP_POPULATE)
  };
  static Result<std::unique_ptr<Table>> Open(const Layout& layout,
                                             std::span<const std::string> paths,
                                             const OpenOptions& options);
  // rows == 0: layout.table_rows(). `pool` (optional) fills in parallel.
  static Result<std::unique_ptr<Table>> Synthetic(const Layout& layout, Dtype dtype,
                                                  ThreadPool* pool = nullptr, uint64_t rows = 0);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  uint64_t rows() const { return rows_; }
  uint64_t row_bytes() const { return row_bytes_; }
  uint64_t bytes() const { return rows_ * row_bytes_; }
  Dtype dtype() const { return dtype_; }
  bool synthetic() const { return synthetic_; }
  // The rows as one block when the table is one segment; null otherwise.
  const uint8_t* data() const { return segments_.size() == 1 ? segments_[0].data : nullptr; }
  const std::vector<TableSegment>& segments() const { return segments_; }
  // REQUIRES: row < rows()
  const uint8_t* Row(uint64_t row) const {
    if (segments_.size() == 1) return segments_[0].data + row * row_bytes_;
    return RowInSegments(row);
  }

  // Page-locks every mapping (ferry::cuda::HostRegister): kFailedPrecondition when no GPU is
  // usable, kUnsupported in a build without CUDA.
  Status Pin();
  Status Unpin();
  bool pinned() const { return pinned_; }

 private:
  struct Mapping {
    void* addr = nullptr;
    size_t bytes = 0;
  };
  Table() = default;
  const uint8_t* RowInSegments(uint64_t row) const;

  uint64_t rows_ = 0;
  uint64_t row_bytes_ = 0;
  Dtype dtype_ = Dtype::kBf16;
  bool synthetic_ = false;
  bool pinned_ = false;
  std::vector<TableSegment> segments_;
  std::vector<Mapping> mappings_;
};

}  // namespace ferry::embed
