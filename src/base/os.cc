#include "base/os.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

namespace ferry::os {
namespace {

class RealEnv final : public Env {
 public:
  constexpr RealEnv() = default;

  int Socket(int domain, int type, int protocol) override {
    return ::socket(domain, type, protocol);
  }
  int SocketPair(int domain, int type, int protocol, int fds[2]) override {
    return ::socketpair(domain, type, protocol, fds);
  }
  int Bind(int fd, const sockaddr* addr, socklen_t len) override { return ::bind(fd, addr, len); }
  int Listen(int fd, int backlog) override { return ::listen(fd, backlog); }
  int Accept(int fd, int flags) override { return ::accept4(fd, nullptr, nullptr, flags); }
  int Connect(int fd, const sockaddr* addr, socklen_t len) override {
    return ::connect(fd, addr, len);
  }
  ssize_t SendMsg(int fd, const msghdr* msg, int flags) override {
    return ::sendmsg(fd, msg, flags);
  }
  ssize_t RecvMsg(int fd, msghdr* msg, int flags) override { return ::recvmsg(fd, msg, flags); }
  ssize_t Send(int fd, const void* data, size_t bytes, int flags) override {
    return ::send(fd, data, bytes, flags);
  }
  ssize_t Recv(int fd, void* data, size_t bytes, int flags) override {
    return ::recv(fd, data, bytes, flags);
  }
  int Poll(pollfd* fds, nfds_t count, int timeout_ms) override {
    return ::poll(fds, count, timeout_ms);
  }
  int Close(int fd) override { return ::close(fd); }
  int MemfdCreate(const char* name, unsigned flags) override { return ::memfd_create(name, flags); }
  int Ftruncate(int fd, off_t bytes) override { return ::ftruncate(fd, bytes); }
  void* Mmap(void* addr, size_t bytes, int prot, int flags, int fd, off_t offset) override {
    return ::mmap(addr, bytes, prot, flags, fd, offset);
  }
  int Munmap(void* addr, size_t bytes) override { return ::munmap(addr, bytes); }
  int ShmOpen(const char* name, int oflag, mode_t mode) override {
    return ::shm_open(name, oflag, mode);
  }
  int ShmUnlink(const char* name) override { return ::shm_unlink(name); }
  int PidfdOpen(pid_t pid, unsigned flags) override {
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, flags));
  }
  int PidfdGetfd(int pidfd, int target_fd, unsigned flags) override {
    return static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, target_fd, flags));
  }
  std::chrono::steady_clock::time_point SteadyNow() override {
    return std::chrono::steady_clock::now();
  }
};

constinit RealEnv real_env;
constinit std::atomic<Env*> current_env{&real_env};

}  // namespace

Env* Env::Default() { return &real_env; }
Env* Env::Current() { return current_env.load(std::memory_order_acquire); }

ScopedEnv::ScopedEnv(Env* env) : previous_(current_env.exchange(env, std::memory_order_acq_rel)) {}
ScopedEnv::~ScopedEnv() { current_env.store(previous_, std::memory_order_release); }

Code ErrnoCode(int err) {
  switch (err) {
    case ENOENT:
      return Code::kNotFound;
    case EACCES:
    case EPERM:
      return Code::kPermissionDenied;
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case ENOSPC:
    case ENOBUFS:
    case EAGAIN:
      return Code::kResourceExhausted;
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EADDRINUSE:
    case ESRCH:
    case EINTR:
      return Code::kUnavailable;
    case EINVAL:
    case EBADF:
    case ENOTSOCK:
    case EMSGSIZE:
    case ENAMETOOLONG:
    case E2BIG:
      return Code::kInvalidArgument;
    case EEXIST:
      return Code::kAlreadyExists;
    case ETIMEDOUT:
      return Code::kDeadlineExceeded;
    case ENOSYS:
    case EOPNOTSUPP:
      return Code::kUnsupported;
    default:
      return Code::kInternal;
  }
}

Status ErrnoStatus(Code code, std::string_view what, int err) {
  std::string message(what);
  message += ": ";
  message += std::strerror(err);
  return Status(code, std::move(message));
}

Status ErrnoStatus(std::string_view what, int err) {
  return ErrnoStatus(ErrnoCode(err), what, err);
}

}  // namespace ferry::os
