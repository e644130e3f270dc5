// libFuzzer target: the embedding-offload protocol decoder (src/embed/service/protocol.h) on
// arbitrary message bytes. Every input must be rejected with kInvalidArgument or kUnsupported,
// or decode to a message whose fields are within the protocol's limits and which encodes to
// bytes that decode to the same encoding again. RequestSeqOf (the seq of a request that does
// not decode) reads any prefix without faults, and agrees with the decoded seq of a Request.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

#include "embed/service/protocol.h"

namespace svc = ferry::embed::service;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::optional<uint64_t> seq = svc::RequestSeqOf(bytes);
  auto m = svc::Decode(bytes);
  if (m.ok()) {
    if (const auto* q = std::get_if<svc::Request>(&*m); q != nullptr && seq != q->seq)
      __builtin_trap();
  }
  if (!m.ok()) {
    auto code = m.status().code();
    if (code != ferry::Code::kInvalidArgument && code != ferry::Code::kUnsupported)
      __builtin_trap();
    return 0;
  }
  if (const auto* r = std::get_if<svc::Register>(&*m)) {
    if (r->tp_rank >= r->tp_size || r->tp_size > svc::kMaxTpSize || r->layers.empty() ||
        r->layers.size() > svc::kMaxLayers || r->max_tokens > svc::kMaxTokens ||
        r->has_inputs != (r->tp_rank == 0))
      __builtin_trap();
    for (const auto& l : r->layers)
      if (l.flag_offset % 4 != 0 || l.output_offset % 4 != 0) __builtin_trap();
  }
  if (const auto* s = std::get_if<svc::Stats>(&*m)) {
    if (s->stats.buckets.size() > svc::kMaxStatBuckets) __builtin_trap();
  }
  std::string once = std::visit([](const auto& x) { return svc::Encode(x); }, *m);
  auto again = svc::Decode(once);
  if (!again.ok()) __builtin_trap();
  std::string twice = std::visit([](const auto& x) { return svc::Encode(x); }, *again);
  if (once != twice) __builtin_trap();
  return 0;
}
