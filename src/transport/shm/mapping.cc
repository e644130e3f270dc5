#include "transport/shm/mapping.h"

#include <sys/mman.h>

#include <string>

namespace ferry::internal::shm {

Result<std::shared_ptr<Mapping>> Mapping::Map(int fd, uint64_t file_offset, uint64_t size) {
  if (size == 0) return Status(Code::kInvalidArgument, "empty region");
  // A file that may shrink could take pages away under a copy (SIGBUS): only sealed ones.
  Result<uint64_t> file_size = os::SealedFileSize(fd);
  if (!file_size.ok()) return file_size.status().WithContext("the peer's memory file");
  if (file_offset > *file_size || size > *file_size - file_offset)
    return Status(Code::kInvalidArgument, "the region lies outside the peer's memory file");
  Result<os::SharedMapping> m = os::SharedMapping::Map(fd, file_offset, size, MAP_POPULATE);
  if (!m.ok()) return Status(Code::kResourceExhausted, std::string(m.status().message())).WithContext("the peer's region");
  std::shared_ptr<Mapping> out(new Mapping());
  out->mapping_ = std::move(*m);
  return out;
}

Mapping::~Mapping() {
  mapping_.Reset();
  if (on_unmapped_) on_unmapped_();
}

}  // namespace ferry::internal::shm
