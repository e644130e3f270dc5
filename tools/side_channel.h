// SideChannel: a small TCP connection on which two ferry processes exchange their packed
// descriptors and a few control messages before and around their transfers (the role ZMQ or
// HTTP plays next to MoRI-IO in an inference server).
//
// Frames are a 4-byte little-endian length and that many bytes, at most kMaxFrameBytes; a
// longer or truncated frame is an error, never a crash. Every send and receive has a timeout.
//
// Thread safety: one thread per object.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ferry/status.h"

namespace ferry::tools {

inline constexpr uint32_t kMaxFrameBytes = 1 << 20;

class SideChannel {
 public:
  ~SideChannel();
  SideChannel(const SideChannel&) = delete;
  SideChannel& operator=(const SideChannel&) = delete;

  // Connects to "host:port" or "[v6]:port" (host: IPv4, IPv6 or a name), retrying until `timeout` (the other side may still be starting).
  static Result<std::unique_ptr<SideChannel>> Dial(const std::string& address,
                                                   std::chrono::milliseconds timeout);

  // kDeadlineExceeded when the other side does not take the frame within `timeout` (it stopped
  // reading and its socket is full).
  Status Send(std::string_view frame, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  Result<std::string> Receive(std::chrono::milliseconds timeout);
  // Whether bytes (or the peer's close) are waiting, after at most `timeout`.
  bool Readable(std::chrono::milliseconds timeout);

 private:
  friend class SideListener;
  explicit SideChannel(int fd) : fd_(fd) {}
  Status ReadExactly(char* out, size_t n, std::chrono::steady_clock::time_point until);
  int fd_;
};

// The ucx listen host for an engine whose side channel listens on `address` ("host:port" or
// "[v6]:port"): its host when that is a numeric IPv4 or IPv6 address (so peers that reach the
// side channel reach the engine), else `fallback`.
std::string EngineListenHost(const std::string& address, const std::string& fallback);

class SideListener {
 public:
  ~SideListener();
  // Listens on "host:port" or "[v6]:port" (port 0 = any free port; host: IPv4, IPv6 or a name).
  static Result<std::unique_ptr<SideListener>> Listen(const std::string& address);
  // "host:port" actually bound ("[v6]:port" for IPv6).
  const std::string& address() const { return address_; }
  Result<std::unique_ptr<SideChannel>> Accept(std::chrono::milliseconds timeout);

 private:
  SideListener(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  int fd_;
  std::string address_;
};

// Splits "host:port" or "[v6]:port" (host without brackets); kInvalidArgument when malformed.
Status ParseHostPort(const std::string& address, std::string* host, uint16_t* port);

}  // namespace ferry::tools
