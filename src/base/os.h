// The OS seam (the role of LevelDB's Env): every system call through which ferry reaches
// sockets, memory files, mappings, other processes' descriptors and the steady clock goes
// through one injectable Env, so that a test can make one of them fail (or the clock jump) on
// purpose and check that the caller ends in a clean error with nothing leaked.
//
// Each method has the contract of the system call it is named after: it returns what the call
// returns (-1, or MAP_FAILED for Mmap, with errno set on failure). Descriptors are created with
// the flags the caller passes (callers pass CLOEXEC).
//
// Reaching the seam: Env::Current() is the process-wide Env (the real calls unless a test
// swapped it). ScopedEnv installs another for its lifetime and restores the previous one.
// EnvWrapper forwards every call to a target, so a test overrides only the call it breaks.
//
// Thread safety: Env::Current() and ScopedEnv are safe from any thread (an atomic pointer).
// An Env's methods may be called from any thread at once. REQUIRES: an Env installed with
// ScopedEnv outlives every call made through it: stop the threads that use it (transports,
// servers) before the ScopedEnv goes.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>
#include <chrono>
#include <string_view>

#include "ferry/status.h"

namespace ferry::os {

class Env {
 public:
  virtual ~Env() = default;

  // The real system calls; never destroyed.
  static Env* Default();
  // The Env in force now: Default() unless a ScopedEnv installed another.
  static Env* Current();

  // Sockets (Unix-domain and TCP).
  virtual int Socket(int domain, int type, int protocol) = 0;
  virtual int SocketPair(int domain, int type, int protocol, int fds[2]) = 0;
  virtual int Bind(int fd, const sockaddr* addr, socklen_t len) = 0;
  virtual int Listen(int fd, int backlog) = 0;
  virtual int Accept(int fd, int flags) = 0;  // accept4(fd, nullptr, nullptr, flags)
  virtual int Connect(int fd, const sockaddr* addr, socklen_t len) = 0;
  virtual ssize_t SendMsg(int fd, const msghdr* msg, int flags) = 0;
  virtual ssize_t RecvMsg(int fd, msghdr* msg, int flags) = 0;
  virtual ssize_t Send(int fd, const void* data, size_t bytes, int flags) = 0;
  virtual ssize_t Recv(int fd, void* data, size_t bytes, int flags) = 0;
  virtual int Poll(pollfd* fds, nfds_t count, int timeout_ms) = 0;
  virtual int Close(int fd) = 0;

  // Memory files and mappings.
  virtual int MemfdCreate(const char* name, unsigned flags) = 0;
  virtual int Ftruncate(int fd, off_t bytes) = 0;
  virtual void* Mmap(void* addr, size_t bytes, int prot, int flags, int fd, off_t offset) = 0;
  virtual int Munmap(void* addr, size_t bytes) = 0;
  // POSIX shared memory objects (shm_open / shm_unlink).
  virtual int ShmOpen(const char* name, int oflag, mode_t mode) = 0;
  virtual int ShmUnlink(const char* name) = 0;

  // Other processes' descriptors (pidfd_open / pidfd_getfd).
  virtual int PidfdOpen(pid_t pid, unsigned flags) = 0;
  virtual int PidfdGetfd(int pidfd, int target_fd, unsigned flags) = 0;

  // The steady clock (Deadline's).
  virtual std::chrono::steady_clock::time_point SteadyNow() = 0;
};

// Forwards every call to `target`; a test derives from it and overrides what it breaks.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  int Socket(int domain, int type, int protocol) override {
    return target_->Socket(domain, type, protocol);
  }
  int SocketPair(int domain, int type, int protocol, int fds[2]) override {
    return target_->SocketPair(domain, type, protocol, fds);
  }
  int Bind(int fd, const sockaddr* addr, socklen_t len) override {
    return target_->Bind(fd, addr, len);
  }
  int Listen(int fd, int backlog) override { return target_->Listen(fd, backlog); }
  int Accept(int fd, int flags) override { return target_->Accept(fd, flags); }
  int Connect(int fd, const sockaddr* addr, socklen_t len) override {
    return target_->Connect(fd, addr, len);
  }
  ssize_t SendMsg(int fd, const msghdr* msg, int flags) override {
    return target_->SendMsg(fd, msg, flags);
  }
  ssize_t RecvMsg(int fd, msghdr* msg, int flags) override {
    return target_->RecvMsg(fd, msg, flags);
  }
  ssize_t Send(int fd, const void* data, size_t bytes, int flags) override {
    return target_->Send(fd, data, bytes, flags);
  }
  ssize_t Recv(int fd, void* data, size_t bytes, int flags) override {
    return target_->Recv(fd, data, bytes, flags);
  }
  int Poll(pollfd* fds, nfds_t count, int timeout_ms) override {
    return target_->Poll(fds, count, timeout_ms);
  }
  int Close(int fd) override { return target_->Close(fd); }
  int MemfdCreate(const char* name, unsigned flags) override {
    return target_->MemfdCreate(name, flags);
  }
  int Ftruncate(int fd, off_t bytes) override { return target_->Ftruncate(fd, bytes); }
  void* Mmap(void* addr, size_t bytes, int prot, int flags, int fd, off_t offset) override {
    return target_->Mmap(addr, bytes, prot, flags, fd, offset);
  }
  int Munmap(void* addr, size_t bytes) override { return target_->Munmap(addr, bytes); }
  int ShmOpen(const char* name, int oflag, mode_t mode) override {
    return target_->ShmOpen(name, oflag, mode);
  }
  int ShmUnlink(const char* name) override { return target_->ShmUnlink(name); }
  int PidfdOpen(pid_t pid, unsigned flags) override { return target_->PidfdOpen(pid, flags); }
  int PidfdGetfd(int pidfd, int target_fd, unsigned flags) override {
    return target_->PidfdGetfd(pidfd, target_fd, flags);
  }
  std::chrono::steady_clock::time_point SteadyNow() override { return target_->SteadyNow(); }

 private:
  Env* const target_;
};

// Installs `env` as Env::Current() until destroyed, then restores the one it replaced.
// Scopes nest (destroy them in reverse order).
class ScopedEnv {
 public:
  explicit ScopedEnv(Env* env);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  Env* const previous_;
};

// The code that errno `err` suggests to the caller: kNotFound (ENOENT), kPermissionDenied,
// kResourceExhausted (out of memory, descriptors or buffer room, EAGAIN), kUnavailable (the
// peer refused, reset or is gone), kInvalidArgument (EINVAL, EBADF, EMSGSIZE, ...),
// kAlreadyExists, kDeadlineExceeded (ETIMEDOUT), kUnsupported (ENOSYS), else kInternal.
Code ErrnoCode(int err);
// "what: <strerror(err)>" with `code`: ferry's one place that turns errno into a Status.
Status ErrnoStatus(Code code, std::string_view what, int err);
// The same with ErrnoCode(err).
Status ErrnoStatus(std::string_view what, int err);

}  // namespace ferry::os
