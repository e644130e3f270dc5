// libFuzzer target: every decoder of the KV connector's bytes from outside. The first byte
// picks the decoder (mod 4) and the rest is its input:
//   0 Decode (the connector's messages), 1 CacheLayout::Unpack, 2 WorkerMetadata::Unpack,
//   3 ReadParams::Unpack.
// Every input must be refused with kInvalidArgument or decode to a value that encodes and
// decodes back to the same value; a decoded value must hold within its bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ferry/kv.h"
#include "kv/wire.h"

namespace {

using namespace ferry::kv;

template <typename T>
bool Refused(const ferry::Result<T>& r) {
  if (r.ok()) return false;
  if (r.status().code() != ferry::Code::kInvalidArgument) __builtin_trap();
  return true;
}

bool Same(const Message& a, const Message& b) {
  return a.type == b.type && a.request == b.request && a.from == b.from &&
         a.from_tp_size == b.from_tp_size && a.blocks == b.blocks && a.num_tokens == b.num_tokens &&
         a.first_token == b.first_token && a.handshake == b.handshake && a.layers == b.layers &&
         a.checksums == b.checksums && a.code == b.code && a.error == b.error;
}

bool Same(const ReadParams& a, const ReadParams& b) {
  return a.request == b.request && a.producer == b.producer &&
         a.producer_tp_size == b.producer_tp_size && a.handshake == b.handshake &&
         a.blocks == b.blocks && a.num_tokens == b.num_tokens;
}

bool Same(const WorkerMetadata& a, const WorkerMetadata& b) {
  return a.version == b.version && a.id == b.id && a.engine == b.engine && a.layout == b.layout &&
         a.regions == b.regions && a.compatibility_hash == b.compatibility_hash;
}

void CheckMessage(std::string_view bytes) {
  auto m = Decode(bytes);
  if (Refused(m)) return;
  if (m->blocks.size() > kMaxMessageBlocks || m->request.size() > kMaxRequestIdBytes ||
      (m->request.empty() && m->type != MsgType::kPing) || m->error.size() > kMaxErrorBytes ||
      m->checksums.size() > kMaxMessageLayers || m->from.tp_rank >= m->from_tp_size)
    __builtin_trap();
  auto again = Decode(Encode(*m));
  if (!again.ok() || !Same(*again, *m)) __builtin_trap();
}

void CheckLayout(std::string_view bytes) {
  auto l = CacheLayout::Unpack(bytes);
  if (Refused(l)) return;
  if (!l->Validate().ok() || l->layers.size() != l->num_layers) __builtin_trap();
  auto again = CacheLayout::Unpack(l->Pack());
  if (!again.ok() || !(*again == *l) || again->CompatibilityHash() != l->CompatibilityHash())
    __builtin_trap();
  if (!CheckCompatible(*l, *again).ok()) __builtin_trap();
}

void CheckMetadata(std::string_view bytes) {
  auto m = WorkerMetadata::Unpack(bytes);
  if (Refused(m)) return;
  if (m->compatibility_hash != m->layout.CompatibilityHash() ||
      m->regions.size() != m->layout.region_bytes.size() || m->id.tp_rank != m->layout.tp_rank)
    __builtin_trap();
  for (size_t i = 0; i < m->regions.size(); ++i)
    if (m->regions[i].size < m->layout.region_bytes[i] || m->regions[i].engine_key != m->engine.key)
      __builtin_trap();
  auto again = WorkerMetadata::Unpack(m->Pack());
  if (!again.ok() || !Same(*again, *m)) __builtin_trap();
}

void CheckReadParams(std::string_view bytes) {
  auto p = ReadParams::Unpack(bytes);
  if (Refused(p)) return;
  if (p->request.empty() || p->blocks.size() > kMaxMessageBlocks) __builtin_trap();
  auto again = ReadParams::Unpack(p->Pack());
  if (!again.ok() || !Same(*again, *p)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      CheckMessage(bytes);
      break;
    case 1:
      CheckLayout(bytes);
      break;
    case 2:
      CheckMetadata(bytes);
      break;
    default:
      CheckReadParams(bytes);
      break;
  }
  return 0;
}
