// Addresses, listening, connecting and accepting (messages are in unix_message.cc).
#include "base/unix_socket.h"

#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <thread>

namespace ferry::os {
namespace {

constexpr int kSocketFlags = SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK;

struct SocketAddress {
  sockaddr_un addr;
  socklen_t len;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&addr); }
};

Result<SocketAddress> Resolve(const UnixAddress& a) {
  SocketAddress out;
  std::memset(&out.addr, 0, sizeof(out.addr));
  out.addr.sun_family = AF_UNIX;
  const size_t room = sizeof(out.addr.sun_path) - 1;  // a NUL ends a path or starts a name
  if (a.name.empty() || a.name.size() > room)
    return Status(Code::kInvalidArgument, "socket address '" + a.name + "' is empty or too long");
  if (a.abstract) {
    std::memcpy(out.addr.sun_path + 1, a.name.data(), a.name.size());
    out.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + a.name.size());
  } else {
    std::memcpy(out.addr.sun_path, a.name.data(), a.name.size());
    out.len = sizeof(out.addr);
  }
  return out;
}

Result<UniqueFd> NewSocket() {
  UniqueFd fd(Env::Current()->Socket(AF_UNIX, kSocketFlags, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  return fd;
}

Status ListenError(const std::string& path, PathState state) {
  if (state == PathState::kLive)
    return Status(Code::kAlreadyExists,
                  "socket path " + path + ": another service accepts connections there");
  if (state == PathState::kNotSocket)
    return Status(Code::kFailedPrecondition,
                  "socket path " + path + " exists and is not a socket; remove it or pick another");
  return Status::Ok();
}

}  // namespace

Result<PathState> ProbeSocketPath(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(SocketAddress addr, Resolve(UnixAddress::Path(path)));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoStatus(Code::kInternal, "lstat " + path, errno);
    // Nothing there; the folder must exist for a bind to succeed.
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "."
                            : slash == 0               ? "/"
                                                       : path.substr(0, slash);
    struct stat ds {};
    if (::stat(dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode))
      return Status(Code::kNotFound, "socket path " + path + ": folder " + dir + " does not exist");
    return PathState::kFree;
  }
  if (!S_ISSOCK(st.st_mode)) return PathState::kNotSocket;
  // A socket: live when something accepts (or queues) a connection there. A listener of another
  // socket type (EPROTOTYPE) is live too.
  FERRY_ASSIGN_OR_RETURN(UniqueFd probe, NewSocket());
  if (Env::Current()->Connect(probe.get(), addr.get(), addr.len) == 0) return PathState::kLive;
  if (errno == ECONNREFUSED || errno == ENOENT) return PathState::kStale;
  return PathState::kLive;  // EAGAIN (a full backlog), EPROTOTYPE, EINPROGRESS, ...
}

Status CheckListenPath(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(PathState state, ProbeSocketPath(path));
  return ListenError(path, state);
}

Result<UniqueFd> ListenUnix(const UnixAddress& address) {
  FERRY_ASSIGN_OR_RETURN(SocketAddress addr, Resolve(address));
  PathState state = PathState::kFree;
  if (!address.abstract) {
    FERRY_ASSIGN_OR_RETURN(state, ProbeSocketPath(address.name));
    FERRY_RETURN_IF_ERROR(ListenError(address.name, state));
  }
  FERRY_ASSIGN_OR_RETURN(UniqueFd fd, NewSocket());
  if (state == PathState::kStale) ::unlink(address.name.c_str());
  Env* env = Env::Current();
  if (env->Bind(fd.get(), addr.get(), addr.len) != 0)
    return ErrnoStatus("bind " + address.name, errno);
  // Owner only, before anyone can connect (nothing is accepted before listen): the accepting
  // side checks the peer's user too (PeerUid).
  if (!address.abstract && ::chmod(address.name.c_str(), 0600) != 0) return ErrnoStatus("chmod " + address.name, errno);
  if (env->Listen(fd.get(), 128) != 0) return ErrnoStatus("listen " + address.name, errno);
  return fd;
}

Result<UniqueFd> ConnectUnix(const UnixAddress& address, Deadline retry_until) {
  FERRY_ASSIGN_OR_RETURN(SocketAddress addr, Resolve(address));
  for (;;) {
    FERRY_ASSIGN_OR_RETURN(UniqueFd fd, NewSocket());
    if (Env::Current()->Connect(fd.get(), addr.get(), addr.len) == 0) return fd;
    const int err = errno;
    // Nothing listens there (yet), or its backlog is full: worth another try.
    const bool absent = err == ECONNREFUSED || err == ENOENT || err == EAGAIN;
    if (!absent) return ErrnoStatus("connect " + address.name, err);
    if (retry_until.expired())
      return ErrnoStatus(Code::kUnavailable, "connect " + address.name, err);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<UniqueFd> AcceptUnix(int listen_fd) {
  for (;;) {
    UniqueFd fd(Env::Current()->Accept(listen_fd, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.valid()) return fd;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == ECONNABORTED)
      return Status(Code::kInProgress, "no connection waiting");
    return ErrnoStatus("accept", errno);
  }
}

Result<uid_t> PeerUid(int fd) {
  ucred cred = {};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return ErrnoStatus("SO_PEERCRED", errno);
  return cred.uid;
}

bool PeerUserAllowed(int fd, std::span<const uint32_t> allowed, int64_t* peer) {
  auto uid = PeerUid(fd);
  if (peer != nullptr) *peer = uid.ok() ? static_cast<int64_t>(*uid) : -1;
  if (!uid.ok()) return false;
  return *uid == ::getuid() || std::find(allowed.begin(), allowed.end(), *uid) != allowed.end();
}

Result<UniqueFd> MakeWakeFd() {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd.valid()) return ErrnoStatus("eventfd", errno);
  return fd;
}

void SignalWakeFd(int fd) {
  uint64_t one = 1;
  ssize_t n = ::write(fd, &one, sizeof(one));
  (void)n;
}

}  // namespace ferry::os
