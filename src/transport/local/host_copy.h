// Host-memory copies of a validated batch, on the caller's thread or split by bytes over a
// thread pool.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "base/thread_pool.h"
#include "ferry/engine.h"
#include "transport/transfer_state.h"

namespace ferry::internal {

// Copies every op from `src` to `dst` (offsets already mapped: op.local_offset indexes src).
void CopyInline(std::byte* dst, const std::byte* src, std::span<const TransferOp> ops, bool write);

// Splits the batch into up to pool->size() parts of about equal bytes and runs them on the pool;
// each part reports to `state`.
void CopyParallel(ThreadPool* pool, std::byte* local, std::byte* remote,
                  std::span<const TransferOp> ops, uint64_t total_bytes, bool write,
                  const std::shared_ptr<TransferState>& state);

}  // namespace ferry::internal
