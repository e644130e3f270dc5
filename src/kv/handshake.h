// The handshake endpoint: a small TCP server that hands a worker's metadata to peers that ask
// for it, and the client that asks, each step bounded by a deadline.
//
// Protocol: the client connects and sends the 8-byte request "ferrykv1"; the server answers
// with a 4-byte little-endian length and that many bytes of metadata, then closes. A request
// that is not complete within the server's io timeout, or is anything else, is dropped; the
// server serves at most max_connections at once (more are closed at once) and answers at most
// kMaxHandshakeBytes.
//
// Thread safety: a HandshakeServer runs its own thread; FetchMetadata may be called from any
// thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::kv {

inline constexpr size_t kMaxHandshakeBytes = 16u << 20;

struct HandshakeOptions {
  // Address to listen on: IPv4, IPv6 ("::1", "[::1]") or a name ("localhost"); "0.0.0.0" or "::"
  // listen on every interface.
  std::string host = "127.0.0.1";
  uint16_t port = 0;               // 0 = pick a free one
  size_t max_connections = 64;
  std::chrono::milliseconds io_timeout = std::chrono::seconds(5);
};

class HandshakeServer {
 public:
  static Result<std::unique_ptr<HandshakeServer>> Start(std::string metadata,
                                                        const HandshakeOptions& options = {});
  ~HandshakeServer();  // stops the thread and closes every connection
  HandshakeServer(const HandshakeServer&) = delete;
  HandshakeServer& operator=(const HandshakeServer&) = delete;

  // "host:port" that peers dial (the listening address; for 0.0.0.0, 127.0.0.1; for ::, [::1]).
  const std::string& address() const;
  uint16_t port() const;
  // Replaces what later requests are answered with.
  void SetMetadata(std::string metadata);
  uint64_t served() const;
  uint64_t rejected() const;

 private:
  struct Impl;
  explicit HandshakeServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Fetches the metadata served at "host:port" within `timeout` (connect, send, receive):
// kDeadlineExceeded when it passes, kUnavailable when nothing listens, kInvalidArgument for a
// bad address or an answer beyond kMaxHandshakeBytes.
Result<std::string> FetchMetadata(const std::string& address, Duration timeout);

}  // namespace ferry::kv
