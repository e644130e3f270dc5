#include "transport/cuda_ipc/lease_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "base/os.h"

namespace ferry::internal::cuda_ipc {

struct LeaseTable::Layout {
  static constexpr uint64_t kMagic = 0x6665727279697063ull;  // "ferryipc"
  static constexpr uint32_t kVersion = 1;
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint32_t rows;
  int32_t owner_pid;
  std::atomic<uint64_t> slot_region[kSlots];  // 0 = free or withdrawn
  struct Row {
    std::atomic<int32_t> pid;  // 0 = free
    std::atomic<uint32_t> users[kSlots];
  } row[kRows];
};

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "lease tables need lock-free atomics shared between processes");

bool ProcessAlive(int32_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) == 0) return true;
  return errno == EPERM;
}

}  // namespace

Result<std::shared_ptr<LeaseTable>> LeaseTable::Create() {
  std::random_device rd;
  char name[96];
  snprintf(name, sizeof(name), "/ferry-ipc-%d-%08x%08x", static_cast<int>(getpid()), rd(), rd());
  os::Env* env = os::Env::Current();
  int fd = env->ShmOpen(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return os::ErrnoStatus(Code::kUnavailable, std::string("shm_open ") + name, errno);
  if (env->Ftruncate(fd, sizeof(Layout)) != 0) {
    Status s = os::ErrnoStatus(Code::kUnavailable, "ftruncate lease table", errno);
    env->Close(fd);
    env->ShmUnlink(name);
    return s;
  }
  void* p = env->Mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int mmap_errno = errno;
  env->Close(fd);
  if (p == MAP_FAILED) {
    env->ShmUnlink(name);
    return os::ErrnoStatus(Code::kUnavailable, "mmap lease table", mmap_errno);
  }
  auto* layout = static_cast<Layout*>(p);  // zero-filled by ftruncate
  layout->slots = kSlots;
  layout->rows = kRows;
  layout->owner_pid = static_cast<int32_t>(getpid());
  layout->version = Layout::kVersion;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  layout->magic = Layout::kMagic;
  std::shared_ptr<LeaseTable> table(new LeaseTable(name, layout, true));
  {
    MutexLock lock(&table->mu_);  // not shared yet; the lock keeps the analysis whole
    table->retired_.assign(kSlots, 0);
  }
  return table;
}

Result<std::shared_ptr<LeaseTable>> LeaseTable::Open(const std::string& name) {
  if (name.empty() || name[0] != '/' || name.find('/', 1) != std::string::npos)
    return Status(Code::kInvalidArgument, "bad lease table name '" + name + "'");
  os::Env* env = os::Env::Current();
  int fd = env->ShmOpen(name.c_str(), O_RDWR, 0);
  if (fd < 0) return os::ErrnoStatus(Code::kUnavailable, "opening lease table " + name + " (is the peer gone?)", errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != sizeof(Layout)) {
    env->Close(fd);
    return Status(Code::kInvalidArgument, "lease table " + name + " has the wrong size");
  }
  void* p = env->Mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int mmap_errno = errno;
  env->Close(fd);
  if (p == MAP_FAILED) return os::ErrnoStatus(Code::kUnavailable, "mmap lease table " + name, mmap_errno);
  auto* layout = static_cast<Layout*>(p);
  if (layout->magic != Layout::kMagic || layout->version != Layout::kVersion || layout->slots != kSlots ||
      layout->rows != kRows) {
    env->Munmap(p, sizeof(Layout));
    return Status(Code::kInvalidArgument, "lease table " + name + " is not of this ferry version");
  }
  return std::shared_ptr<LeaseTable>(new LeaseTable(name, layout, false));
}

LeaseTable::~LeaseTable() {
  os::Env* env = os::Env::Current();
  env->Munmap(layout_, sizeof(Layout));
  if (owner_) env->ShmUnlink(name_.c_str());
}

bool LeaseTable::OwnerAlive() const { return ProcessAlive(layout_->owner_pid); }

void LeaseTable::UnlinkIfOwnerDead() {
  if (owner_ || OwnerAlive()) return;
  MutexLock lock(&mu_);
  if (!unlinked_) os::Env::Current()->ShmUnlink(name_.c_str());
  unlinked_ = true;
}

Result<uint32_t> LeaseTable::Publish(uint64_t region) {
  if (region == 0) return Status(Code::kInvalidArgument, "region id 0 cannot be published");
  MutexLock lock(&mu_);
  for (uint32_t s = 0; s < kSlots; ++s) {
    if (retired_[s] || layout_->slot_region[s].load() != 0) continue;
    layout_->slot_region[s].store(region);
    return s;
  }
  return Status(Code::kResourceExhausted, "every cuda_ipc lease slot is in use");
}

Status LeaseTable::Revoke(uint32_t slot, Deadline deadline) {
  if (slot >= kSlots) return Status(Code::kInvalidArgument, "no lease slot " + std::to_string(slot));
  layout_->slot_region[slot].store(0);  // seq_cst: ordered before the reads of users below
  auto backoff = std::chrono::microseconds(10);
  for (;;) {
    bool busy = false;
    for (uint32_t r = 0; r < kRows && !busy; ++r) {
      if (layout_->row[r].users[slot].load() == 0) continue;
      busy = ProcessAlive(layout_->row[r].pid.load());
    }
    if (!busy) return Status::Ok();
    if (deadline.expired()) {
      MutexLock lock(&mu_);
      retired_[slot] = 1;
      return Status(Code::kDeadlineExceeded, "a peer process still copies into the region");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
  }
}

Result<uint32_t> LeaseTable::ClaimRow() {
  const int32_t me = static_cast<int32_t>(getpid());
  for (uint32_t r = 0; r < kRows; ++r) {
    auto& row = layout_->row[r];
    int32_t pid = row.pid.load();
    if (pid != 0 && ProcessAlive(pid)) continue;
    if (!row.pid.compare_exchange_strong(pid, me)) continue;
    // A dead process's leases no longer matter; start the row from zero.
    for (auto& u : row.users) u.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return r;
  }
  return Status(Code::kResourceExhausted, "every row of lease table " + name_ + " is taken");
}

void LeaseTable::ReleaseRow(uint32_t row) {
  if (row < kRows) layout_->row[row].pid.store(0);
}

bool LeaseTable::Acquire(uint32_t row, uint32_t slot, uint64_t region) {
  if (row >= kRows || slot >= kSlots || region == 0) return false;
  auto& users = layout_->row[row].users[slot];
  users.fetch_add(1);  // seq_cst: ordered before the read of the slot below
  if (layout_->slot_region[slot].load() == region) return true;
  users.fetch_sub(1);
  return false;
}

void LeaseTable::Release(uint32_t row, uint32_t slot) {
  if (row < kRows && slot < kSlots) layout_->row[row].users[slot].fetch_sub(1);
}

bool LeaseTable::Live(uint32_t slot, uint64_t region) const {
  return slot < kSlots && region != 0 && layout_->slot_region[slot].load() == region;
}

}  // namespace ferry::internal::cuda_ipc
