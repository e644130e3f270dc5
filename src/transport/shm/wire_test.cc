#include "transport/shm/wire.h"

#include <gtest/gtest.h>

namespace ferry::internal::shm {
namespace {

TEST(ShmWire, RoundTrips) {
  Header h;
  h.type = MsgType::kOpen;
  h.token = 0x0102030405060708;
  h.region = 77;
  h.offset = UINT64_MAX;
  h.size = 1 << 30;
  std::string bytes = Encode(h);
  ASSERT_EQ(bytes.size(), kHeaderBytes);
  auto m = Decode(bytes.data(), bytes.size());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->header.type, MsgType::kOpen);
  EXPECT_EQ(m->header.token, h.token);
  EXPECT_EQ(m->header.region, 77u);
  EXPECT_EQ(m->header.offset, UINT64_MAX);
  EXPECT_EQ(m->header.size, h.size);
  EXPECT_TRUE(m->payload.empty());

  Header n;
  n.type = MsgType::kHello;
  n.size = 5;
  bytes = Encode(n, "hello");
  m = Decode(bytes.data(), bytes.size());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->payload, "hello");

  Header ring;
  ring.type = MsgType::kRing;
  ring.code = static_cast<uint8_t>(Code::kResourceExhausted);
  ring.size = 1 << 18;
  ring.offset = 65536;
  bytes = Encode(ring);
  m = Decode(bytes.data(), bytes.size());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->header.type, MsgType::kRing);
  EXPECT_EQ(m->header.size, 1u << 18);
  EXPECT_EQ(m->header.offset, 65536u);
  Header wake;
  wake.type = MsgType::kWake;
  bytes = Encode(wake);
  ASSERT_TRUE(Decode(bytes.data(), bytes.size()).ok());

  Header ack;
  ack.type = MsgType::kAck;
  ack.code = static_cast<uint8_t>(Code::kResourceExhausted);
  bytes = Encode(ack);
  m = Decode(bytes.data(), bytes.size());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->header.code, static_cast<uint8_t>(Code::kResourceExhausted));
}

TEST(ShmWire, RejectsMalformed) {
  Header h;
  h.type = MsgType::kOpen;
  const std::string good = Encode(h);
  auto bad = [](std::string b) { return Decode(b.data(), b.size()).status().code(); };
  EXPECT_EQ(Decode(nullptr, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad(good.substr(0, kHeaderBytes - 1)), Code::kInvalidArgument);  // short
  std::string b = good;
  b[0] = 1;  // version (1 carried notifications over the socket)
  EXPECT_EQ(bad(b), Code::kInvalidArgument);
  b = good;
  b[1] = 0;  // type
  EXPECT_EQ(bad(b), Code::kInvalidArgument);
  b[1] = 10;  // past kAuth
  EXPECT_EQ(bad(b), Code::kInvalidArgument);
  b = good;
  b[5] = 1;  // reserved
  EXPECT_EQ(bad(b), Code::kInvalidArgument);
  b = good;
  b[2] = 3;  // a status code on a request
  EXPECT_EQ(bad(b), Code::kInvalidArgument);
  Header ack;
  ack.type = MsgType::kAck;
  b = Encode(ack);
  b[2] = 17;  // no such code
  EXPECT_EQ(bad(b), Code::kInvalidArgument);
  EXPECT_EQ(bad(good + "x"), Code::kInvalidArgument);  // payload on a message without one
  Header n;
  n.type = MsgType::kHello;
  n.size = 4;
  EXPECT_EQ(bad(Encode(n, "abc")), Code::kInvalidArgument);  // size != payload
  n.size = 2;
  EXPECT_EQ(bad(Encode(n, "abc")), Code::kInvalidArgument);
  n.size = kMaxPayloadBytes + 1;
  EXPECT_EQ(bad(Encode(n, std::string(kMaxPayloadBytes + 1, 'x'))), Code::kInvalidArgument);
}

TEST(ShmWire, HeaderAloneOfAMessageCutShort) {
  Header n;
  n.type = MsgType::kHello;
  n.token = 9;
  n.size = 100000;
  std::string head = Encode(n);  // the payload did not fit the receiver's buffer
  EXPECT_EQ(Decode(head.data(), head.size()).status().code(), Code::kInvalidArgument);
  auto h = DecodeHeader(head.data(), head.size());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->token, 9u);
  EXPECT_EQ(h->size, 100000u);
  head[1] = 99;
  EXPECT_EQ(DecodeHeader(head.data(), head.size()).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::internal::shm
