// What the `cuda_ipc` transport puts into descriptors, and its decoders.
//
// EngineAccess (in EngineDesc): the process token of the engine's process (a peer in the same
// process must use the `local` transport: CUDA cannot open a handle in the process that made
// it) and the name of the engine's lease table (lease_table.h).
// RegionAccess (in MemoryDesc): the IPC handle of the allocation that contains the region, the
// region's offset inside it and the allocation's size, and the lease slot that says whether the
// region is still registered.
//
// Unpack functions take bytes from a peer: they reject truncated, oversized or inconsistent
// input with kInvalidArgument and never trust a size they did not check.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

struct RegionAccess {
  std::string process_token;  // must match the engine's
  cuda::IpcHandle handle;     // of the allocation containing the region
  uint64_t offset = 0;        // of the region inside the allocation
  uint64_t allocation_size = 0;
  uint32_t lease_slot = 0;    // in the owner's lease table
  uint64_t region = 0;        // the region id the slot holds while the region is registered
  friend bool operator==(const RegionAccess&, const RegionAccess&) = default;
};

std::string PackEngineAccess(const EngineAccess& a);
Result<EngineAccess> UnpackEngineAccess(std::string_view bytes);

std::string PackRegionAccess(const RegionAccess& a);
// Also checks that [offset, offset + region_size) lies inside the allocation.
Result<RegionAccess> UnpackRegionAccess(std::string_view bytes, uint64_t region_size);

}  // namespace ferry::internal::cuda_ipc
