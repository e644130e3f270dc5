// ferry's vocabulary: the value types that every layer speaks (ops, paths, notifications,
// statistics). The engine's public header includes it; the CUDA layer and the transports below
// the engine use it instead of ferry/engine.h.
//
// Thread safety: plain values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace ferry {

using Duration = std::chrono::nanoseconds;

enum class Op : uint8_t { kRead = 0, kWrite = 1 };

// One piece of a batch: `size` bytes between local_offset and remote_offset.
struct TransferOp {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t size = 0;
};

// How a transfer travels: which transport, and whether through a bounce buffer.
struct TransferPath {
  std::string transport;
  bool staged = false;
  std::string ToString() const;
};

// Longest notification topic (Engine::Notify, TransferOptions::notification_topic).
inline constexpr size_t kMaxTopicBytes = 64;

struct Notification {
  Notification() = default;
  Notification(std::string from_key, std::string payload, std::string topic_name = {})
      : from(std::move(from_key)), message(std::move(payload)), topic(std::move(topic_name)) {}

  std::string from;     // key of the sending engine
  std::string message;
  // The subsystem it is for: "" for the application, e.g. "ferry.kv" for the KV connector.
  // Engine::PopNotifications(topic) returns one topic's notifications only.
  std::string topic;
};

struct EngineStats {
  // Messages from peers that were malformed (including notifications whose topic frame does
  // not decode) or reached outside registered memory, and were rejected (the engine keeps
  // serving).
  uint64_t rejected_messages = 0;
  // Connections refused because the peer did not prove that it holds EngineOptions::secret
  // (no proof, a wrong one, a replayed one).
  uint64_t auth_failures = 0;
  // Connections refused at accept because the transport already held its limit of connections
  // (ShmOptions::max_connections, UcxOptions::max_connections), and handshakes that a full
  // listener dropped before they finished. The peer sees its connect fail and may retry.
  uint64_t connections_refused = 0;
  // Notifications from peers that this engine refused (backlog full, too big) and dropped.
  uint64_t dropped_notifications = 0;
  // Ops of posted batches that joined the op before them and travelled as part of it
  // (EngineOptions::merge_adjacent_ops).
  uint64_t merged_ops = 0;
  // GPU copies this engine's transports enqueued (CUDA builds): kernel launches and the pieces
  // they copied, calls to the DMA engines and the copies they carried. A batch of many small
  // pieces is a few launches, never a call per piece.
  uint64_t gpu_kernel_launches = 0;
  uint64_t gpu_kernel_pieces = 0;
  uint64_t gpu_dma_calls = 0;
  uint64_t gpu_dma_copies = 0;
  // Requests of peers refused because a region's access list (RegionOptions::allowed_peers)
  // does not name them, before any byte moved. Each (peer, region) pair is also logged once.
  uint64_t access_denied = 0;
};

}  // namespace ferry
