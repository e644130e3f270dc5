// The connector's messages and ReadParams: round trips of every type and field, the block-run
// encoding, and refusal of every malformed input (kInvalidArgument, never a crash).
#include "kv/wire.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "base/codec.h"

namespace ferry::kv {
namespace {

using ::testing::HasSubstr;

void ExpectSame(const Message& a, const Message& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.request, b.request);
  EXPECT_EQ(a.from, b.from);
  EXPECT_EQ(a.from_tp_size, b.from_tp_size);
  EXPECT_EQ(a.blocks, b.blocks);
  EXPECT_EQ(a.num_tokens, b.num_tokens);
  EXPECT_EQ(a.first_token, b.first_token);
  EXPECT_EQ(a.handshake, b.handshake);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.checksums, b.checksums);
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.error, b.error);
}

Message Full(MsgType type) {
  Message m;
  m.type = type;
  m.request = "req-" + std::string(MsgTypeName(type));
  m.from = WorkerId{"decode-0", 2, 3};
  m.from_tp_size = 4;
  m.blocks = {7, 8, 9, 100, 3, 4, UINT64_MAX};
  m.num_tokens = 12345;
  m.first_token = 64;
  m.handshake = "10.0.0.1:5555";
  m.layers = 3;
  m.checksums = {1, UINT64_MAX, 0};
  m.code = static_cast<uint32_t>(Code::kUnavailable);
  m.error = "peer lost";
  return m;
}

const MsgType kAllTypes[] = {MsgType::kAllocation, MsgType::kCompletion, MsgType::kWriteFailed,
                             MsgType::kRelease,    MsgType::kAbort,      MsgType::kAbortAck,
                             MsgType::kPing,       MsgType::kReleaseAck};

void ExpectInvalid(std::string_view bytes, std::string_view what = "") {
  Result<Message> got = Decode(bytes);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kInvalidArgument) << got.status().ToString();
  if (!what.empty()) {
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(what));
  }
}

// A message written field by field, so that a test can put anything in any field.
// The fields of a valid allocation, each a writer step; a test replaces one.
using Field = std::function<void(codec::Writer&)>;
std::vector<Field> ValidFields() {
  return {
      [](codec::Writer& w) { w.UInt(kKvVersion); },
      [](codec::Writer& w) { w.UInt(static_cast<uint64_t>(MsgType::kAllocation)); },
      [](codec::Writer& w) { w.Str("r"); },
      [](codec::Writer& w) { w.Str("inst"); },
      [](codec::Writer& w) { w.UInt(0); },
      [](codec::Writer& w) { w.UInt(0); },
      [](codec::Writer& w) { w.UInt(1); },
      [](codec::Writer& w) { w.Bin(std::string("\x05\x02", 2)); },  // blocks 5, 6
      [](codec::Writer& w) { w.UInt(32); },
      [](codec::Writer& w) { w.UInt(16); },
      [](codec::Writer& w) { w.Str(""); },
      [](codec::Writer& w) { w.UInt(0); },
      [](codec::Writer& w) { w.Array(0); },
      [](codec::Writer& w) { w.UInt(0); },
      [](codec::Writer& w) { w.Str(""); },
  };
}
std::string Write(const std::vector<Field>& fields) {
  codec::Writer w;
  w.Array(static_cast<uint32_t>(fields.size()));
  for (const auto& f : fields) f(w);
  return w.Take();
}
std::string WithField(size_t index, Field f) {
  auto fields = ValidFields();
  fields[index] = std::move(f);
  return Write(fields);
}
std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
std::string Runs(std::initializer_list<std::pair<uint64_t, uint64_t>> runs) {
  std::string out;
  for (auto [first, count] : runs) out += Varint(first) + Varint(count);
  return out;
}

TEST(KvWire, EveryTypeRoundTripsEveryField) {
  for (MsgType type : kAllTypes) {
    SCOPED_TRACE(MsgTypeName(type));
    Message m = Full(type);
    Result<Message> got = Decode(Encode(m));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectSame(*got, m);
  }
}

TEST(KvWire, DefaultsAndBoundsRoundTrip) {
  Message ping;  // kPing, no request
  ping.from.instance = "i";
  Result<Message> got = Decode(Encode(ping));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(*got, ping);

  Message big = Full(MsgType::kCompletion);
  big.request = std::string(kMaxRequestIdBytes, 'r');
  big.from.instance = std::string(kMaxNameBytes, 'n');
  big.from = {big.from.instance, UINT32_MAX, kMaxTpSize - 1};
  big.from_tp_size = kMaxTpSize;
  big.handshake = std::string(kMaxAddressBytes, 'h');
  big.error = std::string(kMaxErrorBytes, 'e');
  big.layers = kMaxMessageLayers;
  big.checksums.assign(kMaxMessageLayers, 0xdeadbeefcafef00dull);
  big.num_tokens = UINT64_MAX;
  big.first_token = UINT64_MAX;
  big.code = 255;
  got = Decode(Encode(big));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(*got, big);
}

TEST(KvWire, TypeNames) {
  EXPECT_EQ(MsgTypeName(MsgType::kAllocation), "allocation");
  EXPECT_EQ(MsgTypeName(MsgType::kAbortAck), "abort_ack");
  EXPECT_EQ(MsgTypeName(static_cast<MsgType>(99)), "unknown");
}

TEST(KvWire, BlockRuns) {
  const std::vector<std::vector<uint64_t>> lists = {
      {},
      {0},
      {UINT64_MAX},
      {UINT64_MAX - 1, UINT64_MAX, 0, 1},  // a run ends at the largest id, the next starts at 0
      {9, 7, 5, 3, 1},                     // descending: one run each
      {1, 1, 1},                           // repeated
      {4, 5, 6, 10, 11, 2, 3},
  };
  for (const auto& blocks : lists) {
    Message m = Full(MsgType::kAllocation);
    m.blocks = blocks;
    Result<Message> got = Decode(Encode(m));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->blocks, blocks);
  }
}

TEST(KvWire, ConsecutiveAllocationIsSmall) {
  Message m = Full(MsgType::kAllocation);
  m.blocks.clear();
  const size_t empty = Encode(m).size();
  for (uint64_t b = 5000; b < 6000; ++b) m.blocks.push_back(b);
  const std::string bytes = Encode(m);
  // One run: two varints.
  EXPECT_LE(bytes.size(), empty + 6);
  Result<Message> got = Decode(bytes);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->blocks, m.blocks);

  // Scattered ids cost a run each, still a few bytes a block.
  m.blocks.clear();
  for (uint64_t b = 0; b < 1000; ++b) m.blocks.push_back(b * 2);
  EXPECT_LE(Encode(m).size(), empty + 1000 * 4);
}

TEST(KvWire, LargestBlockListDecodes) {
  Message m = Full(MsgType::kAllocation);
  m.blocks.clear();
  for (uint64_t b = 0; b < kMaxMessageBlocks; ++b) m.blocks.push_back(b % 2 ? b : b + 7);
  Result<Message> got = Decode(Encode(m));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->blocks.size(), kMaxMessageBlocks);
  m.blocks.push_back(1);
  ExpectInvalid(Encode(m), "blocks");
}

TEST(KvWire, EveryTruncationAndTrailingByteIsRefused) {
  for (MsgType type : kAllTypes) {
    const std::string bytes = Encode(Full(type));
    for (size_t n = 0; n < bytes.size(); ++n) ExpectInvalid(bytes.substr(0, n));
    ExpectInvalid(bytes + '\0');
  }
}

TEST(KvWire, VersionAndTypeAreChecked) {
  ExpectInvalid(WithField(0, [](codec::Writer& w) { w.UInt(kKvVersion + 1); }), "version: 3 vs 2");
  ExpectInvalid(WithField(0, [](codec::Writer& w) { w.Str("1"); }), "version");
  // Another version is named as such even when its shape is not this version's.
  codec::Writer w;
  w.Array(2);
  w.UInt(kKvVersion + 1);
  w.Str("future");
  ExpectInvalid(w.Take(), "version: 3 vs 2");
  for (uint64_t t : {0ull, 9ull, 255ull, 1ull << 40})
    ExpectInvalid(WithField(1, [t](codec::Writer& w) { w.UInt(t); }), "unknown type");
  // The valid base decodes, so each refusal below is the field's.
  ASSERT_TRUE(Decode(Write(ValidFields())).ok());
}

TEST(KvWire, ShapeIsChecked) {
  ExpectInvalid("");
  ExpectInvalid(std::string("\x90", 1));  // an empty array
  ExpectInvalid(std::string("\x01", 1));  // not an array
  auto fields = ValidFields();
  fields.pop_back();
  ExpectInvalid(Write(fields), "fields");
  fields = ValidFields();
  fields.push_back([](codec::Writer& w) { w.UInt(0); });
  ExpectInvalid(Write(fields), "fields");
  // Each field given a value of the wrong kind.
  for (size_t i = 1; i < ValidFields().size(); ++i) {
    SCOPED_TRACE(i);
    const bool stringy = i == 2 || i == 3 || i == 7 || i == 10 || i == 14;
    ExpectInvalid(WithField(i, [stringy](codec::Writer& w) {
      if (stringy)
        w.Array(0);
      else
        w.Str("x");
    }));
  }
}

TEST(KvWire, FieldsOverTheirBoundsAreRefused) {
  ExpectInvalid(WithField(2, [](codec::Writer& w) { w.Str(""); }), "request");
  ExpectInvalid(
      WithField(2, [](codec::Writer& w) { w.Str(std::string(kMaxRequestIdBytes + 1, 'r')); }),
      "request");
  ExpectInvalid(WithField(3, [](codec::Writer& w) { w.Str(""); }), "instance");
  ExpectInvalid(WithField(3, [](codec::Writer& w) { w.Str(std::string(kMaxNameBytes + 1, 'i')); }),
                "instance");
  ExpectInvalid(WithField(4, [](codec::Writer& w) { w.UInt(uint64_t{UINT32_MAX} + 1); }),
                "dp_rank");
  ExpectInvalid(WithField(5, [](codec::Writer& w) { w.UInt(1); }), "tp_rank 1 of tp_size 1");
  ExpectInvalid(WithField(6, [](codec::Writer& w) { w.UInt(0); }), "tp_size");
  ExpectInvalid(WithField(6, [](codec::Writer& w) { w.UInt(kMaxTpSize + 1); }), "tp_size");
  ExpectInvalid(
      WithField(10, [](codec::Writer& w) { w.Str(std::string(kMaxAddressBytes + 1, 'h')); }),
      "handshake");
  ExpectInvalid(WithField(11, [](codec::Writer& w) { w.UInt(kMaxMessageLayers + 1); }), "layers");
  ExpectInvalid(WithField(13, [](codec::Writer& w) { w.UInt(256); }), "code");
  ExpectInvalid(
      WithField(14, [](codec::Writer& w) { w.Str(std::string(kMaxErrorBytes + 1, 'e')); }),
      "error");
  // Checksums: none, or one per layer of the model (at least as many as the layers written).
  auto fields = ValidFields();
  fields[11] = [](codec::Writer& w) { w.UInt(2); };
  fields[12] = [](codec::Writer& w) {
    w.Array(1);
    w.UInt(5);
  };
  ExpectInvalid(Write(fields), "checksums");
  fields[12] = [](codec::Writer& w) {
    w.Array(2);
    w.UInt(5);
    w.Str("x");
  };
  ExpectInvalid(Write(fields), "checksum");
  fields[12] = [](codec::Writer& w) {
    w.Array(2);
    w.UInt(5);
    w.UInt(6);
  };
  EXPECT_TRUE(Decode(Write(fields)).ok());
  // A ping needs no request; anything else does.
  fields = ValidFields();
  fields[1] = [](codec::Writer& w) { w.UInt(static_cast<uint64_t>(MsgType::kPing)); };
  fields[2] = [](codec::Writer& w) { w.Str(""); };
  EXPECT_TRUE(Decode(Write(fields)).ok());
}

TEST(KvWire, MalformedRunsAreRefused) {
  auto with_runs = [](std::string runs) {
    return WithField(7, [runs](codec::Writer& w) { w.Bin(runs); });
  };
  ExpectInvalid(with_runs(Varint(5)), "cut off");               // first without count
  ExpectInvalid(with_runs(std::string("\x85", 1)), "cut off");  // a varint cut off
  ExpectInvalid(with_runs(Runs({{5, 0}})), "no blocks");
  ExpectInvalid(with_runs(std::string(11, '\xff')), "cut off");  // over 64 bits
  ExpectInvalid(with_runs(std::string(9, '\xff') + "\x02" + "\x01"), "cut off");
  // Runs whose expanded count passes the bound, alone or together (and without overflow).
  ExpectInvalid(with_runs(Runs({{0, kMaxMessageBlocks + 1}})), "more than");
  ExpectInvalid(with_runs(Runs({{0, kMaxMessageBlocks}, {0, 1}})), "more than");
  ExpectInvalid(with_runs(Runs({{0, UINT64_MAX}, {0, UINT64_MAX}})), "more than");
  // A run past the largest id.
  ExpectInvalid(with_runs(Runs({{UINT64_MAX, 2}})), "largest block id");
  ExpectInvalid(with_runs(Runs({{UINT64_MAX - 5, 7}})), "largest block id");
  // The largest id itself, and a run that ends on it, are fine.
  Result<Message> got = Decode(with_runs(Runs({{UINT64_MAX - 1, 2}})));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->blocks, (std::vector<uint64_t>{UINT64_MAX - 1, UINT64_MAX}));
  // Runs need not be canonical: adjacent runs decode as one list.
  got = Decode(with_runs(Runs({{5, 1}, {6, 1}})));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->blocks, (std::vector<uint64_t>{5, 6}));
}

TEST(KvWire, OversizedInputIsRefused) {
  ExpectInvalid(std::string(32u << 20, '\x90'), "exceeds");
  // An array that claims far more elements than the bytes hold.
  ExpectInvalid(std::string("\xdd\xff\xff\xff\xff", 5));
  ExpectInvalid(std::string("\xdd\x00\x00\x00\x0e", 5) + std::string(20, '\x00'));
}

ReadParams FullParams() {
  ReadParams p;
  p.request = "req-1";
  p.producer = WorkerId{"prefill-3", 1, 2};
  p.producer_tp_size = 8;
  p.handshake = "127.0.0.1:4000";
  p.blocks = {10, 11, 12, 13, 2, 90};
  p.num_tokens = 77;
  return p;
}

void ExpectSame(const ReadParams& a, const ReadParams& b) {
  EXPECT_EQ(a.request, b.request);
  EXPECT_EQ(a.producer, b.producer);
  EXPECT_EQ(a.producer_tp_size, b.producer_tp_size);
  EXPECT_EQ(a.handshake, b.handshake);
  EXPECT_EQ(a.blocks, b.blocks);
  EXPECT_EQ(a.num_tokens, b.num_tokens);
}

TEST(KvReadParams, RoundTrip) {
  ReadParams p = FullParams();
  Result<ReadParams> got = ReadParams::Unpack(p.Pack());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(*got, p);
  p.handshake.clear();
  p.blocks.clear();
  got = ReadParams::Unpack(p.Pack());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(*got, p);
}

TEST(KvReadParams, MalformedIsRefused) {
  const std::string bytes = FullParams().Pack();
  for (size_t n = 0; n < bytes.size(); ++n) {
    Result<ReadParams> got = ReadParams::Unpack(bytes.substr(0, n));
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), Code::kInvalidArgument);
  }
  auto expect = [](const ReadParams& p, std::string_view what) {
    Result<ReadParams> got = ReadParams::Unpack(p.Pack());
    ASSERT_FALSE(got.ok()) << what;
    EXPECT_EQ(got.status().code(), Code::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(what));
  };
  ReadParams p = FullParams();
  p.request.clear();
  expect(p, "request");
  p.request = std::string(kMaxRequestIdBytes + 1, 'r');
  expect(p, "request");
  p = FullParams();
  p.producer.tp_rank = p.producer_tp_size;
  expect(p, "tp_rank");
  p = FullParams();
  p.producer.instance.clear();
  expect(p, "instance");
  p = FullParams();
  p.handshake = std::string(kMaxAddressBytes + 1, 'h');
  expect(p, "handshake");
  p = FullParams();
  p.blocks.assign(kMaxMessageBlocks + 1, 4);  // one run per block: the bound still holds
  expect(p, "blocks");
  // A message is not ReadParams, nor the other way round.
  EXPECT_EQ(ReadParams::Unpack(Encode(Full(MsgType::kRelease))).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(Decode(FullParams().Pack()).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::kv
