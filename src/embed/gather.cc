#include "embed/gather.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "embed/checks.h"
#include "embed/parallel.h"
#include "embed/row_ids.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#define FERRY_EMBED_STREAMING 1
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ferry::embed {
namespace {

using StreamCopyFnT = void (*)(uint8_t*, const uint8_t*, uint64_t);

// Into every level of the cache (locality 3): on the 16-core H200 host a gather with the
// non-temporal hint (locality 0) took 1.3-1.5 ms a step against 1.0-1.1 with this one
// (bench/gather_store_probe.cu, bench/results/embed_service.md).
inline void PrefetchRow(const uint8_t* p, uint64_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t last = reinterpret_cast<uintptr_t>(p) + bytes - 1;
  for (uintptr_t line = first; line <= last; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
}

Status SizeError(const char* what, uint64_t have, uint64_t want) {
  return Status(Code::kInvalidArgument, std::string(what) + " has " + std::to_string(have) +
                                            " entries; " + std::to_string(want) + " expected");
}

// Runs chunk(begin, end) over [0, num_tokens) in chunks of `chunk` tokens on the workers, then
// on_chunk for each.
template <typename Fn>
void ForChunks(ThreadPool* pool, int threads, int64_t num_tokens, int64_t chunk, Fn&& fn,
               const ChunkDone& on_chunk) {
  const int64_t chunks = (num_tokens + chunk - 1) / chunk;
  std::atomic<int64_t> cursor{0};
  const int workers = static_cast<int>(std::min<int64_t>(threads, chunks));
  RunOnWorkers(pool, workers, [&](int worker) {
    for (;;) {
      int64_t c = cursor.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      int64_t b = c * chunk, e = std::min(num_tokens, b + chunk);
      fn(worker, b, e);
      if (on_chunk) on_chunk(b, e);
    }
  });
}

Status BadRow(int64_t token, uint64_t row, uint64_t rows) {
  return Status(Code::kOutOfRange, "token " + std::to_string(token) + " reads row " +
                                       std::to_string(row) + " of a table of " +
                                       std::to_string(rows) + " rows");
}

// Records the smallest bad row index seen.
void NoteBad(std::atomic<int64_t>& first_bad, int64_t index) {
  int64_t cur = first_bad.load(std::memory_order_relaxed);
  while ((cur < 0 || index < cur) &&
         !first_bad.compare_exchange_weak(cur, index, std::memory_order_relaxed)) {
  }
}

#if FERRY_EMBED_STREAMING
// Copies with non-temporal stores: the destination is read next by a DMA engine or another
// core, not by this one, so it should not evict the cache or cost a read for ownership. The
// widest stores the CPU has: a 64-byte store fills a line at once, and on the H200 host a
// step's gather took 0.80-0.88 ms with them against 1.0-1.1 with 16-byte ones.
// REQUIRES: dst aligned to the width, bytes a multiple of it.
void StreamCopy16(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  for (uint64_t off = 0; off < bytes; off += 16) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + off));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + off), v);
  }
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) void StreamCopy32(uint8_t* dst, const uint8_t* src,
                                                  uint64_t bytes) {
  for (uint64_t off = 0; off < bytes; off += 32) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + off));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + off), v);
  }
}
__attribute__((target("avx512f"))) void StreamCopy64(uint8_t* dst, const uint8_t* src,
                                                     uint64_t bytes) {
  for (uint64_t off = 0; off < bytes; off += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + off), _mm512_loadu_si512(src + off));
}
#endif
inline void StreamZero(uint8_t* dst, uint64_t bytes) {
  const __m128i zero = _mm_setzero_si128();
  for (uint64_t off = 0; off < bytes; off += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + off), zero);
}

int CpuStreamWidth() {
#if defined(__x86_64__)
  static const int width = __builtin_cpu_supports("avx512f") ? 64
                           : __builtin_cpu_supports("avx2")  ? 32
                                                             : 16;
  return width;
#else
  return 16;
#endif
}

// The widest copy that the CPU, `most`, dst's alignment and the row size allow; 0: none.
int PickStreamWidth(const uint8_t* dst, uint64_t row_bytes, int most) {
  int width = std::min(CpuStreamWidth(), most);
  while (width >= 16 && (reinterpret_cast<uintptr_t>(dst) % width != 0 || row_bytes % width != 0))
    width /= 2;
  return width >= 16 ? width : 0;
}
#endif

// kStream: rows copied by kCopy (non-temporal) and padding zeroed alike; otherwise memcpy.
template <bool kStream, StreamCopyFnT kCopy>
int64_t CopyRows(const Table& table, const uint64_t* ids, int64_t count, uint8_t* dst,
                 int prefetch_rows) {
  const uint64_t rows = table.rows();
  const uint64_t row_bytes = table.row_bytes();
  int64_t bad = -1;
  const int64_t ahead = std::min<int64_t>(prefetch_rows, count);
  for (int64_t i = 0; i < ahead; ++i)
    if (ids[i] < rows) PrefetchRow(table.Row(ids[i]), row_bytes);
  for (int64_t i = 0; i < count; ++i, dst += row_bytes) {
    if (i + prefetch_rows < count) {
      uint64_t next = ids[i + prefetch_rows];
      if (next < rows) PrefetchRow(table.Row(next), row_bytes);
    }
    const uint64_t r = ids[i];
    if (r < rows) {
      if constexpr (kStream) {
        kCopy(dst, table.Row(r), row_bytes);
      } else {
        std::memcpy(dst, table.Row(r), row_bytes);
      }
    } else {
      if (r != kPaddingRow && bad < 0) bad = i;
      if constexpr (kStream) {
#if FERRY_EMBED_STREAMING
        StreamZero(dst, row_bytes);
#endif
      } else {
        std::memset(dst, 0, row_bytes);
      }
    }
  }
  return bad;
}

}  // namespace

int64_t GatherRows(const Table& table, const uint64_t* ids, int64_t count, uint8_t* dst,
                   const GatherOptions& options, int max_stream_width) {
#if FERRY_EMBED_STREAMING
  if (options.streaming_stores) {
    int64_t bad = -1;
    switch (PickStreamWidth(dst, table.row_bytes(), max_stream_width)) {
#if defined(__x86_64__)
      case 64:
        bad = CopyRows<true, StreamCopy64>(table, ids, count, dst, options.prefetch_rows);
        break;
      case 32:
        bad = CopyRows<true, StreamCopy32>(table, ids, count, dst, options.prefetch_rows);
        break;
#endif
      case 16:
        bad = CopyRows<true, StreamCopy16>(table, ids, count, dst, options.prefetch_rows);
        break;
      default:
        return CopyRows<false, nullptr>(table, ids, count, dst, options.prefetch_rows);
    }
    _mm_sfence();  // the rows are visible before whatever the caller publishes next
    return bad;
  }
#endif
  return CopyRows<false, nullptr>(table, ids, count, dst, options.prefetch_rows);
}

int StreamStoreWidth() {
#if FERRY_EMBED_STREAMING
  return CpuStreamWidth();
#else
  return 0;
#endif
}

Status ValidateGatherOptions(const GatherOptions& options) {
  FERRY_RETURN_IF_ERROR(CheckInRange("threads", options.threads, 1, kMaxGatherThreads));
  FERRY_RETURN_IF_ERROR(CheckInRange("chunk_tokens", options.chunk_tokens, 1, kMaxChunkTokens));
  return CheckInRange("prefetch_rows", options.prefetch_rows, 0, kMaxPrefetchRows);
}

Result<std::unique_ptr<Gatherer>> Gatherer::Create(const GatherOptions& options) {
  FERRY_RETURN_IF_ERROR(ValidateGatherOptions(options));
  std::unique_ptr<Gatherer> g(new Gatherer(options));
  if (options.threads > 1) {
    FERRY_ASSIGN_OR_RETURN(g->pool_, ThreadPool::Create(options.threads - 1, "embed-gather"));
  }
  return g;
}

Gatherer::Gatherer(const GatherOptions& options) : options_(options) {}
Gatherer::~Gatherer() = default;

static_assert(kMaxGatherThreads == ThreadPool::kMaxThreads);

void WorkersDeleter::operator()(ThreadPool* pool) const { delete pool; }

Result<Workers> MakeWorkers(int threads, const std::string& name) {
  FERRY_RETURN_IF_ERROR(CheckInRange("threads", threads, 1, kMaxGatherThreads));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ThreadPool> pool, ThreadPool::Create(threads, name));
  return Workers(pool.release());
}

Status Gatherer::Gather(const Table& table, int heads, std::span<const uint64_t> row_ids,
                        std::span<uint8_t> dst, const ChunkDone& on_chunk) {
  if (heads < 1) return Status(Code::kInvalidArgument, "heads must be at least 1");
  if (row_ids.size() % heads != 0)
    return Status(Code::kInvalidArgument, "row_ids has " + std::to_string(row_ids.size()) +
                                              " entries, not a multiple of " +
                                              std::to_string(heads) + " heads");
  const int64_t num_tokens = static_cast<int64_t>(row_ids.size() / heads);
  const uint64_t token_bytes = heads * table.row_bytes();
  if (dst.size() != num_tokens * token_bytes)
    return SizeError("dst (bytes)", dst.size(), num_tokens * token_bytes);
  std::atomic<int64_t> first_bad{-1};
  ForChunks(
      pool_.get(), options_.threads, num_tokens, options_.chunk_tokens,
      [&](int, int64_t b, int64_t e) {
        int64_t bad = GatherRows(table, row_ids.data() + b * heads, (e - b) * heads,
                                 dst.data() + b * token_bytes, options_);
        if (bad >= 0) NoteBad(first_bad, b * heads + bad);
      },
      on_chunk);
  if (int64_t bad = first_bad.load(); bad >= 0)
    return BadRow(bad / heads, row_ids[bad], table.rows());
  return Status::Ok();
}

Status Gatherer::GatherStep(const Layout& layout, const Table& table, const StepInput& in,
                            std::span<uint8_t> dst, const ChunkDone& on_chunk, Stores stores) {
  const int heads = layout.num_heads();
  const uint64_t token_bytes = heads * table.row_bytes();
  if (dst.size() != in.num_tokens() * token_bytes)
    return SizeError("dst (bytes)", dst.size(), in.num_tokens() * token_bytes);
  FERRY_ASSIGN_OR_RETURN(uint64_t layout_row_bytes, RowBytes(table.dtype(), layout.head_dim()));
  if (layout_row_bytes != table.row_bytes() || table.rows() < layout.used_rows())
    return Status(Code::kInvalidArgument, "the table (" + std::to_string(table.rows()) +
                                              " rows of " + std::to_string(table.row_bytes()) +
                                              " bytes) does not fit the layout (" +
                                              std::to_string(layout.used_rows()) + " rows of " +
                                              std::to_string(layout_row_bytes) + ")");
  FERRY_RETURN_IF_ERROR(ValidateStep(layout, in));
  const int64_t chunk = options_.chunk_tokens;
  GatherOptions call = options_;
  if (stores != Stores::kOptions) call.streaming_stores = stores == Stores::kStreaming;
  // One id buffer per worker, reused across its chunks.
  std::vector<std::vector<uint64_t>> ids(options_.threads);
  ForChunks(
      pool_.get(), options_.threads, in.num_tokens(), chunk,
      [&](int worker, int64_t b, int64_t e) {
        std::vector<uint64_t>& buf = ids[worker];
        buf.resize((e - b) * heads);
        RowIdsOfRange(layout, in, b, e, buf.data());
        // Ids of a validated step are below used_rows <= rows: no bad row can appear.
        (void)GatherRows(table, buf.data(), (e - b) * heads, dst.data() + b * token_bytes,
                         call);
      },
      on_chunk);
  return Status::Ok();
}

}  // namespace ferry::embed
