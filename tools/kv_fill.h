// Filling the producer's KV cache with the demo pattern and checking the consumer's copy
// (kv_layout.h), on host buffers in place and on CUDA buffers through a host staging slab.
//
// Thread safety: none; one caller per buffer.
#pragma once

#include <cstdint>
#include <string>

#include "buffers.h"
#include "kv_layout.h"

namespace ferry::tools {

Status FillProducer(Buffer& producer, const KvShape& shape);

struct VerifyReport {
  uint64_t bytes_checked = 0;
  uint64_t bad_words = 0;  // 8-byte words that differ
  uint64_t bad_blocks = 0;
  std::string first_bad;  // where the first difference is, for humans
};

// Checks every consumer block against the producer block that the mapping sent to it.
Result<VerifyReport> VerifyConsumer(const Buffer& consumer, const KvShape& shape,
                                    const BlockMapping& mapping);

}  // namespace ferry::tools
