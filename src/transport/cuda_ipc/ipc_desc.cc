#include "transport/cuda_ipc/ipc_desc.h"

#include <array>
#include <cstring>

#include "base/codec.h"
#include "transport/region.h"

namespace ferry::internal::cuda_ipc {
namespace {

constexpr std::string_view kEngineMagic = "ferry.cuda_ipc.engine";
constexpr std::string_view kRegionMagic = "ferry.cuda_ipc.region";
// The version of the cuda_ipc entries of descriptors (region and engine access data), inside
// the descriptor encoding's own version (kDescriptorVersion).
constexpr uint64_t kIpcAccessVersion = 1;

codec::Limits AccessLimits() {
  codec::Limits limits;
  limits.max_bytes = 8192;
  limits.max_array = kMaxVmmRuns;
  limits.max_str = 1024;
  limits.max_depth = 3;  // root, the VMM runs, one run
  return limits;
}

Status CheckHeader(codec::ArrayReader& r, std::string_view magic) {
  FERRY_ASSIGN_OR_RETURN(std::string_view got, r.Bytes("magic", 64));
  if (got != magic) return Status(Code::kInvalidArgument, "not a " + std::string(magic) + " entry");
  FERRY_ASSIGN_OR_RETURN(uint64_t version, r.UInt("version"));
  if (version != kIpcAccessVersion)
    return Status(Code::kInvalidArgument, "cuda_ipc entry version " + std::to_string(version) + " is not supported");
  return Status::Ok();
}

}  // namespace

std::string PackEngineAccess(const EngineAccess& a) {
  codec::Writer w;
  w.Array(4);
  w.Str(kEngineMagic);
  w.UInt(kIpcAccessVersion);
  w.Str(a.process_token);
  w.Str(a.lease_table);
  return w.Take();
}

Result<EngineAccess> UnpackEngineAccess(std::string_view bytes) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(bytes, AccessLimits()));
  codec::ArrayReader r = reader.root();
  if (r.size() != 4) return Status(Code::kInvalidArgument, "cuda_ipc engine entry has the wrong field count");
  FERRY_RETURN_IF_ERROR(CheckHeader(r, kEngineMagic));
  EngineAccess a;
  FERRY_ASSIGN_OR_RETURN(std::string_view token, r.Bytes("process token", kMaxTokenBytes));
  FERRY_ASSIGN_OR_RETURN(std::string_view table, r.Bytes("lease table", kMaxTableNameBytes));
  if (token.empty() || table.empty())
    return Status(Code::kInvalidArgument, "cuda_ipc engine entry has an empty token or table name");
  a.process_token = token;
  a.lease_table = table;
  return a;
}

std::string PackRegionAccess(const RegionAccess& a) {
  // VMM pieces as runs: consecutive descriptors of one size.
  std::vector<std::array<uint64_t, 3>> runs;  // first fd, count, size
  for (const auto& p : a.pieces) {
    if (!runs.empty() && runs.back()[2] == p.size &&
        runs.back()[0] + runs.back()[1] == static_cast<uint64_t>(p.fd)) {
      ++runs.back()[1];
    } else {
      runs.push_back({static_cast<uint64_t>(p.fd), 1, p.size});
    }
  }
  codec::Writer w;
  w.Array(a.vmm() ? 11 : 8);
  w.Str(kRegionMagic);
  w.UInt(kIpcAccessVersion);
  w.Str(a.process_token);
  w.Bin(std::string_view(reinterpret_cast<const char*>(a.handle.bytes.data()), a.handle.bytes.size()));
  w.UInt(a.offset);
  w.UInt(a.allocation_size);
  w.UInt(a.lease_slot);
  w.UInt(a.region);
  if (a.vmm()) {
    w.UInt(a.pid);
    w.UInt(a.export_id);
    w.Array(static_cast<uint32_t>(runs.size()));
    for (const auto& r : runs) {
      w.Array(3);
      for (uint64_t v : r) w.UInt(v);
    }
  }
  return w.Take();
}

// Packs only while the runs fit a descriptor.
bool FitsRegionAccess(const RegionAccess& a) {
  return PackRegionAccess(a).size() <= AccessLimits().max_bytes && a.pieces.size() <= kMaxVmmPieces;
}

Result<RegionAccess> UnpackRegionAccess(std::string_view bytes, uint64_t region_size) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(bytes, AccessLimits()));
  codec::ArrayReader r = reader.root();
  if (r.size() != 8 && r.size() != 11)
    return Status(Code::kInvalidArgument, "cuda_ipc region entry has the wrong field count");
  const bool vmm = r.size() == 11;
  FERRY_RETURN_IF_ERROR(CheckHeader(r, kRegionMagic));
  RegionAccess a;
  FERRY_ASSIGN_OR_RETURN(std::string_view token, r.Bytes("process token", kMaxTokenBytes));
  if (token.empty()) return Status(Code::kInvalidArgument, "cuda_ipc region entry has an empty token");
  a.process_token = token;
  FERRY_ASSIGN_OR_RETURN(std::string_view handle, r.Bytes("ipc handle", cuda::kIpcHandleBytes));
  if (handle.size() != cuda::kIpcHandleBytes)
    return Status(Code::kInvalidArgument, "cuda_ipc handle of " + std::to_string(handle.size()) + " bytes");
  std::memcpy(a.handle.bytes.data(), handle.data(), handle.size());
  FERRY_ASSIGN_OR_RETURN(a.offset, r.UInt("offset"));
  FERRY_ASSIGN_OR_RETURN(a.allocation_size, r.UInt("allocation size"));
  FERRY_ASSIGN_OR_RETURN(uint64_t slot, r.UInt("lease slot"));
  if (slot > UINT32_MAX) return Status(Code::kInvalidArgument, "cuda_ipc lease slot out of range");
  a.lease_slot = static_cast<uint32_t>(slot);
  FERRY_ASSIGN_OR_RETURN(a.region, r.UInt("region"));
  if (a.region == 0) return Status(Code::kInvalidArgument, "cuda_ipc region entry names region 0");
  if (vmm) {
    if (a.handle != cuda::IpcHandle{}) return Status(Code::kInvalidArgument, "cuda_ipc VMM entry with an IPC handle");
    FERRY_ASSIGN_OR_RETURN(uint64_t pid, r.UInt("pid"));
    if (pid == 0 || pid > INT32_MAX) return Status(Code::kInvalidArgument, "cuda_ipc VMM entry with a bad pid");
    a.pid = static_cast<uint32_t>(pid);
    FERRY_ASSIGN_OR_RETURN(a.export_id, r.UInt("export id"));
    if (a.export_id == 0) return Status(Code::kInvalidArgument, "cuda_ipc VMM entry with export id 0");
    FERRY_ASSIGN_OR_RETURN(codec::ArrayReader runs, r.Array("pieces", kMaxVmmRuns));
    if (runs.size() == 0) return Status(Code::kInvalidArgument, "cuda_ipc VMM entry without pieces");
    uint64_t total = 0;
    while (!runs.done()) {
      FERRY_ASSIGN_OR_RETURN(codec::ArrayReader run, runs.Array("run", 3));
      if (run.size() != 3) return Status(Code::kInvalidArgument, "cuda_ipc VMM run has the wrong field count");
      FERRY_ASSIGN_OR_RETURN(uint64_t fd, run.UInt("fd"));
      FERRY_ASSIGN_OR_RETURN(uint64_t count, run.UInt("count"));
      FERRY_ASSIGN_OR_RETURN(uint64_t size, run.UInt("size"));
      if (count == 0 || size == 0 || fd > INT32_MAX || count > INT32_MAX - fd ||
          a.pieces.size() + count > kMaxVmmPieces)
        return Status(Code::kInvalidArgument, "cuda_ipc VMM run out of range");
      for (uint64_t i = 0; i < count; ++i) {
        if (__builtin_add_overflow(total, size, &total))
          return Status(Code::kInvalidArgument, "cuda_ipc VMM pieces overflow 64 bits");
        a.pieces.push_back(cuda::VmmPiece{static_cast<int>(fd + i), size});
      }
    }
    if (total != a.allocation_size)
      return Status(Code::kInvalidArgument, "cuda_ipc VMM pieces do not add up to the allocation size");
  }
  if (!InBounds(a.offset, region_size, a.allocation_size))
    return Status(Code::kInvalidArgument, "cuda_ipc region lies outside its allocation");
  return a;
}

}  // namespace ferry::internal::cuda_ipc
