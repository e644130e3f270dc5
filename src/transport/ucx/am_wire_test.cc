#include "transport/ucx/am_wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <unordered_set>

#include "transport/ucx/core.h"

namespace ferry::internal::ucx {
namespace {

TEST(AmWire, RoundTrips) {
  const AmHeader h{.type = MsgType::kWrite, .code = 0, .token = 0x0102030405060708, .region = 7,
                   .offset = UINT64_MAX - 5, .size = 4096, .conn = 0x1122334455667788, .key = 0x99, .lane = 3};
  uint8_t buf[kAmHeaderBytes];
  EncodeHeader(h, buf);
  auto back = DecodeHeader(buf, sizeof(buf), 4096);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->type, MsgType::kWrite);
  EXPECT_EQ(back->token, h.token);
  EXPECT_EQ(back->region, 7u);
  EXPECT_EQ(back->offset, h.offset);
  EXPECT_EQ(back->size, 4096u);
  EXPECT_EQ(back->conn, h.conn);
  EXPECT_EQ(back->key, h.key);
  EXPECT_EQ(back->lane, 3);
}

TEST(AmWire, RejectsMalformedHeaders) {
  AmHeader h;
  h.type = MsgType::kAck;
  h.conn = 1;
  uint8_t buf[kAmHeaderBytes];
  EncodeHeader(h, buf);
  EXPECT_TRUE(DecodeHeader(buf, sizeof(buf), 0).ok());
  EXPECT_EQ(DecodeHeader(buf, sizeof(buf) - 1, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeHeader(nullptr, 0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeHeader(buf, sizeof(buf), 10).status().code(), Code::kInvalidArgument);  // ack with payload
  // One byte of the good header changed.
  const struct {
    size_t at;
    uint8_t value;
    const char* what;
  } kBadBytes[] = {{40, 0, "no connection id"}, {60, 1, "reserved"},  {5, 1, "reserved"},
                   {0, 9, "version"},           {1, 0, "type"},       {1, 77, "type"},
                   {1, 1, "the retired kHello"}, {2, 200, "status code"}};
  for (const auto& c : kBadBytes) {
    uint8_t bad[kAmHeaderBytes];
    std::memcpy(bad, buf, sizeof(bad));
    bad[c.at] = c.value;
    EXPECT_EQ(DecodeHeader(bad, sizeof(bad), 0).status().code(), Code::kInvalidArgument)
        << "byte " << c.at << " = " << int{c.value} << " (" << c.what << ")";
  }
  h.type = MsgType::kWrite;
  h.size = 100;
  EncodeHeader(h, buf);
  EXPECT_EQ(DecodeHeader(buf, sizeof(buf), 99).status().code(), Code::kInvalidArgument);
}

TEST(AmWire, RandomHeadersNeverCrash) {
  std::mt19937_64 rng(3);
  uint8_t buf[kAmHeaderBytes + 8];
  for (int i = 0; i < 100000; ++i) {
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    if (i % 2) buf[0] = kUcxAmVersion;
    (void)DecodeHeader(buf, rng() % sizeof(buf), rng() % 64);
  }
}

AmHeader NotifyHeader(size_t size) {
  AmHeader h;
  h.type = MsgType::kNotify;
  h.conn = 9;
  h.size = size;
  return h;
}

TEST(AmWire, NotificationRoundTrips) {
  const std::string message("layer 3 done\0with a zero byte", 30);
  std::string payload = EncodeNotify(message);
  AmHeader h = NotifyHeader(payload.size());
  uint8_t raw[kAmHeaderBytes];
  EncodeHeader(h, raw);
  auto header = DecodeHeader(raw, sizeof(raw), payload.size());
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  auto back = DecodeNotify(*header, payload.data(), payload.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, message);
  // An empty message is a message.
  auto empty = DecodeNotify(NotifyHeader(0), nullptr, 0);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->empty());
}

TEST(AmWire, MalformedNotificationsAreRejected) {
  std::string payload = EncodeNotify("hello");
  // Truncated: fewer bytes than the header says.
  EXPECT_EQ(DecodeNotify(NotifyHeader(6), payload.data(), payload.size()).status().code(), Code::kInvalidArgument);
  // Oversized: more bytes than the header says.
  EXPECT_EQ(DecodeNotify(NotifyHeader(4), payload.data(), payload.size()).status().code(), Code::kInvalidArgument);
  // Garbage: a payload that is not there, or a header of another message.
  EXPECT_EQ(DecodeNotify(NotifyHeader(5), nullptr, 5).status().code(), Code::kInvalidArgument);
  AmHeader write = NotifyHeader(payload.size());
  write.type = MsgType::kWrite;
  EXPECT_EQ(DecodeNotify(write, payload.data(), payload.size()).status().code(), Code::kInvalidArgument);
  // Random bytes: decoded as they are when their length matches, refused otherwise.
  std::mt19937_64 rng(5);
  std::string junk(256, '\0');
  for (int i = 0; i < 10000; ++i) {
    for (char& c : junk) c = static_cast<char>(rng());
    const size_t length = rng() % junk.size();
    const size_t said = i % 2 ? length : rng() % junk.size();
    auto m = DecodeNotify(NotifyHeader(said), junk.data(), length);
    ASSERT_EQ(m.ok(), said == length);
    if (m.ok()) ASSERT_EQ(*m, std::string_view(junk.data(), length));
    else ASSERT_EQ(m.status().code(), Code::kInvalidArgument);
  }
}

// Answers are matched to requests by token, so a peer must not be able to predict the tokens of
// requests sent to other peers: no two in a row differ by a small step, none repeats, none is 0,
// and two sources (two engines) do not produce the same sequence.
TEST(TokenSource, TokensAreUniqueNonZeroAndUnpredictable) {
  TokenSource a, b;
  std::unordered_set<uint64_t> seen;
  uint64_t prev = a.Next();
  int near = 0, same_as_b = 0;
  for (int i = 0; i < 200000; ++i) {
    uint64_t t = a.Next();
    ASSERT_NE(t, 0u);
    ASSERT_TRUE(seen.insert(t).second) << "token repeated after " << i;
    uint64_t d = t > prev ? t - prev : prev - t;
    if (d < (uint64_t{1} << 32)) ++near;
    if (b.Next() == t) ++same_as_b;
    prev = t;
  }
  EXPECT_LE(near, 2) << "consecutive tokens are close: a peer could guess the next one";
  EXPECT_EQ(same_as_b, 0);
}

}  // namespace
}  // namespace ferry::internal::ucx
