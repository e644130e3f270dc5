// The batched copy kernel: one launch moves every piece of a batch, whatever the number of
// pieces. The interface holds no CUDA type so that plain C++ files can include it.
#pragma once

#include <cstdint>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace ferry::cuda {

// One piece of a batch, as the kernel reads it from device-visible memory. Addresses are
// device-visible: device memory of the launching device, peer memory it may access, or mapped
// page-locked host memory.
struct Piece {
  uint64_t dst;
  uint64_t src;
  uint64_t size;
};

// Pieces a warp copies at once; larger pieces are split by the caller so that one long piece
// does not leave the rest of the grid idle.
inline constexpr uint64_t kMaxPieceBytes = 64 * 1024;
inline constexpr int kCopyThreadsPerBlock = 256;

// Enqueues one kernel on `stream` that copies `count` pieces read from `pieces` (device memory),
// one warp per piece in a grid-stride loop over at most `max_blocks` blocks. Uses 16-byte
// loads and stores where source and destination share their alignment mod 16, narrower words
// where they share less. Returns the launch's cudaError_t (0 = success).
// REQUIRES: every piece's size <= kMaxPieceBytes (the kernel counts bytes in 32 bits).
int LaunchBatchCopy(const Piece* pieces, uint32_t count, uint32_t max_blocks, CUstream_st* stream);

// A batch's op as the engine hands it over (the layout of ferry::TransferOp): the kernel below
// reads these as they are, so the host copies them into the descriptor ring instead of
// computing a Piece for each.
struct OffsetPiece {
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t size;
};

// As LaunchBatchCopy for pieces given as offsets: piece i copies ops[i].size bytes from
// src + (write ? local_offset : remote_offset) to dst + (write ? remote_offset : local_offset),
// one warp per op. REQUIRES: every size < 4 GiB; ops of similar sizes, none much larger than
// kMaxPieceBytes, keep the grid busy to the end. ops_ahead: each warp loads its next op before
// copying the current one (for ops in mapped host memory, a PCIe round trip away).
int LaunchOffsetCopy(const OffsetPiece* ops, uint32_t count, char* dst, const char* src, bool write,
                     uint32_t max_blocks, CUstream_st* stream, bool ops_ahead = false);

}  // namespace ferry::cuda
