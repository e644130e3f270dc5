#include "base/memory_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

namespace ferry::os {

Result<UniqueFd> CreateMemoryFile(const char* name, uint64_t bytes, bool final) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "a memory file of 0 bytes");
  Env* env = Env::Current();
  UniqueFd fd(env->MemfdCreate(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  const std::string what = " for " + std::to_string(bytes) + " shared bytes";
  if (!fd.valid()) return ErrnoStatus(Code::kResourceExhausted, "memfd_create" + what, errno);
  if (env->Ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return ErrnoStatus(Code::kResourceExhausted, "ftruncate" + what, errno);
  const int seals = F_SEAL_SHRINK | F_SEAL_GROW | (final ? F_SEAL_SEAL : 0);
  if (::fcntl(fd.get(), F_ADD_SEALS, seals) != 0)
    return ErrnoStatus(Code::kResourceExhausted, "sealing" + what, errno);
  return fd;
}

Result<uint64_t> SealedFileSize(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return ErrnoStatus(Code::kInvalidArgument, "fstat of a memory file", errno);
  if (!S_ISREG(st.st_mode) || st.st_size <= 0)
    return Status(Code::kInvalidArgument, "the memory file is not a non-empty file");
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return Status(Code::kInvalidArgument, "the memory file is not sealed against shrinking");
  return static_cast<uint64_t>(st.st_size);
}

Result<SharedMapping> SharedMapping::Map(int fd, uint64_t offset, uint64_t size, int extra_flags) {
  if (size == 0) return Status(Code::kInvalidArgument, "an empty mapping");
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  if (size > SIZE_MAX - (offset - start))
    return Status(Code::kInvalidArgument, "a mapping larger than memory");
  const uint64_t length = offset - start + size;
  void* p = Env::Current()->Mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | extra_flags,
                                 fd, static_cast<off_t>(start));
  if (p == MAP_FAILED)
    return ErrnoStatus("mapping " + std::to_string(size) + " shared bytes", errno);
  SharedMapping m;
  m.start_ = p;
  m.length_ = length;
  m.data_ = static_cast<std::byte*>(p) + (offset - start);
  m.size_ = size;
  return m;
}

SharedMapping& SharedMapping::operator=(SharedMapping&& o) noexcept {
  if (this != &o) {
    Reset();
    start_ = std::exchange(o.start_, nullptr);
    length_ = std::exchange(o.length_, 0);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void SharedMapping::Release() {
  start_ = nullptr;
  length_ = 0;
  data_ = nullptr;
  size_ = 0;
}

void SharedMapping::Reset() {
  if (start_ != nullptr) (void)Env::Current()->Munmap(start_, length_);
  Release();
}

}  // namespace ferry::os
