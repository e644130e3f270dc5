// The payloads of the `ucx` transport's staged messages (staged.h; headers in am_wire.h), all
// little-endian:
//   piece table     [u32 count][count x (u64 target offset, u64 size)]
//   kStagedWrite    a piece table, then the pieces' bytes concatenated: one chunk of at most
//                   kStageChunkBytes; the header's `size` is the whole payload's
//   kStagedReadReq  a piece table alone; the header's `offset` carries the bytes asked for,
//                   which come back concatenated in one kReadResp
// Decoding checks every field against the target region: nothing from a peer is trusted.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::internal::ucx {

inline constexpr uint64_t kStageChunkBytes = 4 << 20;
inline constexpr size_t kStageMaxPieces = 4096;  // per chunk: bounds the piece table

struct StagedPiece {
  uint64_t offset = 0;  // in the target region
  uint64_t size = 0;
};

constexpr size_t PieceTableBytes(size_t pieces) { return 4 + 16 * pieces; }

// Writes the table of `pieces` at `out`. REQUIRES: PieceTableBytes(pieces.size()) bytes at
// `out`; 1 <= pieces.size() <= kStageMaxPieces.
void EncodePieceTable(std::span<const StagedPiece> pieces, std::byte* out);
// A kStagedReadReq's payload: the table of `pieces`.
std::string EncodeStagedReadReq(std::span<const StagedPiece> pieces);

// Decodes the table at the start of `bytes` (from a peer): kInvalidArgument when truncated,
// with no piece or more than kStageMaxPieces, or with more than kStageChunkBytes in all;
// kOutOfRange when a piece leaves [0, region_size). Sets *table_bytes and *total (the sum of
// the sizes) on success.
Result<std::vector<StagedPiece>> DecodePieceTable(const std::byte* bytes, size_t length, uint64_t region_size,
                                                  size_t* table_bytes, uint64_t* total);

struct StagedWrite {
  std::vector<StagedPiece> pieces;
  size_t data_offset = 0;  // where the pieces' bytes start in the payload (the table's size)
  uint64_t total = 0;      // the pieces' bytes
};
// A kStagedWrite's payload of `length` bytes: DecodePieceTable's errors, and kInvalidArgument
// when the bytes that follow the table are not exactly the pieces'.
Result<StagedWrite> DecodeStagedWrite(const std::byte* payload, size_t length, uint64_t region_size);
// A kStagedReadReq's payload of `length` bytes that asks for `asked` bytes (its header's
// `offset`): DecodePieceTable's errors, and kInvalidArgument when anything follows the table or
// the pieces do not add up to `asked`.
Result<std::vector<StagedPiece>> DecodeStagedReadReq(const std::byte* payload, size_t length, uint64_t asked,
                                                     uint64_t region_size);

}  // namespace ferry::internal::ucx
