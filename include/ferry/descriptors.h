// Descriptors: the values that travel between engines through any side channel (ZMQ, HTTP, a
// file) so that one engine can reach another engine's registered memory.
//
// MemoryDesc describes one registered region; EngineDesc describes one engine. Both pack to a
// versioned msgpack encoding with Pack() and are decoded with Unpack(), which returns an error
// (never crashes, never allocates more than a small bound) on truncated, oversized or
// malformed input.
//
// Thread safety: plain values.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry {

// The version of the descriptor encoding (MemoryDesc and EngineDesc Pack()/Unpack()) that this
// build speaks: Unpack() rejects other versions, and an engine refuses a peer whose EngineDesc
// says another (EngineDesc::protocol_version). Each transport's messages have their own version.
inline constexpr uint32_t kDescriptorVersion = 1;

// Upper bounds that Unpack() enforces; Pack() of a descriptor beyond them fails to round-trip.
inline constexpr size_t kMaxDescriptorBytes = 64 * 1024;
inline constexpr size_t kMaxKeyBytes = 256;
inline constexpr size_t kMaxTransportEntries = 16;
inline constexpr size_t kMaxTransportDataBytes = 8 * 1024;
inline constexpr size_t kMaxAddresses = 16;

enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };
std::string_view MemoryKindName(MemoryKind kind);

// Identifies a region inside the engine that registered it.
enum class RegionId : uint64_t {};
// Identifies a transfer inside the engine that posted it (Engine::AllocateTransferId()).
enum class TransferId : uint64_t {};

// Opaque per-transport data: what `transport` needs to reach a region or an engine (an IPC
// handle, a remote key, a listening address, a process token).
struct TransportData {
  std::string transport;
  std::string data;
  friend bool operator==(const TransportData&, const TransportData&) = default;
};

struct MemoryDesc {
  std::string engine_key;  // the engine that registered the region
  RegionId region{};
  uint64_t address = 0;  // in the registering process's address space
  uint64_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
  int32_t device = -1;   // CUDA ordinal for kCuda, -1 for host memory
  std::string host_id;   // identity of the host (hostname and boot id)
  std::vector<TransportData> access;

  // The entry of `transport`, or nullptr.
  const TransportData* FindAccess(std::string_view transport) const;

  std::string Pack() const;
  static Result<MemoryDesc> Unpack(std::string_view bytes);

  friend bool operator==(const MemoryDesc&, const MemoryDesc&) = default;
};

struct EngineDesc {
  uint32_t protocol_version = kDescriptorVersion;  // the descriptor version the engine speaks
  std::string key;      // unique per engine instance
  std::string host_id;  // as in MemoryDesc
  uint32_t pid = 0;
  std::vector<std::string> addresses;       // where the engine can be reached ("host:port")
  std::vector<TransportData> transports;    // transports usable by peers, with their data

  const TransportData* FindTransport(std::string_view transport) const;

  std::string Pack() const;
  static Result<EngineDesc> Unpack(std::string_view bytes);

  friend bool operator==(const EngineDesc&, const EngineDesc&) = default;
};

// This machine's identity: "<hostname>/<boot id>". Two processes on one host agree on it.
const std::string& LocalHostId();

}  // namespace ferry
