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
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "base/thread_pool.h"
#include "embed/config.h"
#include "embed/row_ids.h"
#include "embed/table.h"
#include "ferry/status.h"

namespace ferry::embed {

struct GatherOptions {
  int threads = 1;            // threads that gather, the calling one included; >= 1
  int64_t chunk_tokens = 32;  // tokens per chunk (the unit of work and of on_chunk)
  int prefetch_rows = 32;     // rows prefetched ahead; 0 disables prefetching
  // Non-temporal stores into dst (x86 SSE2; used when dst is 16-byte aligned and rows are a
  // multiple of 16 bytes): they skip the read for ownership of dst lines. Off by default: on
  // the development VM they were as fast or slower (bench/results/embed_cpu.md).
  bool streaming_stores = false;
};

inline constexpr int kMaxGatherThreads = ThreadPool::kMaxThreads;
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

 private:
  explicit Gatherer(const GatherOptions& options);
  GatherOptions options_;
  std::unique_ptr<ThreadPool> pool_;  // threads - 1 workers; null when threads == 1
};

// The row copy loop of one range of a gather: rows ids[0..count) to dst, with the prefetch
// and store options of `options`. Returns the index of the first row id that is out of range
// (that row is zeroed), or -1. Used by Gatherer and by benchmarks.
int64_t GatherRows(const Table& table, const uint64_t* ids, int64_t count, uint8_t* dst,
                   const GatherOptions& options);

}  // namespace ferry::embed
