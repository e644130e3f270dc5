#include "base/codec.h"

#include <gtest/gtest.h>

namespace ferry::codec {
namespace {

std::string Sample() {
  Writer w;
  w.Array(5);
  w.UInt(42);
  w.Int(-7);
  w.Str("hello");
  w.Bool(true);
  w.Array(2);
  w.Bin(std::string("\x00\x01", 2));
  w.UInt(1);
  return w.Take();
}

TEST(Codec, RoundTrips) {
  auto r = Reader::Parse(Sample());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ArrayReader a = r->root();
  EXPECT_EQ(a.size(), 5u);
  EXPECT_EQ(*a.UInt("u"), 42u);
  EXPECT_EQ(*a.Int("i"), -7);
  EXPECT_EQ(*a.Bytes("s", 16), "hello");
  EXPECT_TRUE(*a.Bool("b"));
  auto inner = a.Array("a", 4);
  ASSERT_TRUE(inner.ok());
  EXPECT_EQ(inner->Bytes("bin", 8)->size(), 2u);
  EXPECT_EQ(*inner->UInt("one"), 1u);
  EXPECT_TRUE(a.done());
  EXPECT_EQ(a.UInt("extra").status().code(), Code::kInvalidArgument);
}

TEST(Codec, RejectsWrongTypes) {
  auto r = Reader::Parse(Sample());
  ASSERT_TRUE(r.ok());
  ArrayReader a = r->root();
  EXPECT_EQ(a.Bytes("u", 8).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(a.UInt("i").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(a.Bytes("s", 2).status().code(), Code::kInvalidArgument);  // too long
}

TEST(Codec, RejectsEveryTruncation) {
  std::string bytes = Sample();
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = Reader::Parse(std::string_view(bytes).substr(0, n));
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << "prefix " << n;
  }
}

TEST(Codec, RejectsTrailingBytesAndNonArrays) {
  EXPECT_EQ(Reader::Parse(Sample() + "x").status().code(), Code::kInvalidArgument);
  Writer w;
  w.UInt(3);
  EXPECT_EQ(Reader::Parse(w.Take()).status().code(), Code::kInvalidArgument);
}

TEST(Codec, RejectsHugeClaimedCountsWithoutAllocating) {
  // array32 claiming 2^32-1 elements, with no elements present.
  std::string bytes = "\xdd\xff\xff\xff\xff";
  EXPECT_EQ(Reader::Parse(bytes).status().code(), Code::kInvalidArgument);
  // str32 claiming 4 GiB.
  std::string str = "\x91\xdb\xff\xff\xff\xff";
  EXPECT_EQ(Reader::Parse(str).status().code(), Code::kInvalidArgument);
}

TEST(Codec, RejectsDeepNesting) {
  std::string bytes(100, '\x91');
  bytes += '\x01';
  EXPECT_EQ(Reader::Parse(bytes).status().code(), Code::kInvalidArgument);
}

TEST(Codec, RejectsOversizedInput) {
  Limits limits;
  limits.max_bytes = 8;
  EXPECT_EQ(Reader::Parse(Sample(), limits).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::codec
