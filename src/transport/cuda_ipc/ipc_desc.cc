#include "transport/cuda_ipc/ipc_desc.h"

#include <cstring>

#include "base/codec.h"
#include "transport/region.h"

namespace ferry::internal::cuda_ipc {
namespace {

constexpr std::string_view kEngineMagic = "ferry.cuda_ipc.engine";
constexpr std::string_view kRegionMagic = "ferry.cuda_ipc.region";
constexpr uint64_t kVersion = 1;

codec::Limits AccessLimits() {
  codec::Limits limits;
  limits.max_bytes = 4096;
  limits.max_array = 16;
  limits.max_str = 1024;
  limits.max_depth = 2;
  return limits;
}

Status CheckHeader(codec::ArrayReader& r, std::string_view magic) {
  FERRY_ASSIGN_OR_RETURN(std::string_view got, r.Bytes("magic", 64));
  if (got != magic) return Status(Code::kInvalidArgument, "not a " + std::string(magic) + " entry");
  FERRY_ASSIGN_OR_RETURN(uint64_t version, r.UInt("version"));
  if (version != kVersion)
    return Status(Code::kInvalidArgument, "cuda_ipc entry version " + std::to_string(version) + " is not supported");
  return Status::Ok();
}

}  // namespace

std::string PackEngineAccess(const EngineAccess& a) {
  codec::Writer w;
  w.Array(4);
  w.Str(kEngineMagic);
  w.UInt(kVersion);
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
  codec::Writer w;
  w.Array(8);
  w.Str(kRegionMagic);
  w.UInt(kVersion);
  w.Str(a.process_token);
  w.Bin(std::string_view(reinterpret_cast<const char*>(a.handle.bytes.data()), a.handle.bytes.size()));
  w.UInt(a.offset);
  w.UInt(a.allocation_size);
  w.UInt(a.lease_slot);
  w.UInt(a.region);
  return w.Take();
}

Result<RegionAccess> UnpackRegionAccess(std::string_view bytes, uint64_t region_size) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(bytes, AccessLimits()));
  codec::ArrayReader r = reader.root();
  if (r.size() != 8) return Status(Code::kInvalidArgument, "cuda_ipc region entry has the wrong field count");
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
  if (!InBounds(a.offset, region_size, a.allocation_size))
    return Status(Code::kInvalidArgument, "cuda_ipc region lies outside its allocation");
  return a;
}

}  // namespace ferry::internal::cuda_ipc
