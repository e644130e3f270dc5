// A region's `ucx` descriptor data (the TransportData that a MemoryDesc carries for this
// transport): [u64 little-endian key][packed UCX remote key, or "staged" for GPU memory that
// peers reach only through staged messages, or "am" for host memory with an access list, which
// peers reach only through active messages that the target checks (no remote key is made)].
// The key is the region's secret: every message that reaches the region carries it
// (am_wire.h). An initiator that predates "am" would take it for a packed remote key where it
// uses RMA (RDMA): allowed peers of a restricted region are upgraded with its owner
// (docs/security.md).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/descriptors.h"
#include "ferry/status.h"

namespace ferry::internal::ucx {

inline constexpr std::string_view kStagedAccess = "staged";
inline constexpr std::string_view kNoRemoteKey = "am";

std::string PackAccess(uint64_t key, std::string_view rest);
// Whether `remote`'s ucx access data carries a remote key for RMA. REQUIRES: AccessKey(remote).ok()
bool HasRemoteKey(const MemoryDesc& remote);
// The key of `remote`'s ucx access data; kInvalidArgument when it has none or it is malformed
// (no byte after the key).
Result<uint64_t> AccessKey(const MemoryDesc& remote);
// What follows the key: the packed remote key. REQUIRES: AccessKey(remote).ok()
std::string_view AccessRest(const MemoryDesc& remote);

}  // namespace ferry::internal::ucx
