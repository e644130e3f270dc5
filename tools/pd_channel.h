// The line protocol between `ferry pd` (the router) and its workers: one JSON object a line over
// a Unix socketpair. Every message has a "t" (its type); what else it holds is read with the
// typed getters below, which treat the other side as untrusted (a field missing, of another
// type or out of range is an error, never a crash).
//
// Reads never block past their timeout; a closed peer (a dead worker, a dead router) reads as
// kUnavailable. A line longer than kMaxLineBytes is kInvalidArgument.
//
// Thread safety: Send may be called from many threads at once (one lock); reads from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::tools::pd {

inline constexpr size_t kMaxLineBytes = 4 << 20;

class LineChannel {
 public:
  // Takes `fd` (a connected stream socket); makes it non-blocking.
  explicit LineChannel(int fd);
  ~LineChannel();
  LineChannel(const LineChannel&) = delete;
  LineChannel& operator=(const LineChannel&) = delete;

  int fd() const { return fd_; }
  // Writes one message within `timeout` (kDeadlineExceeded), kUnavailable when the peer is gone.
  Status Send(const nlohmann::json& message,
              std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // Waits up to `timeout` for bytes, then moves every complete line read so far to *lines
  // (none when nothing came). kUnavailable once the peer closed and no whole line is left.
  Status Receive(std::vector<nlohmann::json>* lines, std::chrono::milliseconds timeout);
  // Reads without waiting (after poll() said the fd is readable).
  Status ReadAvailable(std::vector<nlohmann::json>* lines);

 private:
  int fd_;
  std::mutex send_mu_;
  std::string in_;
  bool closed_ = false;
};

// Typed reads of a message's fields: false when missing, of another type or out of range.
bool GetU64(const nlohmann::json& j, const char* key, uint64_t* out);
bool GetI64(const nlohmann::json& j, const char* key, int64_t* out);
bool GetString(const nlohmann::json& j, const char* key, std::string* out,
               size_t max_bytes = 1 << 20);
bool GetBool(const nlohmann::json& j, const char* key, bool* out);
// A list of block ids, each below `limit`, at most `max_count` of them.
bool GetBlocks(const nlohmann::json& j, const char* key, uint64_t limit, size_t max_count,
               std::vector<uint64_t>* out);
// The message's type, "" when it has none.
std::string TypeOf(const nlohmann::json& j);

// Binary fields (a packed kv::ReadParams) travel as lowercase hex.
std::string ToHex(std::string_view bytes);
bool FromHex(std::string_view hex, std::string* out);

// CLOCK_MONOTONIC in nanoseconds: shared by every process of this host, so a time taken in a
// worker can be compared with one taken in another.
int64_t MonotonicNs();

}  // namespace ferry::tools::pd
