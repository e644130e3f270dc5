#include "transport/ucx/access_wire.h"

#include "base/endian.h"

namespace ferry::internal::ucx {

std::string PackAccess(uint64_t key, std::string_view rest) {
  std::string out(8, '\0');
  StoreLe64(out.data(), key);
  out.append(rest);
  return out;
}

Result<uint64_t> AccessKey(const MemoryDesc& remote) {
  const TransportData* access = remote.FindAccess("ucx");
  if (access == nullptr) return Status(Code::kInvalidArgument, "remote region has no ucx access");
  if (access->data.size() <= 8) return Status(Code::kInvalidArgument, "remote region's ucx access is malformed");
  return LoadLe64(access->data.data());
}

std::string_view AccessRest(const MemoryDesc& remote) {
  return std::string_view(remote.FindAccess("ucx")->data).substr(8);
}

bool HasRemoteKey(const MemoryDesc& remote) {
  const std::string_view rest = AccessRest(remote);
  return rest != kStagedAccess && rest != kNoRemoteKey;
}

}  // namespace ferry::internal::ucx
