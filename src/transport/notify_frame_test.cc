// The notification frame and the inbox that decodes it: round trips, the default topic's
// unframed bytes, malformed frames refused and counted, and random bytes that never crash.
#include "transport/notify_frame.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "transport/inbox.h"

namespace ferry::internal {
namespace {

TEST(NotifyFrame, RoundTripsEveryTopicLength) {
  for (size_t n = 0; n <= kMaxTopicBytes; ++n) {
    const std::string topic(n, 't');
    std::string wire = EncodeNotifyFrame(topic, "payload");
    std::string got_topic = "stale";
    ASSERT_TRUE(DecodeNotifyFrame(&wire, &got_topic)) << n;
    EXPECT_EQ(got_topic, topic);
    EXPECT_EQ(wire, "payload");
  }
}

TEST(NotifyFrame, TheDefaultTopicTravelsUnframed) {
  EXPECT_FALSE(NeedsNotifyFrame("", "layer-3 done"));
  EXPECT_EQ(EncodeNotifyFrame("", "layer-3 done"), "layer-3 done");
  EXPECT_EQ(EncodeNotifyFrame("", ""), "");
  std::string old = std::string("\x09\x00", 2) + "bytes of before";  // any older sender's message
  std::string topic = "x";
  std::string copy = old;
  ASSERT_TRUE(DecodeNotifyFrame(&copy, &topic));
  EXPECT_EQ(copy, old);
  EXPECT_EQ(topic, "");
}

TEST(NotifyFrame, APayloadThatLooksLikeAFrameIsFramed) {
  const std::string tricky = std::string("\xFF\xA7\x01\x03", 4) + "abc-rest";
  ASSERT_TRUE(NeedsNotifyFrame("", tricky));
  std::string wire = EncodeNotifyFrame("", tricky);
  EXPECT_EQ(wire.size(), tricky.size() + 4);
  std::string topic = "x";
  ASSERT_TRUE(DecodeNotifyFrame(&wire, &topic));
  EXPECT_EQ(topic, "");
  EXPECT_EQ(wire, tricky);
  // A lone 0xFF is not the magic.
  EXPECT_FALSE(NeedsNotifyFrame("", "\xFF"));
}

TEST(NotifyFrame, MalformedFramesAreRefusedAndLeftAlone) {
  const std::string bad[] = {
      std::string("\xFF\xA7", 2),                   // no version or length
      std::string("\xFF\xA7\x01", 3),               // no length
      std::string("\xFF\xA7\x02\x00", 4),           // a later version
      std::string("\xFF\xA7\x00\x00", 4),           // version 0
      std::string("\xFF\xA7\x01\x05", 4) + "abc",   // topic cut short
      std::string("\xFF\xA7\x01\x41", 4) + std::string(100, 'a'),  // topic of 65 bytes
      std::string("\xFF\xA7\x01\xFF", 4),           // topic of 255 bytes, none there
  };
  for (const std::string& b : bad) {
    std::string m = b, topic = "unchanged";
    EXPECT_FALSE(DecodeNotifyFrame(&m, &topic)) << b.size();
    EXPECT_EQ(m, b);
    EXPECT_EQ(topic, "unchanged");
  }
}

// Random messages, and random changes to valid frames: decoding never reads past the message,
// and whatever decodes re-encodes to a message that decodes to the same topic and payload.
TEST(NotifyFrame, RandomBytesNeverCrash) {
  std::mt19937_64 rng(1234);
  size_t framed = 0, refused = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string m;
    if (i % 2 == 0) {
      m.resize(rng() % 80);
      for (char& c : m) c = static_cast<char>(rng());
      if (m.size() >= 2 && rng() % 2) m[0] = '\xFF', m[1] = '\xA7';
    } else {
      m = EncodeNotifyFrame(std::string(rng() % 70, 'k').substr(0, kMaxTopicBytes), "payload");
      m[rng() % m.size()] = static_cast<char>(rng());
      if (rng() % 4 == 0) m.resize(rng() % (m.size() + 1));
    }
    std::string topic;
    if (!DecodeNotifyFrame(&m, &topic)) {
      ++refused;
      continue;
    }
    framed += topic.empty() ? 0 : 1;
    ASSERT_LE(topic.size(), kMaxTopicBytes);
    std::string again = EncodeNotifyFrame(topic, m), topic2;
    ASSERT_TRUE(DecodeNotifyFrame(&again, &topic2));
    EXPECT_EQ(topic2, topic);
    EXPECT_EQ(again, m);
  }
  EXPECT_GT(framed, 0u);
  EXPECT_GT(refused, 0u);
}

TEST(Inbox, SortsByTopicAndBoundsThemTogether) {
  Inbox inbox(3, 16, 1000);
  ASSERT_TRUE(inbox.Push({"p", "app-1"}).ok());
  ASSERT_TRUE(inbox.Push({"p", EncodeNotifyFrame("kv", "kv-1")}).ok());
  ASSERT_TRUE(inbox.Push({"q", "app-2"}).ok());
  // The count bound is over every topic.
  EXPECT_EQ(inbox.Push({"p", EncodeNotifyFrame("kv", "kv-2")}).code(), Code::kResourceExhausted);
  EXPECT_EQ(inbox.dropped(), 1u);
  auto kv = inbox.PopAll("kv");
  ASSERT_EQ(kv.size(), 1u);
  EXPECT_EQ(kv[0].message, "kv-1");
  EXPECT_EQ(kv[0].topic, "kv");
  EXPECT_EQ(kv[0].from, "p");
  EXPECT_TRUE(inbox.PopAll("kv").empty());
  auto app = inbox.PopAll();
  ASSERT_EQ(app.size(), 2u);
  EXPECT_EQ(app[0].message, "app-1");
  EXPECT_EQ(app[1].message, "app-2");
  EXPECT_EQ(app[1].from, "q");
  EXPECT_TRUE(inbox.PopAll("other").empty());
}

TEST(Inbox, BoundsThePayloadNotTheFrame) {
  Inbox inbox(8, 16, 32);
  EXPECT_EQ(inbox.max_payload_bytes(), 16u);
  EXPECT_EQ(inbox.max_bytes(), 16u + kNotifyFrameOverhead);
  const std::string topic(kMaxTopicBytes, 't');
  ASSERT_TRUE(inbox.Push({"p", EncodeNotifyFrame(topic, std::string(16, 'x'))}).ok());
  EXPECT_EQ(inbox.Push({"p", EncodeNotifyFrame(topic, std::string(17, 'x'))}).code(), Code::kInvalidArgument);
  ASSERT_TRUE(inbox.Push({"p", std::string(16, 'y')}).ok());
  // 32 payload bytes pending: the byte bound is reached.
  EXPECT_EQ(inbox.Push({"p", "z"}).code(), Code::kResourceExhausted);
  EXPECT_EQ(inbox.dropped(), 2u);
  EXPECT_EQ(inbox.PopAll(topic).size(), 1u);
  ASSERT_TRUE(inbox.Push({"p", "z"}).ok());
}

TEST(Inbox, MalformedFramesAreRejectedNotDelivered) {
  Inbox inbox(8, 64);
  EXPECT_EQ(inbox.Push({"p", std::string("\xFF\xA7\x09\x00", 4)}).code(), Code::kInvalidArgument);
  EXPECT_EQ(inbox.rejected(), 1u);
  EXPECT_EQ(inbox.dropped(), 0u);
  EXPECT_TRUE(inbox.PopAll().empty());
}

}  // namespace
}  // namespace ferry::internal
