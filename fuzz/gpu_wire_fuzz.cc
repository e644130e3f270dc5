// libFuzzer target: the decoders of what GPU transfers take from peers: cuda_ipc's descriptor
// entries (UnpackRegionAccess / UnpackEngineAccess) and the staged path's payloads
// (DecodePieceTable, DecodeStagedWrite, DecodeStagedReadReq); the ucx transport's handshake
// frames (DecodeHello / DecodeWelcome, what a peer sends to the listener or answers a dialler
// with), its active-message headers (DecodeHeader: the first 64 bytes) with the payload that
// follows them (DecodeNotify), and its descriptor data (AccessKey). Every input is rejected with
// an error or decodes to a value that encodes and decodes to itself and lies inside the bounds
// it was checked against.
// Run: ctest -L fuzz (seeds from fuzz_make_gpu_seeds).
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "transport/cuda_ipc/ipc_desc.h"
#include "transport/ucx/access_wire.h"
#include "transport/ucx/am_wire.h"
#include "transport/ucx/door_wire.h"
#include "transport/ucx/staged_wire.h"

using namespace ferry::internal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const uint64_t region_size = size > 0 ? data[0] * 4096ull : 0;
  if (auto r = cuda_ipc::UnpackRegionAccess(bytes, region_size); r.ok()) {
    if (r->offset > r->allocation_size || region_size > r->allocation_size - r->offset) __builtin_trap();
    auto again = cuda_ipc::UnpackRegionAccess(cuda_ipc::PackRegionAccess(*r), region_size);
    if (!again.ok() || !(*again == *r)) __builtin_trap();
  }
  if (auto e = cuda_ipc::UnpackEngineAccess(bytes); e.ok()) {
    auto again = cuda_ipc::UnpackEngineAccess(cuda_ipc::PackEngineAccess(*e));
    if (!again.ok() || !(*again == *e)) __builtin_trap();
  }
  size_t table = 0;
  uint64_t total = 0;
  std::vector<std::byte> copy(size);
  if (size > 0) std::memcpy(copy.data(), data, size);
  if (auto p = ucx::DecodePieceTable(copy.data(), copy.size(), 1 << 20, &table, &total); p.ok()) {
    if (table > size || total > ucx::kStageChunkBytes) __builtin_trap();
    for (const auto& piece : *p)
      if (piece.offset > (1u << 20) || piece.size > (1u << 20) - piece.offset) __builtin_trap();
    std::vector<std::byte> again(ucx::PieceTableBytes(p->size()));
    ucx::EncodePieceTable(*p, again.data());
    if (again.size() != table || std::memcmp(again.data(), copy.data(), table) != 0) __builtin_trap();
  }
  if (auto w = ucx::DecodeStagedWrite(copy.data(), copy.size(), 1 << 20); w.ok()) {
    if (w->data_offset + w->total != size) __builtin_trap();
  }
  if (auto r = ucx::DecodeStagedReadReq(copy.data(), copy.size(), total, 1 << 20); r.ok()) {
    if (ucx::EncodeStagedReadReq(*r) != bytes) __builtin_trap();
  }
  // An active message: a header, then its payload.
  if (auto h = ucx::DecodeHeader(data, std::min(size, ucx::kAmHeaderBytes),
                                 size > ucx::kAmHeaderBytes ? size - ucx::kAmHeaderBytes : 0);
      h.ok()) {
    uint8_t again[ucx::kAmHeaderBytes];
    ucx::EncodeHeader(*h, again);
    if (std::memcmp(again, data, ucx::kAmHeaderBytes) != 0) __builtin_trap();
    const uint8_t* payload = data + ucx::kAmHeaderBytes;
    const size_t length = size - ucx::kAmHeaderBytes;
    if (auto m = ucx::DecodeNotify(*h, payload, length); m.ok()) {
      if (m->size() != h->size || ucx::EncodeNotify(*m) != std::string_view(reinterpret_cast<const char*>(payload), length))
        __builtin_trap();
    }
  }
  {
    ferry::MemoryDesc remote;
    remote.access.push_back({"ucx", std::string(bytes)});
    if (auto key = ucx::AccessKey(remote); key.ok()) {
      if (ucx::PackAccess(*key, ucx::AccessRest(remote)) != bytes) __builtin_trap();
    }
  }
  if (auto length = ucx::DoorFrameLength(bytes); length.ok() && *length > ucx::kMaxDoorFrame) __builtin_trap();
  if (auto h = ucx::DecodeHello(bytes); h.ok()) {
    auto again = ucx::DecodeHello(ucx::EncodeHello(*h));
    if (!again.ok() || again->from_key != h->from_key || again->to_key != h->to_key || again->lanes != h->lanes ||
        again->worker_address != h->worker_address || again->nonce != h->nonce || h->lanes < 1 ||
        h->lanes > ucx::kMaxDoorLanes || (!h->nonce.empty() && h->nonce.size() != 32))
      __builtin_trap();
  }
  if (auto w = ucx::DecodeWelcome(bytes); w.ok()) {
    if (w->code == ferry::Code::kOk && w->conn_id == 0) __builtin_trap();
    auto again = ucx::DecodeWelcome(ucx::EncodeWelcome(*w));
    if (!again.ok() || again->conn_id != w->conn_id || again->worker_address != w->worker_address) __builtin_trap();
  }
  // The authentication frames (a target's challenge, an initiator's proof): fixed sizes or refused.
  if (auto c = ucx::DecodeChallenge(bytes); c.ok()) {
    if (c->nonce.size() != 32 || c->mac.size() != 32) __builtin_trap();
    auto again = ucx::DecodeChallenge(ucx::EncodeChallenge(*c));
    if (!again.ok() || again->nonce != c->nonce || again->mac != c->mac) __builtin_trap();
  }
  if (auto p = ucx::DecodeProof(bytes); p.ok() && p->mac.size() != 32) __builtin_trap();
  if (auto n = ucx::DoorFrameFields(bytes); n.ok() && *n > 8) __builtin_trap();
  return 0;
}
