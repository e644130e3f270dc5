#include "base/shared_host.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <string>

#include "base/memory_file.h"
#include "base/mutex.h"
#include "ferry/shared_memory.h"

namespace ferry {
namespace internal {
namespace {

struct Entry {
  uint64_t size;
  int fd;
};

class Directory {
 public:
  static Directory& Get() {
    static Directory* d = new Directory();  // never destroyed: buffers may outlive statics
    return *d;
  }
  Mutex mu;
  std::map<uintptr_t, Entry> buffers GUARDED_BY(mu);  // key: base address
};

}  // namespace

void AddSharedHost(const void* base, uint64_t size, int fd) {
  Directory& d = Directory::Get();
  MutexLock lock(&d.mu);
  d.buffers[reinterpret_cast<uintptr_t>(base)] = Entry{size, fd};
}

void RemoveSharedHost(const void* base) {
  Directory& d = Directory::Get();
  MutexLock lock(&d.mu);
  d.buffers.erase(reinterpret_cast<uintptr_t>(base));
}

std::optional<SharedSpan> FindSharedHost(const void* ptr, uint64_t bytes) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  if (bytes > UINTPTR_MAX - p) return std::nullopt;
  Directory& d = Directory::Get();
  MutexLock lock(&d.mu);
  auto it = d.buffers.upper_bound(p);
  if (it == d.buffers.begin()) return std::nullopt;
  --it;
  const uintptr_t base = it->first;
  const uint64_t offset = p - base;
  if (offset > it->second.size || bytes > it->second.size - offset) return std::nullopt;
  return SharedSpan{it->second.fd, offset, it->second.size};
}

}  // namespace internal

HostBuffer::~HostBuffer() { Reset(); }

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_), mapped_(other.mapped_), fd_(other.fd_) {
  other.data_ = nullptr;
  other.size_ = other.mapped_ = 0;
  other.fd_ = -1;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = other.data_;
    size_ = other.size_;
    mapped_ = other.mapped_;
    fd_ = other.fd_;
    other.data_ = nullptr;
    other.size_ = other.mapped_ = 0;
    other.fd_ = -1;
  }
  return *this;
}

void HostBuffer::Reset() {
  if (data_ != nullptr) {
    internal::RemoveSharedHost(data_);
    (void)os::Env::Current()->Munmap(data_, mapped_);
  }
  if (fd_ >= 0) (void)os::Env::Current()->Close(fd_);
  data_ = nullptr;
  size_ = mapped_ = 0;
  fd_ = -1;
}

Result<HostBuffer> AllocateSharedHost(uint64_t bytes) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "cannot allocate an empty shared buffer");
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (bytes > (uint64_t{1} << 48)) return Status(Code::kResourceExhausted, "shared buffer too large");
  const uint64_t mapped = (bytes + page - 1) / page * page;
  // Peers map the file: its size may never change under them (no SIGBUS).
  FERRY_ASSIGN_OR_RETURN(os::UniqueFd fd, os::CreateMemoryFile("ferry-shared-host", mapped, /*final=*/true));
  // Reserve and fault in every page now, so the first transfer does not pay for it.
  if (fallocate(fd.get(), 0, 0, static_cast<off_t>(mapped)) != 0)
    return os::ErrnoStatus(Code::kResourceExhausted, "fallocate for " + std::to_string(bytes) + " shared bytes", errno);
  Result<os::SharedMapping> m = os::SharedMapping::Map(fd.get(), 0, mapped);
  if (!m.ok()) return Status(Code::kResourceExhausted, std::string(m.status().message()));
  void* p = m->start();
  (void)madvise(p, mapped, MADV_HUGEPAGE);  // honoured where shmem hugepages are enabled
  (void)madvise(p, mapped, MADV_POPULATE_WRITE);
  m->Release();
  HostBuffer buffer;
  buffer.data_ = static_cast<std::byte*>(p);
  buffer.size_ = bytes;
  buffer.mapped_ = mapped;
  buffer.fd_ = fd.release();
  internal::AddSharedHost(p, bytes, buffer.fd_);
  return buffer;
}

}  // namespace ferry
