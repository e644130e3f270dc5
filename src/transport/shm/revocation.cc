#include "transport/shm/revocation.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "base/memory_file.h"

namespace ferry::internal::shm {
namespace {
constexpr size_t kBytes = kRevocationSlots * sizeof(uint64_t);
}  // namespace

Result<std::unique_ptr<RevocationTable>> RevocationTable::Create() {
  std::unique_ptr<RevocationTable> t(new RevocationTable());
  Result<os::UniqueFd> fd = os::CreateMemoryFile("ferry-shm-revocations", kBytes, /*final=*/true);
  if (!fd.ok()) return Status(Code::kUnavailable, std::string(fd.status().message())).WithContext("revocation table");
  t->fd_ = fd->release();
  Result<os::SharedMapping> m = os::SharedMapping::Map(t->fd_, 0, kBytes);
  if (!m.ok()) return Status(Code::kUnavailable, std::string(m.status().message())).WithContext("revocation table");
  t->words_ = reinterpret_cast<uint64_t*>(m->data());
  m->Release();  // unmapped by the destructor
  MutexLock lock(&t->mu_);  // not shared yet; the lock keeps the analysis whole
  t->free_.reserve(kRevocationSlots);
  for (uint32_t i = kRevocationSlots; i > 0; --i) t->free_.push_back(i - 1);
  return t;
}

RevocationTable::~RevocationTable() {
  if (words_ != nullptr) (void)os::Env::Current()->Munmap(words_, kBytes);
  if (fd_ >= 0) (void)os::Env::Current()->Close(fd_);
}

std::pair<uint32_t, uint64_t> RevocationTable::Publish() {
  MutexLock lock(&mu_);
  const uint64_t generation = next_generation_++;
  if (free_.empty()) return {kNoSlot, generation};
  const uint32_t slot = free_.back();
  free_.pop_back();
  __atomic_store_n(words_ + slot, generation, __ATOMIC_RELEASE);
  return {slot, generation};
}

void RevocationTable::Revoke(uint32_t slot) {
  if (slot >= kRevocationSlots) return;
  MutexLock lock(&mu_);
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
  void* p = os::Env::Current()->Mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return os::ErrnoStatus(Code::kResourceExhausted, "revocation table", errno);
  std::shared_ptr<RevocationView> v(new RevocationView());
  v->words_ = static_cast<const uint64_t*>(p);
  return v;
}

RevocationView::~RevocationView() {
  if (words_ != nullptr) (void)os::Env::Current()->Munmap(const_cast<uint64_t*>(words_), kBytes);
}

}  // namespace ferry::internal::shm
