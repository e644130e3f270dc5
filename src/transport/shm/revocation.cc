#include "transport/shm/revocation.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ferry::internal::shm {
namespace {
constexpr size_t kBytes = kRevocationSlots * sizeof(uint64_t);
}  // namespace

Result<std::unique_ptr<RevocationTable>> RevocationTable::Create() {
  std::unique_ptr<RevocationTable> t(new RevocationTable());
  t->fd_ = memfd_create("ferry-shm-revocations", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (t->fd_ < 0) return Status(Code::kUnavailable, std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(t->fd_, kBytes) != 0 ||
      fcntl(t->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return Status(Code::kUnavailable, std::string("revocation table: ") + std::strerror(errno));
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd_, 0);
  if (p == MAP_FAILED) return Status(Code::kUnavailable, std::string("revocation table: ") + std::strerror(errno));
  t->words_ = static_cast<uint64_t*>(p);
  t->free_.reserve(kRevocationSlots);
  for (uint32_t i = kRevocationSlots; i > 0; --i) t->free_.push_back(i - 1);
  return t;
}

RevocationTable::~RevocationTable() {
  if (words_ != nullptr) munmap(words_, kBytes);
  if (fd_ >= 0) close(fd_);
}

std::pair<uint32_t, uint64_t> RevocationTable::Publish() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t generation = next_generation_++;
  if (free_.empty()) return {kNoSlot, generation};
  const uint32_t slot = free_.back();
  free_.pop_back();
  __atomic_store_n(words_ + slot, generation, __ATOMIC_RELEASE);
  return {slot, generation};
}

void RevocationTable::Revoke(uint32_t slot) {
  if (slot >= kRevocationSlots) return;
  std::lock_guard<std::mutex> lock(mu_);
  __atomic_store_n(words_ + slot, uint64_t{0}, __ATOMIC_RELEASE);
  free_.push_back(slot);
}

Result<std::shared_ptr<RevocationView>> RevocationView::Map(int fd) {
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return Status(Code::kInvalidArgument, "the peer's revocation table is not sealed against shrinking");
  struct stat st = {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < kBytes)
    return Status(Code::kInvalidArgument, "the peer's revocation table is too small");
  void* p = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status(Code::kResourceExhausted, std::string("revocation table: ") + std::strerror(errno));
  std::shared_ptr<RevocationView> v(new RevocationView());
  v->words_ = static_cast<const uint64_t*>(p);
  return v;
}

RevocationView::~RevocationView() {
  if (words_ != nullptr) munmap(const_cast<uint64_t*>(words_), kBytes);
}

}  // namespace ferry::internal::shm
