// Fault injection through the OS seam (base/os.h) for tests: an Env that fails chosen system
// calls with a chosen errno, cuts received messages short, or moves the steady clock, and a
// count of this process's open descriptors to show that nothing leaked.
//
// Thread safety: FaultEnv's settings and calls may be used from any thread (atomics).
#pragma once

#include <dirent.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstddef>

#include "base/os.h"

namespace ferry::fault_testing {

// The number of descriptors open in this process now.
inline int OpenFdCount() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n - 1;  // the listing's own descriptor
}

class FaultEnv : public os::EnvWrapper {
 public:
  enum Call {
    kSocket,
    kConnect,
    kAccept,
    kSendMsg,
    kRecvMsg,
    kMemfdCreate,
    kFtruncate,
    kMmap,
    kPidfdOpen,
    kCount
  };

  FaultEnv() : EnvWrapper(os::Env::Default()) {}

  // Every later `call` fails with `err` once `successes` more of them have succeeded.
  void Fail(Call call, int err, int successes = 0) {
    left_[call].store(successes);
    err_[call].store(err);
  }
  void Heal(Call call) { err_[call].store(0); }
  // How many times `call` was made (failed or not).
  int calls(Call call) const { return calls_[call].load(); }
  // Every later recvmsg reads at most `bytes` of the message (the kernel cuts the rest off).
  void CutReceives(size_t bytes) { cut_.store(bytes); }
  // Moves the steady clock by `by` from now on.
  void JumpClock(std::chrono::steady_clock::duration by) { jump_.fetch_add(by.count()); }

  int Socket(int domain, int type, int protocol) override {
    return Failed(kSocket) ? -1 : EnvWrapper::Socket(domain, type, protocol);
  }
  int Connect(int fd, const sockaddr* addr, socklen_t len) override {
    return Failed(kConnect) ? -1 : EnvWrapper::Connect(fd, addr, len);
  }
  int Accept(int fd, int flags) override {
    return Failed(kAccept) ? -1 : EnvWrapper::Accept(fd, flags);
  }
  ssize_t SendMsg(int fd, const msghdr* msg, int flags) override {
    return Failed(kSendMsg) ? -1 : EnvWrapper::SendMsg(fd, msg, flags);
  }
  ssize_t RecvMsg(int fd, msghdr* msg, int flags) override {
    if (Failed(kRecvMsg)) return -1;
    const size_t cut = cut_.load();
    if (cut == kNoCut || msg->msg_iovlen != 1 || msg->msg_iov[0].iov_len <= cut)
      return EnvWrapper::RecvMsg(fd, msg, flags);
    const size_t asked = msg->msg_iov[0].iov_len;
    msg->msg_iov[0].iov_len = cut;
    const ssize_t n = EnvWrapper::RecvMsg(fd, msg, flags);
    msg->msg_iov[0].iov_len = asked;
    return n;
  }
  int MemfdCreate(const char* name, unsigned flags) override {
    return Failed(kMemfdCreate) ? -1 : EnvWrapper::MemfdCreate(name, flags);
  }
  int Ftruncate(int fd, off_t bytes) override {
    return Failed(kFtruncate) ? -1 : EnvWrapper::Ftruncate(fd, bytes);
  }
  void* Mmap(void* addr, size_t bytes, int prot, int flags, int fd, off_t offset) override {
    return Failed(kMmap) ? MAP_FAILED : EnvWrapper::Mmap(addr, bytes, prot, flags, fd, offset);
  }
  int PidfdOpen(pid_t pid, unsigned flags) override {
    return Failed(kPidfdOpen) ? -1 : EnvWrapper::PidfdOpen(pid, flags);
  }
  std::chrono::steady_clock::time_point SteadyNow() override {
    return EnvWrapper::SteadyNow() + std::chrono::steady_clock::duration(jump_.load());
  }

 private:
  static constexpr size_t kNoCut = ~size_t{0};
  // True (errno set) when this call is to fail.
  bool Failed(Call call) {
    calls_[call].fetch_add(1);
    const int err = err_[call].load();
    if (err == 0 || left_[call].fetch_sub(1) > 0) return false;
    errno = err;
    return true;
  }
  std::atomic<int> err_[kCount] = {};
  std::atomic<int> left_[kCount] = {};
  std::atomic<int> calls_[kCount] = {};
  std::atomic<size_t> cut_{kNoCut};
  std::atomic<std::chrono::steady_clock::rep> jump_{0};
};

}  // namespace ferry::fault_testing
