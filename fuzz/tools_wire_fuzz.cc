// libFuzzer target: the `ferry` tool's decoders of a peer's bytes. The first byte picks one (mod 3):
//   0: the side channel's framing (tools/side_channel.h), over a real connection to one
//      SideListener: the rest is what the peer sends before it closes. Every whole frame (4-byte
//      little-endian length, then that many bytes) is received as sent; then a length over
//      kMaxFrameBytes is kInvalidArgument and a frame cut short kUnavailable.
//   1: `ferry pd`'s line protocol (tools/pd_channel.h) over a socketpair: the rest is what the
//      peer writes before it closes. Every line is a JSON object or refused with
//      kInvalidArgument, the channel ends with kUnavailable, and the typed getters keep to
//      their bounds on every line; hex fields decode and encode back.
//   2: the rest as text: tools::ParseHostPort (a host:port that joins back to itself),
//      EngineListenHost and FromHex.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/host_port.h"
#include "loopback.h"
#include "pd_channel.h"
#include "side_channel.h"

namespace {

using ferry::Code;
namespace tools = ferry::tools;
namespace pd = ferry::tools::pd;

void CheckSideChannel(std::string_view bytes) {
  static tools::SideListener* listener = [] {
    signal(SIGPIPE, SIG_IGN);
    auto l = tools::SideListener::Listen("127.0.0.1:0");
    if (!l.ok()) __builtin_trap();
    return l->release();  // lives for the whole run
  }();
  std::string host;
  uint16_t port = 0;
  if (!tools::ParseHostPort(listener->address(), &host, &port).ok()) __builtin_trap();
  const int fd = fuzz::DialLoopback(port);
  fuzz::SendAll(fd, bytes);  // up to 4 KiB fits in the socket's buffer before the accept
  shutdown(fd, SHUT_WR);
  auto channel = listener->Accept(std::chrono::seconds(5));
  if (!channel.ok()) __builtin_trap();
  size_t at = 0;
  for (;;) {
    auto frame = (*channel)->Receive(std::chrono::seconds(5));
    const size_t left = bytes.size() - at;
    uint32_t len = 0;
    for (size_t i = 0; i < 4 && i < left; ++i)
      len |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
    if (left >= 4 && len <= tools::kMaxFrameBytes && left - 4 >= len) {
      if (!frame.ok() || *frame != bytes.substr(at + 4, len)) __builtin_trap();
      at += 4 + len;
      continue;
    }
    if (frame.ok()) __builtin_trap();
    const Code want = left >= 4 && len > tools::kMaxFrameBytes ? Code::kInvalidArgument : Code::kUnavailable;
    if (frame.status().code() != want) __builtin_trap();
    break;
  }
  channel->reset();
  close(fd);
}

void CheckLine(const nlohmann::json& j) {
  if (!j.is_object()) __builtin_trap();
  if (pd::TypeOf(j).size() > 64) __builtin_trap();
  uint64_t u = 0;
  int64_t i = 0;
  bool b = false;
  (void)pd::GetU64(j, "u", &u);
  (void)pd::GetI64(j, "i", &i);
  (void)pd::GetBool(j, "b", &b);
  std::string s;
  if (pd::GetString(j, "s", &s, 16) && s.size() > 16) __builtin_trap();
  std::vector<uint64_t> blocks;
  if (pd::GetBlocks(j, "blocks", 100, 8, &blocks)) {
    if (blocks.size() > 8) __builtin_trap();
    for (uint64_t block : blocks)
      if (block >= 100) __builtin_trap();
  }
  std::string hex, raw, again;
  if (pd::GetString(j, "h", &hex) && pd::FromHex(hex, &raw)) {
    if (pd::ToHex(raw) != hex || !pd::FromHex(pd::ToHex(raw), &again) || again != raw) __builtin_trap();
  }
}

void CheckLines(std::string_view bytes) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) __builtin_trap();
  fuzz::SendAll(fds[1], bytes);
  close(fds[1]);
  pd::LineChannel channel(fds[0]);
  size_t newlines = 0;
  for (char c : bytes) newlines += c == '\n';
  size_t lines_seen = 0;
  for (size_t round = 0;; ++round) {
    if (round > newlines + 2) __builtin_trap();  // each round takes a line or ends
    std::vector<nlohmann::json> lines;
    ferry::Status s = channel.Receive(&lines, std::chrono::milliseconds(0));
    lines_seen += lines.size();
    for (const auto& j : lines) CheckLine(j);
    if (s.code() == Code::kUnavailable) break;
    if (!s.ok()) {
      if (s.code() != Code::kInvalidArgument) __builtin_trap();
      ++lines_seen;  // the refused line
    }
  }
  if (lines_seen > newlines) __builtin_trap();
}

void CheckText(std::string_view bytes) {
  const std::string text(bytes);
  std::string host, again_host;
  uint16_t port = 0, again_port = 0;
  if (tools::ParseHostPort(text, &host, &port).ok()) {
    if (host.empty()) __builtin_trap();
    // Joined back as users write it: "[v6]:port" for a host with a ':', or host:port.
    auto same = [&](const std::string& address) {
      return tools::ParseHostPort(address, &again_host, &again_port).ok() && again_host == host &&
             again_port == port;
    };
    if (!same(ferry::JoinHostPort(host, port)) && !same(host + ":" + std::to_string(port))) __builtin_trap();
  }
  (void)tools::EngineListenHost(text, "fallback");
  std::string raw;
  if (pd::FromHex(bytes, &raw) && (raw.size() * 2 != bytes.size() || pd::ToHex(raw) != bytes)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // At most 4 KiB, so that the socket buffers take all of it at once.
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, std::min<size_t>(size - 1, 4096));
  switch (data[0] % 3) {
    case 0:
      CheckSideChannel(rest);
      break;
    case 1:
      CheckLines(rest);
      break;
    default:
      CheckText(rest);
      break;
  }
  return 0;
}
