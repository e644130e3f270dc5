// The notification frame: how a notification's topic travels inside the message bytes that
// transports carry, so that topics need no change to any transport's wire format.
//
//   framed:   0xFF 0xA7 | version (1 byte, kNotifyFrameVersion) | topic length (1 byte,
//             at most kMaxTopicBytes) | topic | payload
//   unframed: any message that does not begin with 0xFF 0xA7 is the payload itself, on the
//             default topic "".
//
// A notification on the default topic travels unframed (exactly the bytes of before topics
// existed), unless its payload begins with the two magic bytes, when it is framed so that it
// cannot be read as a frame; every other topic is framed. 0xFF never occurs in UTF-8 text, so
// text on the default topic is never framed. A message that begins with the magic and does not
// decode (unknown version, topic too long or cut short) is malformed: the receiver drops it and
// counts it (EngineStats::rejected_messages).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/types.h"

namespace ferry::internal {

// What the frame version numbers: the layout above. A receiver refuses other versions.
inline constexpr uint8_t kNotifyFrameVersion = 1;
// The most a frame adds to a payload: the header and the longest topic. Transports carry
// messages of up to EngineOptions::max_notification_bytes plus this.
inline constexpr size_t kNotifyFrameOverhead = 4 + kMaxTopicBytes;

// Whether `message` needs a frame on `topic` (any topic but "", or a payload that begins
// with the magic).
bool NeedsNotifyFrame(std::string_view topic, std::string_view message);
// The bytes that carry `message` on `topic`. REQUIRES: topic.size() <= kMaxTopicBytes.
std::string EncodeNotifyFrame(std::string_view topic, std::string_view message);

// Splits a received message into its topic and payload, in place: on success `*message` holds
// the payload and `*topic` the topic. False (both unchanged) when the message is malformed.
bool DecodeNotifyFrame(std::string* message, std::string* topic);

}  // namespace ferry::internal
