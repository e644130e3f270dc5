// Writes seed inputs for the notification frame fuzzer: `notify_frame_seeds DIR`. Each seed is
// one received message: unframed text, frames with and without a topic, the longest topic, a
// default-topic payload that begins with the magic, and malformed frames (unknown version,
// topic over the limit, cut short).
#include <fstream>
#include <string>

#include "transport/notify_frame.h"

namespace {
void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::internal;
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  const std::string magic("\xFF\xA7", 2);
  Write(dir + "/unframed", "layer-3 done");
  Write(dir + "/empty", "");
  Write(dir + "/topic", EncodeNotifyFrame("ferry.kv", "req-7 blocks 1,2,3"));
  Write(dir + "/longest_topic", EncodeNotifyFrame(std::string(ferry::kMaxTopicBytes, 't'), "x"));
  Write(dir + "/magic_payload", EncodeNotifyFrame("", magic + "\x01\x03" + "abc-rest"));
  Write(dir + "/framed_default", magic + std::string("\x01\x00", 2) + "payload");
  Write(dir + "/bad_version", magic + "\x02\x03" + "abcpayload");
  Write(dir + "/topic_too_long", magic + "\x01" + static_cast<char>(ferry::kMaxTopicBytes + 1) +
                                     std::string(ferry::kMaxTopicBytes + 1, 't'));
  Write(dir + "/cut_short", magic + "\x01\x10" + "abc");
  Write(dir + "/header_only", magic + "\x01");
  Write(dir + "/big", EncodeNotifyFrame("t", std::string(600, 'p')));
  return 0;
}
