#include "transport/notify_frame.h"

namespace ferry::internal {
namespace {

constexpr unsigned char kMagic0 = 0xFF;
constexpr unsigned char kMagic1 = 0xA7;
constexpr size_t kHeaderBytes = 4;

bool StartsWithMagic(std::string_view m) {
  return m.size() >= 2 && static_cast<unsigned char>(m[0]) == kMagic0 &&
         static_cast<unsigned char>(m[1]) == kMagic1;
}

}  // namespace

bool NeedsNotifyFrame(std::string_view topic, std::string_view message) {
  return !topic.empty() || StartsWithMagic(message);
}

std::string EncodeNotifyFrame(std::string_view topic, std::string_view message) {
  if (!NeedsNotifyFrame(topic, message)) return std::string(message);
  std::string out;
  out.reserve(kHeaderBytes + topic.size() + message.size());
  out.push_back(static_cast<char>(kMagic0));
  out.push_back(static_cast<char>(kMagic1));
  out.push_back(static_cast<char>(kNotifyFrameVersion));
  out.push_back(static_cast<char>(static_cast<uint8_t>(topic.size())));
  out.append(topic);
  out.append(message);
  return out;
}

bool DecodeNotifyFrame(std::string* message, std::string* topic) {
  const std::string_view m(*message);
  if (!StartsWithMagic(m)) {
    topic->clear();
    return true;
  }
  if (m.size() < kHeaderBytes) return false;
  if (static_cast<uint8_t>(m[2]) != kNotifyFrameVersion) return false;
  const size_t topic_bytes = static_cast<uint8_t>(m[3]);
  if (topic_bytes > kMaxTopicBytes || topic_bytes > m.size() - kHeaderBytes) return false;
  topic->assign(m.substr(kHeaderBytes, topic_bytes));
  message->erase(0, kHeaderBytes + topic_bytes);
  return true;
}

}  // namespace ferry::internal
