#include "transport/ucx/door_wire.h"

#include <gtest/gtest.h>

#include <random>

namespace ferry::internal::ucx {
namespace {

TEST(DoorWire, RoundTrips) {
  Hello h{"prefill-0", "decode-0", 3, std::string(300, '\x7f')};
  auto back = DecodeHello(EncodeHello(h));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->from_key, "prefill-0");
  EXPECT_EQ(back->to_key, "decode-0");
  EXPECT_EQ(back->lanes, 3);
  EXPECT_EQ(back->worker_address, h.worker_address);
  Welcome w;
  w.key = "decode-0";
  w.conn_id = 42;
  w.worker_address = "addr";
  auto wb = DecodeWelcome(EncodeWelcome(w));
  ASSERT_TRUE(wb.ok()) << wb.status().ToString();
  EXPECT_EQ(wb->conn_id, 42u);
  EXPECT_EQ(wb->key, "decode-0");
  EXPECT_EQ(wb->code, Code::kOk);
}

TEST(DoorWire, RejectsWhatIsNotAFerryHandshake) {
  EXPECT_EQ(DoorFrameLength(std::string(64, '\0')).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DoorFrameLength(std::string(16, '\xff')).status().code(), Code::kInvalidArgument);
  std::string frame = EncodeHello({"a", "b", 1, "w"});
  // Every prefix of a good frame is plausible (0) until it is whole.
  for (size_t n = 0; n < kDoorPrefixBytes; ++n) EXPECT_EQ(*DoorFrameLength(frame.substr(0, n)), 0u) << n;
  EXPECT_EQ(*DoorFrameLength(frame), frame.size());
  std::string bad = frame;
  bad[6] = 'X';  // magic
  EXPECT_EQ(DoorFrameLength(bad.substr(0, 7)).status().code(), Code::kInvalidArgument);
  bad = frame;
  bad[12] = 9;  // version: a refusal the other engine can read
  EXPECT_EQ(DoorFrameLength(bad).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(DecodeHello(frame.substr(0, frame.size() - 1)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeHello(EncodeHello({"", "b", 1, "w"})).status().code(), Code::kInvalidArgument);   // no key
  EXPECT_EQ(DecodeHello(EncodeHello({"a", "b", 0, "w"})).status().code(), Code::kInvalidArgument);  // no lanes
  EXPECT_EQ(DecodeHello(EncodeHello({"a", "b", 65, "w"})).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeHello(EncodeHello({"a", "b", 1, ""})).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeHello(EncodeWelcome({})).status().code(), Code::kInvalidArgument);  // wrong shape
  Welcome w;
  w.key = "k";  // accepted, but with no id
  EXPECT_EQ(DecodeWelcome(EncodeWelcome(w)).status().code(), Code::kInvalidArgument);
  w.code = Code::kResourceExhausted;
  w.message = "full";
  auto refused = DecodeWelcome(EncodeWelcome(w));
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->code, Code::kResourceExhausted);
}

TEST(DoorWire, RandomBytesNeverCrash) {
  std::mt19937 rng(11);
  std::string good = EncodeHello({"prefill", "decode", 2, std::string(64, 'w')});
  for (int i = 0; i < 20000; ++i) {
    std::string s = good;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) s[rng() % s.size()] = static_cast<char>(rng());
    if (rng() % 3 == 0) s.resize(rng() % s.size());
    (void)DoorFrameLength(s);
    (void)DecodeHello(s);
    (void)DecodeWelcome(s);
  }
}

}  // namespace
}  // namespace ferry::internal::ucx
