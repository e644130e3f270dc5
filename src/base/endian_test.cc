#include "base/endian.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry {
namespace {

TEST(Endian, StoresLeastSignificantByteFirst) {
  std::array<uint8_t, 8> b{};
  StoreLe16(b.data(), 0x0102);
  EXPECT_EQ(b[0], 0x02);
  EXPECT_EQ(b[1], 0x01);
  StoreLe32(b.data(), 0x01020304);
  EXPECT_EQ((std::array<uint8_t, 4>{b[0], b[1], b[2], b[3]}), (std::array<uint8_t, 4>{4, 3, 2, 1}));
  StoreLe64(b.data(), 0x0102030405060708ULL);
  EXPECT_EQ(b, (std::array<uint8_t, 8>{8, 7, 6, 5, 4, 3, 2, 1}));
}

TEST(Endian, LoadsWhatWasStoredAtUnalignedAddresses) {
  std::array<std::byte, 32> buf{};
  for (size_t at = 0; at < 8; ++at) {
    StoreLe16(buf.data() + at, 0xbeef);
    EXPECT_EQ(LoadLe16(buf.data() + at), 0xbeef);
    StoreLe32(buf.data() + at, 0xdeadbeefu);
    EXPECT_EQ(LoadLe32(buf.data() + at), 0xdeadbeefu);
    StoreLe64(buf.data() + at, 0xfedcba9876543210ULL);
    EXPECT_EQ(LoadLe64(buf.data() + at), 0xfedcba9876543210ULL);
  }
}

TEST(Endian, ReadsFixedBytesWhateverTheByteType) {
  const unsigned char u[8] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe};
  const std::string s(reinterpret_cast<const char*>(u), 8);
  EXPECT_EQ(LoadLe64(u), 0xfedcba9876543210ULL);
  EXPECT_EQ(LoadLe64(s.data()), 0xfedcba9876543210ULL);
  EXPECT_EQ(LoadLe32(s.data() + 4), 0xfedcba98u);
  EXPECT_EQ(LoadLe16(reinterpret_cast<const std::byte*>(u) + 6), 0xfedc);
}

TEST(Endian, ExtremesRoundTrip) {
  char b[8];
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0x80} << 56, ~uint64_t{0}}) {
    StoreLe64(b, v);
    EXPECT_EQ(LoadLe64(b), v);
  }
  StoreLe32(b, 0xffffffffu);
  EXPECT_EQ(LoadLe32(b), 0xffffffffu);
  StoreLe16(b, 0);
  EXPECT_EQ(LoadLe16(b), 0);
}

}  // namespace
}  // namespace ferry
