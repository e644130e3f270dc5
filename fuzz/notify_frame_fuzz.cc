// libFuzzer target: the notification frame decoder (transport/notify_frame.h) and the inbox
// that runs it on every received notification (transport/inbox.h), on bytes a hostile peer
// chose. Every input must:
//  - decode, or be refused with the message and the topic left as they were;
//  - when it does not begin with the magic, decode to itself on the default topic;
//  - when it decodes, give a topic of at most kMaxTopicBytes and a payload that is the input's
//    tail, which encode back to bytes that decode to the same topic and payload (and to the
//    input's own bytes whenever the pair needs a frame);
//  - be taken by a small inbox (and popped back on its topic) or refused with
//    kInvalidArgument (malformed, counted in rejected(); too big, counted in dropped()) or
//    kResourceExhausted (backlog full, counted in dropped()).
// The input also serves as a (topic length, topic, payload) triple for the encoder, whose
// output must decode to the same pair and be at most kNotifyFrameOverhead longer.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "transport/inbox.h"
#include "transport/notify_frame.h"

namespace {

using ferry::Code;
using ferry::kMaxTopicBytes;
using ferry::Notification;
using namespace ferry::internal;

void CheckDecode(std::string_view input) {
  std::string message(input);
  std::string topic = "unchanged";
  if (!DecodeNotifyFrame(&message, &topic)) {
    if (message != input || topic != "unchanged") __builtin_trap();
    return;
  }
  if (topic.size() > kMaxTopicBytes) __builtin_trap();
  if (message.size() > input.size() || input.substr(input.size() - message.size()) != message)
    __builtin_trap();
  // Without the magic, the message is its own payload on the default topic; with it, the
  // header (4 bytes) and the topic come first.
  if (!NeedsNotifyFrame("", input) && (message != input || !topic.empty())) __builtin_trap();
  if (NeedsNotifyFrame("", input) && input.size() != 4 + topic.size() + message.size()) __builtin_trap();
  std::string wire = EncodeNotifyFrame(topic, message);
  if (NeedsNotifyFrame(topic, message) && wire != input) __builtin_trap();
  std::string again_topic;
  if (!DecodeNotifyFrame(&wire, &again_topic) || again_topic != topic || wire != message) __builtin_trap();
}

void CheckEncode(std::string_view input) {
  if (input.empty()) return;
  const size_t topic_bytes = std::min<size_t>(static_cast<uint8_t>(input[0]) % (kMaxTopicBytes + 1),
                                              input.size() - 1);
  const std::string_view topic = input.substr(1, topic_bytes);
  const std::string_view message = input.substr(1 + topic_bytes);
  std::string wire = EncodeNotifyFrame(topic, message);
  if (wire.size() > message.size() + kNotifyFrameOverhead) __builtin_trap();
  if (!NeedsNotifyFrame(topic, message) && wire != message) __builtin_trap();
  std::string got_topic;
  if (!DecodeNotifyFrame(&wire, &got_topic) || got_topic != topic || wire != message) __builtin_trap();
}

void CheckInbox(std::string_view input) {
  // Bounds small enough that the fuzzer reaches each refusal.
  Inbox inbox(/*max_pending=*/2, /*max_bytes=*/512, /*max_pending_bytes=*/768);
  std::string topic;
  std::string payload(input);
  const bool decodes = DecodeNotifyFrame(&payload, &topic);
  uint64_t taken = 0;
  for (int i = 0; i < 3; ++i) {
    Notification n;
    n.from = "peer";
    n.message = std::string(input);
    n.topic = "ignored";
    ferry::Status s = inbox.Push(std::move(n));
    if (s.ok()) {
      ++taken;
      continue;
    }
    if (s.code() != Code::kInvalidArgument && s.code() != Code::kResourceExhausted) __builtin_trap();
    if (s.code() == Code::kInvalidArgument && decodes && payload.size() <= inbox.max_payload_bytes())
      __builtin_trap();
  }
  if (!decodes && (inbox.rejected() != 3 || taken != 0)) __builtin_trap();
  if (decodes && inbox.dropped() + taken != 3) __builtin_trap();
  const auto got = inbox.PopAll(topic);
  if (got.size() != taken) __builtin_trap();
  for (const Notification& n : got)
    if (n.message != payload || n.topic != topic || n.from != "peer") __builtin_trap();
  if (!inbox.PopAll(topic).empty()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  CheckDecode(input);
  CheckEncode(input);
  CheckInbox(input);
  return 0;
}
