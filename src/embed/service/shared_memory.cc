#include "embed/service/shared_memory.h"

namespace ferry::embed::service {

Result<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& name, size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(UniqueFd fd, os::CreateMemoryFile(name.c_str(), bytes));
  FERRY_ASSIGN_OR_RETURN(os::SharedMapping mapping, os::SharedMapping::Map(fd.get(), 0, bytes));
  return std::unique_ptr<SharedMemory>(new SharedMemory(std::move(fd), std::move(mapping)));
}

Result<std::unique_ptr<SharedMemory>> SharedMemory::Map(UniqueFd fd) {
  Result<uint64_t> bytes = os::SealedFileSize(fd.get());
  if (!bytes.ok()) return bytes.status().WithContext("shared memory");
  FERRY_ASSIGN_OR_RETURN(os::SharedMapping mapping, os::SharedMapping::Map(fd.get(), 0, *bytes));
  return std::unique_ptr<SharedMemory>(new SharedMemory(std::move(fd), std::move(mapping)));
}

}  // namespace ferry::embed::service
