#include "transport/ucx/door_wire.h"

#include <gtest/gtest.h>

#include <random>

#include "base/auth.h"

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

TEST(DoorWire, ChallengesAndProofsRoundTripAndMalformedOnesAreRefused) {
  Hello h{"prefill", "decode", 1, "w", std::string(32, 'i')};
  auto back = DecodeHello(EncodeHello(h));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->nonce, h.nonce);
  h.nonce = "short";
  EXPECT_EQ(DecodeHello(EncodeHello(h)).status().code(), Code::kInvalidArgument);
  h.nonce = std::string(32, 'i');
  const std::string tn(32, 't');
  Challenge c{tn, TargetProof("secret-0123456789", h, tn)};
  auto cb = DecodeChallenge(EncodeChallenge(c));
  ASSERT_TRUE(cb.ok()) << cb.status().ToString();
  EXPECT_EQ(cb->nonce, tn);
  EXPECT_EQ(cb->mac, c.mac);
  EXPECT_EQ(*DoorFrameFields(EncodeChallenge(c)), 2u);
  EXPECT_EQ(*DoorFrameFields(EncodeWelcome({})), 5u);
  auto pb = DecodeProof(EncodeProof(Proof{InitiatorProof("secret-0123456789", h, tn)}));
  ASSERT_TRUE(pb.ok());
  EXPECT_NE(pb->mac, c.mac);  // each side's proof has its own label
  EXPECT_EQ(DecodeChallenge(EncodeChallenge(Challenge{"n", c.mac})).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeChallenge(EncodeChallenge(Challenge{tn, "m"})).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeProof(EncodeProof(Proof{"m"})).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeProof(EncodeChallenge(c)).status().code(), Code::kInvalidArgument);  // wrong shape
  EXPECT_EQ(DecodeChallenge(EncodeHello(h)).status().code(), Code::kInvalidArgument);
}

// The proofs come from base/auth.h's shared helper; their bytes are the ones peers already
// send (the MAC over the door's labels and both keys), so old and new engines still agree.
TEST(DoorWire, ProofsBindBothKeysAndKeepTheirBytes) {
  const Hello h{"prefill", "decode", 1, "w", std::string(32, 'i')};
  const std::string tn(32, 't'), secret = "secret-0123456789";
  EXPECT_EQ(TargetProof(secret, h, tn), auth::Mac(secret, "ferry ucx door: target", {h.nonce, tn, h.to_key, h.from_key}));
  EXPECT_EQ(InitiatorProof(secret, h, tn),
            auth::Mac(secret, "ferry ucx door: initiator", {tn, h.nonce, h.from_key, h.to_key}));
  Hello other = h;
  other.from_key = "impostor";  // a holder of the secret claiming another key
  EXPECT_NE(InitiatorProof(secret, other, tn), InitiatorProof(secret, h, tn));
  EXPECT_NE(TargetProof(secret, other, tn), TargetProof(secret, h, tn));
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
    (void)DecodeChallenge(s);
    (void)DecodeProof(s);
    (void)DoorFrameFields(s);
  }
}

}  // namespace
}  // namespace ferry::internal::ucx
