// The staged messages' payloads (staged_wire.h): round trips, and every malformed table a peer
// could send rejected with its exact code.
#include "transport/ucx/staged_wire.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "base/endian.h"

namespace ferry::internal::ucx {
namespace {

std::vector<std::byte> Table(const std::vector<StagedPiece>& pieces) {
  std::vector<std::byte> buf(PieceTableBytes(pieces.size()));
  EncodePieceTable(pieces, buf.data());
  return buf;
}

TEST(StagedWire, PieceTableLayoutIsLittleEndian) {
  auto buf = Table({{0x0102030405060708ULL, 0x10}});
  ASSERT_EQ(buf.size(), 20u);
  EXPECT_EQ(buf[0], std::byte{1});  // count
  EXPECT_EQ(buf[3], std::byte{0});
  EXPECT_EQ(buf[4], std::byte{0x08});  // offset, least significant byte first
  EXPECT_EQ(buf[11], std::byte{0x01});
  EXPECT_EQ(buf[12], std::byte{0x10});  // size
}

TEST(StagedWire, PieceTableRoundTripAndRejections) {
  std::vector<StagedPiece> pieces = {{0, 10}, {100, 5}, {4090, 6}};
  auto buf = Table(pieces);
  size_t table = 0;
  uint64_t total = 0;
  auto back = DecodePieceTable(buf.data(), buf.size(), 4096, &table, &total);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(table, buf.size());
  EXPECT_EQ(total, 21u);
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[2].offset, 4090u);
  EXPECT_EQ((*back)[2].size, 6u);
  // A piece past the end of the target region.
  EXPECT_EQ(DecodePieceTable(buf.data(), buf.size(), 4095, &table, &total).status().code(), Code::kOutOfRange);
  // Every truncation, and no bytes at all.
  for (size_t n = 0; n < buf.size(); ++n)
    EXPECT_EQ(DecodePieceTable(buf.data(), n, 4096, &table, &total).status().code(), Code::kInvalidArgument) << n;
  EXPECT_EQ(DecodePieceTable(nullptr, 0, 4096, &table, &total).status().code(), Code::kInvalidArgument);
  // Zero pieces, too many pieces.
  std::vector<std::byte> zero(4, std::byte{0});
  EXPECT_EQ(DecodePieceTable(zero.data(), zero.size(), 4096, &table, &total).status().code(), Code::kInvalidArgument);
  std::vector<std::byte> many(4, std::byte{0xff});
  EXPECT_EQ(DecodePieceTable(many.data(), many.size(), 4096, &table, &total).status().code(), Code::kInvalidArgument);
  // A chunk claiming more bytes than a bounce buffer holds.
  auto bb = Table({{0, kStageChunkBytes}, {0, 1}});
  EXPECT_EQ(DecodePieceTable(bb.data(), bb.size(), UINT64_MAX, &table, &total).status().code(), Code::kInvalidArgument);
  // Sizes whose sum wraps to a small number.
  auto wrapped = Table({{0, 1}, {0, UINT64_MAX}});
  EXPECT_EQ(DecodePieceTable(wrapped.data(), wrapped.size(), UINT64_MAX, &table, &total).status().code(),
            Code::kInvalidArgument);
  // Offsets that would wrap.
  auto wb = Table({{UINT64_MAX - 1, 4}});
  EXPECT_EQ(DecodePieceTable(wb.data(), wb.size(), UINT64_MAX, &table, &total).status().code(), Code::kOutOfRange);
}

TEST(StagedWire, WriteCarriesExactlyItsPiecesBytes) {
  std::vector<StagedPiece> pieces = {{8, 3}, {0, 2}};
  auto payload = Table(pieces);
  const size_t table = payload.size();
  for (char c : std::string("abcde")) payload.push_back(static_cast<std::byte>(c));
  auto w = DecodeStagedWrite(payload.data(), payload.size(), 64);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->data_offset, table);
  EXPECT_EQ(w->total, 5u);
  ASSERT_EQ(w->pieces.size(), 2u);
  EXPECT_EQ(w->pieces[0].offset, 8u);
  EXPECT_EQ(w->pieces[1].size, 2u);
  // Truncated data, data beyond the pieces', a piece outside the region.
  EXPECT_EQ(DecodeStagedWrite(payload.data(), payload.size() - 1, 64).status().code(), Code::kInvalidArgument);
  payload.push_back(std::byte{0});
  EXPECT_EQ(DecodeStagedWrite(payload.data(), payload.size(), 64).status().code(), Code::kInvalidArgument);
  payload.pop_back();
  EXPECT_EQ(DecodeStagedWrite(payload.data(), payload.size(), 10).status().code(), Code::kOutOfRange);
}

TEST(StagedWire, ReadRequestRoundTripAndRejections) {
  std::vector<StagedPiece> pieces = {{0, 100}, {4096, 32768}};
  std::string payload = EncodeStagedReadReq(pieces);
  ASSERT_EQ(payload.size(), PieceTableBytes(2));
  const auto* bytes = reinterpret_cast<const std::byte*>(payload.data());
  auto back = DecodeStagedReadReq(bytes, payload.size(), 32868, 1 << 20);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].offset, 4096u);
  EXPECT_EQ((*back)[1].size, 32768u);
  // Asking for other than the pieces' bytes; trailing bytes; truncated; outside the region.
  EXPECT_EQ(DecodeStagedReadReq(bytes, payload.size(), 32867, 1 << 20).status().code(), Code::kInvalidArgument);
  std::string longer = payload + "x";
  EXPECT_EQ(DecodeStagedReadReq(reinterpret_cast<const std::byte*>(longer.data()), longer.size(), 32868, 1 << 20)
                .status()
                .code(),
            Code::kInvalidArgument);
  EXPECT_EQ(DecodeStagedReadReq(bytes, payload.size() - 1, 32868, 1 << 20).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeStagedReadReq(bytes, payload.size(), 32868, 4096).status().code(), Code::kOutOfRange);
}

TEST(StagedWire, GarbageNeverDecodesOutOfBounds) {
  std::mt19937_64 rng(11);
  std::vector<std::byte> buf(4 + 16 * 8);
  for (int i = 0; i < 100000; ++i) {
    for (auto& b : buf) b = static_cast<std::byte>(rng());
    StoreLe32(buf.data(), static_cast<uint32_t>(rng() % 10));  // plausible counts, to reach the pieces
    const size_t length = rng() % (buf.size() + 1);
    const uint64_t region = rng() % (1 << 20);
    auto w = DecodeStagedWrite(buf.data(), length, region);
    if (!w.ok()) {
      ASSERT_TRUE(w.status().code() == Code::kInvalidArgument || w.status().code() == Code::kOutOfRange);
      continue;
    }
    ASSERT_EQ(w->data_offset + w->total, length);
    for (const auto& p : w->pieces) ASSERT_TRUE(p.offset <= region && p.size <= region - p.offset);
  }
}

}  // namespace
}  // namespace ferry::internal::ucx
