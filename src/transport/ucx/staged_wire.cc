#include "transport/ucx/staged_wire.h"

#include "base/endian.h"
#include "transport/region.h"

namespace ferry::internal::ucx {
namespace {
Status Bad(const std::string& what) { return Status(Code::kInvalidArgument, "staged " + what); }
}  // namespace

void EncodePieceTable(std::span<const StagedPiece> pieces, std::byte* out) {
  StoreLe32(out, static_cast<uint32_t>(pieces.size()));
  for (size_t i = 0; i < pieces.size(); ++i) {
    StoreLe64(out + 4 + 16 * i, pieces[i].offset);
    StoreLe64(out + 12 + 16 * i, pieces[i].size);
  }
}

std::string EncodeStagedReadReq(std::span<const StagedPiece> pieces) {
  std::string table(PieceTableBytes(pieces.size()), '\0');
  EncodePieceTable(pieces, reinterpret_cast<std::byte*>(table.data()));
  return table;
}

Result<std::vector<StagedPiece>> DecodePieceTable(const std::byte* bytes, size_t length, uint64_t region_size,
                                                  size_t* table_bytes, uint64_t* total) {
  if (bytes == nullptr || length < 4) return Bad("piece table is truncated");
  const uint32_t count = LoadLe32(bytes);
  if (count == 0 || count > kStageMaxPieces) return Bad("piece table of " + std::to_string(count) + " pieces");
  if (PieceTableBytes(count) > length) return Bad("piece table is truncated");
  std::vector<StagedPiece> pieces(count);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < count; ++i) {
    pieces[i].offset = LoadLe64(bytes + 4 + 16 * i);
    pieces[i].size = LoadLe64(bytes + 12 + 16 * i);
    if (!InBounds(pieces[i].offset, pieces[i].size, region_size))
      return Status(Code::kOutOfRange, "staged piece outside the target region");
    if (pieces[i].size > kStageChunkBytes - sum) return Bad("chunk larger than a bounce buffer");  // no wrap
    sum += pieces[i].size;
  }
  *table_bytes = PieceTableBytes(count);
  *total = sum;
  return pieces;
}

Result<StagedWrite> DecodeStagedWrite(const std::byte* payload, size_t length, uint64_t region_size) {
  StagedWrite w;
  FERRY_ASSIGN_OR_RETURN(w.pieces, DecodePieceTable(payload, length, region_size, &w.data_offset, &w.total));
  if (w.data_offset + w.total != length) return Bad("chunk size does not match its piece table");
  return w;
}

Result<std::vector<StagedPiece>> DecodeStagedReadReq(const std::byte* payload, size_t length, uint64_t asked,
                                                     uint64_t region_size) {
  size_t table = 0;
  uint64_t total = 0;
  FERRY_ASSIGN_OR_RETURN(auto pieces, DecodePieceTable(payload, length, region_size, &table, &total));
  if (table != length || total != asked) return Bad("read request does not match its piece table");
  return pieces;
}

}  // namespace ferry::internal::ucx
