// What the `cuda_ipc` transport puts into descriptors, and its decoders.
//
// EngineAccess (in EngineDesc): the process token of the engine's process (a peer in the same
// process must use the `local` transport: CUDA cannot open a handle in the process that made
// it) and the name of the engine's lease table (lease_table.h).
// RegionAccess (in MemoryDesc): the IPC handle of the allocation that contains the region, the
// region's offset inside it and the allocation's size, and the lease slot that says whether the
// region is still registered. For VMM memory, instead of the handle: the owner's pid, an export
// id, and its descriptors of the allocations behind the region, packed as runs of consecutive
// descriptors of one size.
//
// Unpack functions take bytes from a peer: they reject truncated, oversized or inconsistent
// input with kInvalidArgument and never trust a size they did not check.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/runtime.h"
#include "ferry/status.h"

namespace ferry::internal::cuda_ipc {

inline constexpr std::string_view kName = "cuda_ipc";
inline constexpr size_t kMaxTokenBytes = 128;
inline constexpr size_t kMaxTableNameBytes = 128;

struct EngineAccess {
  std::string process_token;
  std::string lease_table;  // shared-memory name of the engine's lease table
  friend bool operator==(const EngineAccess&, const EngineAccess&) = default;
};

// At most this many allocations behind one VMM region, and runs of them in a descriptor.
inline constexpr size_t kMaxVmmPieces = size_t{1} << 16;
inline constexpr size_t kMaxVmmRuns = 256;

struct RegionAccess {
  std::string process_token;  // must match the engine's
  cuda::IpcHandle handle;     // of the allocation containing the region (IPC; zero for VMM)
  uint64_t offset = 0;        // of the region inside the allocation (VMM: inside the pieces)
  uint64_t allocation_size = 0;
  uint32_t lease_slot = 0;    // in the owner's lease table
  uint64_t region = 0;        // the region id the slot holds while the region is registered
  // VMM memory (no IPC handle): the owner's pid, an id of this export unique in the owner's
  // process, and the allocations in order, as the owner's descriptors (runtime.h).
  uint32_t pid = 0;
  uint64_t export_id = 0;
  std::vector<cuda::VmmPiece> pieces;
  bool vmm() const { return !pieces.empty(); }
  friend bool operator==(const RegionAccess&, const RegionAccess&) = default;
};

std::string PackEngineAccess(const EngineAccess& a);
Result<EngineAccess> UnpackEngineAccess(std::string_view bytes);

std::string PackRegionAccess(const RegionAccess& a);
// Whether `a` packs within a descriptor's limits (a VMM region of many scattered descriptors
// may not).
bool FitsRegionAccess(const RegionAccess& a);
// Also checks that [offset, offset + region_size) lies inside the allocation.
Result<RegionAccess> UnpackRegionAccess(std::string_view bytes, uint64_t region_size);

}  // namespace ferry::internal::cuda_ipc
