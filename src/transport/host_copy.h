// Host-memory copies of a validated batch, on the caller's thread or split by bytes over a
// thread pool: shared by the transports that move host memory with memcpy (local, shm).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "base/thread_pool.h"
#include "ferry/types.h"
#include "transport/transfer_state.h"

namespace ferry::internal {

// Copies every op between the regions at `local` and `remote` on the calling thread (writes:
// local -> remote; reads: remote -> local). `total_bytes` is the batch's size.
void CopyInline(std::byte* local, std::byte* remote, std::span<const TransferOp> ops, bool write,
                uint64_t total_bytes);

// Batches of at least this many bytes are copied with non-temporal (streaming) stores: they
// are larger than the caches, so writing around the cache saves the read-for-ownership of every
// destination line (measured here: a loop of 1 MiB memcpys 6.5 GB/s, streaming 10.7 GB/s).
inline constexpr uint64_t kStreamingCopyBytes = 32 << 20;

// memcpy with non-temporal stores for the bulk of the range (x86-64; memcpy elsewhere).
// The caller issues StreamingFence() before publishing the copy's completion.
void StreamingCopy(std::byte* dst, const std::byte* src, size_t n);
void StreamingFence();

// Splits the batch into up to pool->size() parts of about equal bytes and runs them on the pool;
// each part reports to `state`.
void CopyParallel(ThreadPool* pool, std::byte* local, std::byte* remote,
                  std::span<const TransferOp> ops, uint64_t total_bytes, bool write,
                  const std::shared_ptr<TransferState>& state);

}  // namespace ferry::internal
