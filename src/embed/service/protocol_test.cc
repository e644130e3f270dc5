#include "embed/service/protocol.h"

#include <gtest/gtest.h>

#include "base/codec.h"
#include "testing/embed_service.h"

namespace ferry::embed::service {
namespace {

using testing::kTokenBytes;

// Rank 0 of 2 in data-parallel group 3, with the inputs (embed_service.h).
Register SampleRegister() { return testing::SmallRegister(3, 0, 2); }

TEST(EmbedProtocol, RoundTripsEveryMessage) {
  Register r = SampleRegister();
  Result<AnyMessage> d = Decode(Encode(r));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const Register& back = std::get<Register>(*d);
  EXPECT_EQ(back.dp_rank, 3u);
  EXPECT_EQ(back.tp_size, 2u);
  EXPECT_EQ(back.max_tokens, 512u);
  EXPECT_EQ(back.token_bytes, kTokenBytes);
  ASSERT_EQ(back.layers.size(), 3u);
  EXPECT_EQ(back.layers[2].layer, 2u);
  EXPECT_EQ(back.layers[2].output_offset, 2 * 512 * kTokenBytes);
  EXPECT_EQ(back.layers[2].flag_offset, 3 * 512 * kTokenBytes + 128);
  EXPECT_EQ(back.inputs.ngram_context, 2560u);

  Result<AnyMessage> q = Decode(Encode(Request{42, 8192, 8, 3}));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(std::get<Request>(*q).seq, 42u);
  EXPECT_EQ(std::get<Request>(*q).num_tokens, 8192u);
  EXPECT_EQ(std::get<Request>(*q).num_reqs, 8u);
  EXPECT_EQ(std::get<Request>(*q).dp_rank, 3u);

  Result<AnyMessage> p = Decode(Encode(Reply{5, Status(Code::kOutOfRange, "id 9 >= V")}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(std::get<Reply>(*p).seq, 5u);
  EXPECT_EQ(std::get<Reply>(*p).status.code(), Code::kOutOfRange);
  EXPECT_EQ(std::get<Reply>(*p).status.message(), "id 9 >= V");

  Result<AnyMessage> ok = Decode(Encode(Registered{Status::Ok()}));
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(std::get<Registered>(*ok).status.ok());
}

// The wire's type numbers (each message's 1-based index in AnyMessage) never change.
TEST(EmbedProtocol, TypeNumbersAreStable) {
  auto type_of = [](const std::string& bytes) -> uint64_t {
    Result<codec::Reader> reader = codec::Reader::Parse(bytes, codec::Limits{});
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    if (!reader.ok()) return 0;
    codec::ArrayReader r = reader->root();
    EXPECT_EQ(r.UInt("version").value(), kEmbedProtocolVersion);
    return r.UInt("type").value();
  };
  EXPECT_EQ(type_of(Encode(SampleRegister())), 1u);
  EXPECT_EQ(type_of(Encode(Registered{Status::Ok()})), 2u);
  EXPECT_EQ(type_of(Encode(Request{1, 2, 3})), 3u);
  EXPECT_EQ(type_of(Encode(Reply{1, Status::Ok()})), 4u);
  EXPECT_EQ(type_of(Encode(StatsRequest{true})), 5u);
  EXPECT_EQ(type_of(Encode(Stats{})), 6u);
}

TEST(EmbedProtocol, RejectsEveryTruncation) {
  std::string bytes = Encode(SampleRegister());
  for (size_t n = 0; n < bytes.size(); ++n) {
    Result<AnyMessage> d = Decode(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(d.ok()) << n;
    EXPECT_EQ(d.status().code(), Code::kInvalidArgument) << n;
  }
}

TEST(EmbedProtocol, RejectsOtherVersionsAndTypes) {
  codec::Writer w;
  w.Array(5);
  w.UInt(kEmbedProtocolVersion + 1);
  w.UInt(3);
  w.UInt(1);
  w.UInt(1);
  w.UInt(1);
  EXPECT_EQ(Decode(w.Take()).status().code(), Code::kUnsupported);
  w.Array(2);
  w.UInt(kEmbedProtocolVersion);
  w.UInt(99);
  EXPECT_EQ(Decode(w.Take()).status().code(), Code::kInvalidArgument);
}

TEST(EmbedProtocol, RejectsOutOfRangeFields) {
  Register r = SampleRegister();
  r.tp_rank = 2;  // >= tp_size
  EXPECT_EQ(Decode(Encode(r)).status().code(), Code::kInvalidArgument);
  r = SampleRegister();
  r.max_tokens = kMaxTokens + 1;
  EXPECT_EQ(Decode(Encode(r)).status().code(), Code::kInvalidArgument);
  r = SampleRegister();
  r.has_inputs = false;  // rank 0 must bring the inputs
  EXPECT_EQ(Decode(Encode(r)).status().code(), Code::kInvalidArgument);
  r = SampleRegister();
  r.layers[1].flag_offset += 1;  // unaligned
  EXPECT_EQ(Decode(Encode(r)).status().code(), Code::kInvalidArgument);
  r = SampleRegister();
  r.layers[1].layer = r.layers[0].layer;  // twice
  EXPECT_EQ(Decode(Encode(r)).status().code(), Code::kInvalidArgument);
  r = SampleRegister();
  r.layers[0].output_ipc = std::string(64, 'x');  // host mode carries no IPC handle
  EXPECT_EQ(Decode(Encode(r)).status().code(), Code::kInvalidArgument);
  r = SampleRegister();
  r.mode = OutputMode::kCuda;  // CUDA mode needs 64-byte handles
  EXPECT_EQ(Decode(Encode(r)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Decode(Encode(Request{1, kMaxTokens + 1, 1})).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Decode(Encode(Request{1, 1, 1, kMaxDpRanks})).status().code(), Code::kInvalidArgument);
}

TEST(EmbedProtocol, RejectsTrailingFields) {
  std::string bytes = Encode(Request{1, 2, 3});
  codec::Writer w;
  w.Array(7);
  w.UInt(kEmbedProtocolVersion);
  w.UInt(3);
  w.UInt(1);
  w.UInt(0);
  w.UInt(2);
  w.UInt(3);
  w.UInt(4);
  EXPECT_EQ(Decode(w.Take()).status().code(), Code::kInvalidArgument);
}

// The seq of a request that does not decode, for its reply (issue 9).
TEST(EmbedProtocol, RequestSeqOfReadsThePrefix) {
  std::string req = Encode(Request{1ull << 40, 10, 1, 0});
  EXPECT_EQ(RequestSeqOf(req), 1ull << 40);
  EXPECT_EQ(RequestSeqOf(req.substr(0, req.size() - 1)), 1ull << 40);
  EXPECT_EQ(RequestSeqOf(Encode(Request{7, 1u << 21, 1, 0})), 7u);  // out of range, still read
  EXPECT_EQ(RequestSeqOf(req.substr(0, 3)), std::nullopt);           // the seq cut short
  EXPECT_EQ(RequestSeqOf(Encode(Reply{5, Status::Ok()})), std::nullopt);
  EXPECT_EQ(RequestSeqOf(""), std::nullopt);
  EXPECT_EQ(RequestSeqOf("\xff\xff"), std::nullopt);
}

// Found by embed_protocol_fuzz: a type of 0x4003 was taken for type 3 (a request).
TEST(EmbedProtocol, TypesPastOneByteAreUnknown) {
  const std::string bytes("\x96\x01\xcd\x40\x03\x00\x20\x01\x08", 9);
  auto m = Decode(bytes);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument) << m.status().ToString();
  EXPECT_FALSE(RequestSeqOf(bytes).has_value());
}

}  // namespace
}  // namespace ferry::embed::service
