#include "kv_fill.h"

#include <fmt/format.h>

#include <span>
#include <vector>

namespace ferry::tools {
namespace {

// The slab of one (layer, kv): every block of it, contiguous.
uint64_t SlabBytes(const KvShape& s) { return s.blocks * s.block_bytes; }

}  // namespace

Status FillProducer(Buffer& producer, const KvShape& shape) {
  const uint64_t slab_bytes = SlabBytes(shape);
  std::vector<std::byte> staging;
  if (producer.kind() != MemoryKind::kHost) staging.resize(slab_bytes);
  for (uint64_t layer = 0; layer < shape.layers; ++layer) {
    for (uint64_t kv = 0; kv < 2; ++kv) {
      const uint64_t slab = shape.Offset(layer, kv, 0);
      std::byte* out = staging.empty() ? producer.data() + slab : staging.data();
      for (uint64_t b = 0; b < shape.blocks; ++b)
        FillBlock(layer, kv, b, std::span(out + b * shape.block_bytes, shape.block_bytes));
      if (!staging.empty()) FERRY_RETURN_IF_ERROR(producer.Write(slab, staging));
    }
  }
  return Status::Ok();
}

Result<VerifyReport> VerifyConsumer(const Buffer& consumer, const KvShape& shape,
                                    const BlockMapping& mapping) {
  const uint64_t slab_bytes = SlabBytes(shape);
  std::vector<std::byte> staging;
  if (consumer.kind() != MemoryKind::kHost) staging.resize(slab_bytes);
  VerifyReport report;
  for (uint64_t layer = 0; layer < shape.layers; ++layer) {
    for (uint64_t kv = 0; kv < 2; ++kv) {
      const uint64_t slab = shape.Offset(layer, kv, 0);
      const std::byte* got = consumer.data() + slab;
      if (!staging.empty()) {
        FERRY_RETURN_IF_ERROR(consumer.Read(slab, staging));
        got = staging.data();
      }
      for (uint64_t dst = 0; dst < shape.blocks; ++dst) {
        const uint64_t src = mapping.src_of[dst];
        uint64_t first = 0;
        uint64_t bad = CheckBlock(
            layer, kv, src, std::span(got + dst * shape.block_bytes, shape.block_bytes), &first);
        if (bad == 0) continue;
        if (report.bad_blocks == 0) {
          report.first_bad =
              fmt::format("layer {} {} consumer block {} (from producer block {}), byte {}", layer,
                          kv == 0 ? "K" : "V", dst, src, first);
        }
        report.bad_words += bad;
        ++report.bad_blocks;
      }
      report.bytes_checked += slab_bytes;
    }
  }
  return report;
}

}  // namespace ferry::tools
