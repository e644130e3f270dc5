#include "transport/shm/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ferry::internal::shm {

Result<std::shared_ptr<Mapping>> Mapping::Map(int fd, uint64_t file_offset, uint64_t size) {
  if (size == 0) return Status(Code::kInvalidArgument, "empty region");
  // A file that may shrink could take pages away under a copy (SIGBUS): only sealed ones.
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return Status(Code::kInvalidArgument, "the peer's memory file is not sealed against shrinking");
  struct stat st = {};
  if (fstat(fd, &st) != 0) return Status(Code::kInvalidArgument, std::string("fstat: ") + std::strerror(errno));
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_offset > file_size || size > file_size - file_offset)
    return Status(Code::kInvalidArgument, "the region lies outside the peer's memory file");
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = file_offset / page * page;
  const uint64_t length = file_offset - start + size;
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                 static_cast<off_t>(start));
  if (p == MAP_FAILED)
    return Status(Code::kResourceExhausted, std::string("mapping the peer's region: ") + std::strerror(errno));
  std::shared_ptr<Mapping> m(new Mapping());
  m->start_ = p;
  m->length_ = length;
  m->base_ = static_cast<std::byte*>(p) + (file_offset - start);
  m->size_ = size;
  return m;
}

Mapping::~Mapping() {
  if (start_ != nullptr) munmap(start_, length_);
  if (on_unmapped_) on_unmapped_();
}

}  // namespace ferry::internal::shm
