// ferry's embedding-offload core, the public API: the n-gram embedding configuration
// (Config) and the layout derived from it (Layout), the row ids of a step (ComputeRowIds), the
// table of rows in host memory (Table: memory-mapped safetensors or synthetic) and the
// multi-threaded row gather (Gatherer). Used by the Python module (ferry.embed), the `ferry`
// CLI and the embedding service (ferry/embed_server.h).
//
// The row-id specification, followed exactly (src/embed/config.h and row_ids.h state it in
// full): G = (N - 1) H heads of head dim d = E / G; for every token, head h of n-gram order n
// reads row (mix_n mod size_h) + offset_h of the table, where mix_n hashes the token and the
// n - 1 before it (within its request's EOS-delimited segment) with the layout's multipliers.
// A table row is one head's d values; a token's output is its G rows in head order (E values).
//
// Thread safety: Config, Layout, StepInput and the options are values (a const Layout may be
// shared by any threads). A Table is read-only after creation: Row() and the accessors may be
// called from any thread (Pin()/Unpin() must not race with each other or with destruction).
// ComputeRowIds may run concurrently on distinct outputs; Gatherer's calls may run
// concurrently (not from inside an on_chunk callback). Workers may be shared by those calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry {
class ThreadPool;  // opaque here: worker threads (MakeWorkers)
}  // namespace ferry

namespace ferry::embed {

// x mod d for a fixed 64-bit divisor d >= 1 by one 128-bit multiply (Barrett reduction),
// exact for every x: a head's size as the layout keeps it.
struct FastMod {
  uint64_t divisor = 1;
  uint64_t magic = ~0ull;

  static constexpr FastMod For(uint64_t d) { return FastMod{d, ~0ull / d}; }  // REQUIRES: d >= 1

  constexpr uint64_t Mod(uint64_t x) const {
    uint64_t q = static_cast<uint64_t>((static_cast<unsigned __int128>(x) * magic) >> 64);
    uint64_t r = x - q * divisor;
    return r >= divisor ? r - divisor : r;
  }
};

struct Config {
  int64_t vocab_size = 0;      // V; token ids are int32, so 1 <= V <= 2^31
  int64_t eos_id = 0;          // EOS, 0 <= EOS < V
  int ngram_size = 0;          // N >= 2 (at most kMaxNgram)
  int heads_per_ngram = 0;     // H >= 1
  int64_t embed_dim = 0;       // E, divisible by G
  uint64_t seed = 1234;        // S
  uint64_t base_vocab = 0;     // B >= 1
  uint64_t row_padding = 128;  // P >= 1
  int layer = 0;               // L >= 0 (the dense layer index)

  // The model ferry serves first: V 248320, N 3, H 8, E 2560 (G 16, d 160), B 2e7, P 128,
  // S 1234. Its EOS id comes from the model's tokenizer config, so the caller passes it.
  static Config Model(int64_t eos_id, int layer = 0);
  std::string ToString() const;
};

inline constexpr int kMaxNgram = 16;
inline constexpr int kMaxHeads = 4096;

// Element types of table rows. The service moves row bytes and never converts them.
enum class Dtype : uint8_t { kBf16, kF16, kF32, kF8E4M3, kNvfp4 };
std::string_view DtypeName(Dtype dtype);  // "bf16", "f16", "f32", "f8_e4m3", "nvfp4"
Result<Dtype> ParseDtype(std::string_view name);
// Bytes of one row of `head_dim` values: d * size, or d/2 code bytes + d/16 scale bytes for
// NVFP4. kInvalidArgument when NVFP4 and d is not a multiple of 16.
Result<uint64_t> RowBytes(Dtype dtype, int64_t head_dim);

class Layout {
 public:
  // Validates `config` (kInvalidArgument naming the field) and derives the layout.
  static Result<Layout> Create(const Config& config);

  const Config& config() const { return config_; }
  int ngram_size() const { return config_.ngram_size; }
  int num_heads() const { return static_cast<int>(head_sizes_.size()); }     // G
  int64_t head_dim() const { return config_.embed_dim / num_heads(); }       // d
  const std::vector<uint64_t>& multipliers() const { return multipliers_; }  // m_0..m_(N-1)
  const std::vector<uint64_t>& head_sizes() const { return head_sizes_; }
  const std::vector<uint64_t>& head_offsets() const { return head_offsets_; }
  const std::vector<FastMod>& head_mods() const { return head_mods_; }
  uint64_t used_rows() const { return used_rows_; }    // sum of head sizes
  uint64_t table_rows() const { return table_rows_; }  // used_rows rounded up to P

 private:
  Layout() = default;
  Config config_;
  std::vector<uint64_t> multipliers_;
  std::vector<uint64_t> head_sizes_;
  std::vector<uint64_t> head_offsets_;
  std::vector<FastMod> head_mods_;
  uint64_t used_rows_ = 0;
  uint64_t table_rows_ = 0;
};

// Worker threads shared by ComputeRowIds and Table::Synthetic calls (the calling thread works
// too). kInvalidArgument unless 1 <= threads <= kMaxGatherThreads; kResourceExhausted when a
// thread cannot start.
struct WorkersDeleter {
  void operator()(ThreadPool* pool) const;
};
using Workers = std::unique_ptr<ThreadPool, WorkersDeleter>;
Result<Workers> MakeWorkers(int threads, const std::string& name);

// Row ids of a step (the inputs vLLM's GPU worker stages; src/embed/row_ids.h):
//   tokens           num_tokens int32 ids, the step's tokens of all requests, flattened;
//   query_start_loc  num_reqs + 1 int32, first 0, non-decreasing, last <= num_tokens;
//   ngram_context    num_reqs x (N - 1) int32, the tokens of each request before this step.
// Errors: kInvalidArgument for wrong buffer sizes, a first query start other than 0 or a
// decreasing one; kOutOfRange for a query start past num_tokens and for an id >= V in a request
// or its context. Nothing is written on error. Padding tokens' rows are kPaddingRow.
inline constexpr uint64_t kPaddingRow = ~0ull;

struct StepInput {
  std::span<const int32_t> tokens;
  std::span<const int32_t> query_start_loc;
  std::span<const int32_t> ngram_context;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_reqs() const { return static_cast<int64_t>(query_start_loc.size()) - 1; }
};

// Checks `in` against `layout` (sizes, query starts, ids); the errors listed above.
Status ValidateStep(const Layout& layout, const StepInput& in);

// Fills row_ids[num_tokens * G]. Large steps are split into token ranges run on `pool` (and
// the calling thread) when pool is not null.
Status ComputeRowIds(const Layout& layout, const StepInput& in, std::span<uint64_t> row_ids,
                     ThreadPool* pool = nullptr);

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

// Gatherer: copies the table rows of a step into a destination buffer, token by token
// (dst holds num_tokens x G rows, i.e. num_tokens x E values), with a pool of threads.
//
// Tokens are handed out in chunks of GatherOptions::chunk_tokens to the calling thread and
// threads - 1 pool workers; after a chunk's rows are written, `on_chunk(begin, end)` is called
// on the thread that wrote it, so a caller can start copying finished chunks (to a GPU, to
// another rank) while later chunks are still being gathered. Chunks finish in any order and
// callbacks may run concurrently; each chunk is reported exactly once, before Gather returns.
// Rows of padding tokens (kPaddingRow) are written as zeros. Random row reads are latency
// bound, so each thread prefetches the rows prefetch_rows ahead of the one it copies.
//
// Errors: kInvalidArgument for buffers of the wrong size; kOutOfRange when a row id (other than
// kPaddingRow) is >= table.rows(): that row is zeroed, the others are still gathered, and the
// error names the first bad token. GatherStep validates the step first (row_ids.h) and writes
// nothing on error.
//
// Thread safety: Gather and GatherStep may be called concurrently from several threads (they
// share the workers); `table` must outlive the call. Not from inside an on_chunk callback.
struct GatherOptions {
  int threads = 1;            // threads that gather, the calling one included; >= 1
  int64_t chunk_tokens = 32;  // tokens per chunk (the unit of work and of on_chunk)
  int prefetch_rows = 32;     // rows prefetched ahead; 0 disables prefetching
  // Non-temporal stores into dst (x86): they skip the read for ownership of dst lines. The
  // widest the CPU has (64 bytes with AVX-512, 32 with AVX2, 16 with SSE2) that dst's alignment
  // and the row size allow; a dst not 16-byte aligned, or rows not a multiple of 16 bytes, take
  // memcpy. Off by default: on the development VM they were as fast or slower
  // (bench/results/embed_cpu.md); the embedding service uses them for its staging.
  bool streaming_stores = false;
};

inline constexpr int kMaxGatherThreads = 1024;  // ThreadPool::kMaxThreads
inline constexpr int64_t kMaxChunkTokens = 1 << 20;
inline constexpr int kMaxPrefetchRows = 4096;

// kInvalidArgument, naming the option, for threads outside [1, kMaxGatherThreads], chunk_tokens
// outside [1, kMaxChunkTokens], prefetch_rows outside [0, kMaxPrefetchRows].
Status ValidateGatherOptions(const GatherOptions& options);

using ChunkDone = std::function<void(int64_t begin, int64_t end)>;

class Gatherer {
 public:
  // ValidateGatherOptions' errors; kResourceExhausted when a worker thread cannot start.
  static Result<std::unique_ptr<Gatherer>> Create(const GatherOptions& options);

  // row_ids: num_tokens x heads (ComputeRowIds' output); dst: num_tokens x heads x
  // table.row_bytes() bytes.
  Status Gather(const Table& table, int heads, std::span<const uint64_t> row_ids,
                std::span<uint8_t> dst, const ChunkDone& on_chunk = nullptr);

  // Row ids and rows of a step in one pass: each chunk computes its tokens' ids, then gathers
  // them. REQUIRES nothing of `in`: it is validated first. dst: num_tokens x E values.
  // `stores` overrides options().streaming_stores for this call (kStreaming for a destination
  // that only a device's DMA reads next, such as pinned staging).
  enum class Stores { kOptions, kStreaming, kNormal };
  Status GatherStep(const Layout& layout, const Table& table, const StepInput& in,
                    std::span<uint8_t> dst, const ChunkDone& on_chunk = nullptr,
                    Stores stores = Stores::kOptions);

  const GatherOptions& options() const { return options_; }

 ~Gatherer();
  Gatherer(const Gatherer&) = delete;
  Gatherer& operator=(const Gatherer&) = delete;

 private:
  explicit Gatherer(const GatherOptions& options);
  GatherOptions options_;
  std::unique_ptr<ThreadPool> pool_;  // threads - 1 workers; null when threads == 1
};

}  // namespace ferry::embed
