#include "embed/service/shared_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace ferry::embed::service {
namespace {
Status Errno(std::string what) {
  return Status(Code::kInternal, what + ": " + std::strerror(errno));
}
}  // namespace

Result<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& name, size_t bytes) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "shared memory of 0 bytes");
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Errno("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return Errno("ftruncate");
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) return Errno("seal");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return Errno("mmap");
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(std::move(fd), static_cast<uint8_t*>(p), bytes));
}

Result<std::unique_ptr<SharedMemory>> SharedMemory::Map(UniqueFd fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Errno("fstat");
  if (!S_ISREG(st.st_mode) || st.st_size <= 0)
    return Status(Code::kInvalidArgument, "shared memory descriptor is not a non-empty file");
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return Status(Code::kInvalidArgument, "shared memory is not sealed against shrinking");
  size_t bytes = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return Status(Code::kInvalidArgument,
                  std::string("cannot map shared memory: ") + std::strerror(errno));
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(std::move(fd), static_cast<uint8_t*>(p), bytes));
}

SharedMemory::~SharedMemory() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
}

}  // namespace ferry::embed::service
