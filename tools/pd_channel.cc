#include "pd_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ferry::tools::pd {
namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point until) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

}  // namespace

LineChannel::LineChannel(int fd) : fd_(fd) {
  const int flags = fcntl(fd_, F_GETFL);
  if (flags >= 0) (void)fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
}

LineChannel::~LineChannel() {
  if (fd_ >= 0) close(fd_);
}

Status LineChannel::Send(const nlohmann::json& message, std::chrono::milliseconds timeout) {
  std::string line = message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line.push_back('\n');
  if (line.size() > kMaxLineBytes)
    return Status(Code::kInvalidArgument, "message over the line limit");
  std::lock_guard<std::mutex> lock(send_mu_);
  const auto until = Clock::now() + timeout;
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int ms = RemainingMs(until);
      if (ms == 0) return Status(Code::kDeadlineExceeded, "the peer does not read its messages");
      pollfd p{fd_, POLLOUT, 0};
      (void)poll(&p, 1, ms);
      continue;
    }
    return Status(Code::kUnavailable, std::string("the peer is gone: ") + std::strerror(errno));
  }
  return Status::Ok();
}

Status LineChannel::ReadAvailable(std::vector<nlohmann::json>* lines) {
  char buf[64 * 1024];
  while (!closed_) {
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof(buf)) break;
      continue;
    }
    if (n == 0) {
      closed_ = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    closed_ = true;  // ECONNRESET and the like: the peer is gone
  }
  size_t start = 0;
  for (size_t nl; (nl = in_.find('\n', start)) != std::string::npos; start = nl + 1) {
    nlohmann::json j =
        nlohmann::json::parse(in_.begin() + static_cast<std::ptrdiff_t>(start),
                              in_.begin() + static_cast<std::ptrdiff_t>(nl), nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      in_.erase(0, nl + 1);
      return Status(Code::kInvalidArgument, "a line that is not a JSON object");
    }
    lines->push_back(std::move(j));
  }
  in_.erase(0, start);
  if (in_.size() > kMaxLineBytes) return Status(Code::kInvalidArgument, "a line over the limit");
  if (closed_ && lines->empty()) return Status(Code::kUnavailable, "the peer closed the channel");
  return Status::Ok();
}

Status LineChannel::Receive(std::vector<nlohmann::json>* lines, std::chrono::milliseconds timeout) {
  if (!closed_) {
    pollfd p{fd_, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(timeout.count(), 1 << 30)));
    if (r == 0) return Status::Ok();
  }
  return ReadAvailable(lines);
}

bool GetU64(const nlohmann::json& j, const char* key, uint64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  *out = it->get<uint64_t>();
  return true;
}

bool GetI64(const nlohmann::json& j, const char* key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return false;
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return false;
  *out = it->get<int64_t>();
  return true;
}

bool GetString(const nlohmann::json& j, const char* key, std::string* out, size_t max_bytes) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().size() > max_bytes)
    return false;
  *out = it->get<std::string>();
  return true;
}

bool GetBool(const nlohmann::json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_boolean()) return false;
  *out = it->get<bool>();
  return true;
}

bool GetBlocks(const nlohmann::json& j, const char* key, uint64_t limit, size_t max_count,
               std::vector<uint64_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() > max_count) return false;
  std::vector<uint64_t> blocks;
  blocks.reserve(it->size());
  for (const auto& b : *it) {
    if (!b.is_number_unsigned() || b.get<uint64_t>() >= limit) return false;
    blocks.push_back(b.get<uint64_t>());
  }
  *out = std::move(blocks);
  return true;
}

std::string TypeOf(const nlohmann::json& j) {
  std::string t;
  return GetString(j, "t", &t, 64) ? t : std::string();
}

std::string ToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

bool FromHex(std::string_view hex, std::string* out) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return false;
  std::string bytes(hex.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    bytes[i] = static_cast<char>(hi << 4 | lo);
  }
  *out = std::move(bytes);
  return true;
}

int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace ferry::tools::pd
