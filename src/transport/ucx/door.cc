#include "transport/ucx/door.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/auth.h"
#include "base/host_port.h"
#include "base/log.h"
#include "base/os.h"

namespace ferry::internal::ucx {
namespace {

constexpr auto kAcceptPause = std::chrono::milliseconds(100);

// The OS seam: every socket call of the door goes through it.
os::Env* Os() { return os::Env::Current(); }


int PollMs(Clock::duration d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  return static_cast<int>(std::clamp<int64_t>(ms + 1, 0, 1000));
}

// A peer's advertised "host:port" (IPv4, [IPv6] or a name, looked up within `timeout`).
Result<SocketAddress> ParseAddress(const std::string& address, std::chrono::milliseconds timeout) {
  Result<HostPort> hp = SplitHostPort(address);
  if (!hp.ok() || hp->port == 0) return Status(Code::kInvalidArgument, "bad peer address '" + address + "'");
  return ResolveHost(hp->host, hp->port, timeout);
}

// Waits for `events` on `fd` until `deadline`: false when it passed.
bool WaitFd(int fd, short events, Deadline deadline) {
  for (;;) {
    if (deadline.expired()) return false;
    pollfd p = {fd, events, 0};
    int n = Os()->Poll(&p, 1, PollMs(deadline.remaining()));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the next call reports the error
  }
}

}  // namespace

Result<std::unique_ptr<Door>> Door::Create(const DoorOptions& options, AdmitFn admit, GoneFn gone) {
  // A listen host that is malformed or does not resolve is the caller's to fix.
  Result<SocketAddress> resolved = ResolveHost(options.host, options.port);
  if (!resolved.ok())
    return Status(Code::kInvalidArgument, "ucx.listen_host '" + options.host + "': " + std::string(resolved.status().message()));
  SocketAddress addr = *resolved;
  int fd = Os()->Socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return os::ErrnoStatus(Code::kResourceExhausted, "socket", errno);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const std::string where = JoinHostPort(options.host, options.port);
  if (Os()->Bind(fd, addr.get(), addr.len) != 0 || Os()->Listen(fd, 128) != 0) {
    const int err = errno;
    Status s = os::ErrnoStatus(err == EADDRINUSE ? Code::kUnavailable : Code::kInvalidArgument, "listening on " + where, err);
    Os()->Close(fd);
    return s;
  }
  addr.len = sizeof(addr.storage);
  getsockname(fd, addr.get(), &addr.len);
  int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    Status s = os::ErrnoStatus(Code::kResourceExhausted, "eventfd", errno);
    Os()->Close(fd);
    return s;
  }
  std::unique_ptr<Door> door(new Door(options, std::move(admit), std::move(gone), fd, wake, addr.port()));
  try {
    door->thread_ = std::thread([d = door.get()] { d->Loop(); });
  } catch (const std::system_error& e) {
    door->stopped_ = true;  // nothing to join; the destructor closes the descriptors
    return Status(Code::kResourceExhausted, std::string("cannot start the ucx listener thread: ") + e.what());
  }
  return door;
}

Door::Door(DoorOptions options, AdmitFn admit, GoneFn gone, int listen_fd, int wake_fd, uint16_t port)
    : options_(std::move(options)), admit_(std::move(admit)), gone_(std::move(gone)), listen_fd_(listen_fd),
      wake_fd_(wake_fd), port_(port) {}

Door::~Door() {
  Stop();
  Os()->Close(wake_fd_);
}

void Door::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stop_.store(true, std::memory_order_release);
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  Os()->Close(listen_fd_);  // new connections are refused from now on
  listen_fd_ = -1;
}

void Door::Forget(uint64_t conn_id) {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    forget_.push_back(conn_id);
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void Door::Refuse(int fd, const char* why) {
  Os()->Close(fd);
  uint64_t n = refused_.fetch_add(1, std::memory_order_relaxed) + 1;
  // The first few, then every 1000th: a peer that floods the door must not flood the log.
  if (n <= 8 || n % 1000 == 0) FERRY_LOG_WARN("ucx: refused connection #{} on port {}: {}", n, port_, why);
}

void Door::Loop() {
  std::vector<pollfd> fds;
  while (!stop_.load(std::memory_order_acquire)) {
    const auto now = Clock::now();
    // Handshakes past their deadline.
    for (size_t i = 0; i < pending_.size();) {
      if (pending_[i].deadline <= now) {
        Refuse(pending_[i].fd, "no ferry handshake before the timeout");
        pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    const bool listening = now >= paused_until_;
    fds.push_back({listening ? listen_fd_ : -1, POLLIN, 0});
    for (const auto& p : pending_) fds.push_back({p.fd, POLLIN, 0});
    for (const auto& e : established_) fds.push_back({e.fd, POLLIN | POLLRDHUP, 0});
    Clock::time_point wake_at = now + std::chrono::seconds(1);
    for (const auto& p : pending_) wake_at = std::min(wake_at, p.deadline);
    if (!listening) wake_at = std::min(wake_at, paused_until_);
    pending_count_.store(pending_.size(), std::memory_order_relaxed);
    established_count_.store(established_.size(), std::memory_order_relaxed);
    int n = Os()->Poll(fds.data(), fds.size(), PollMs(wake_at - now));
    if (n < 0 && errno != EINTR) {
      FERRY_LOG_WARN("ucx: {}", os::ErrnoStatus(Code::kInternal, "the listener's poll failed", errno).message());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (n <= 0) continue;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof(v));
      std::vector<uint64_t> forget;
      {
        MutexLock lock(&mu_);
        forget.swap(forget_);
      }
      for (uint64_t id : forget) {
        auto it = std::find_if(established_.begin(), established_.end(), [id](const Established& e) { return e.conn_id == id; });
        if (it == established_.end()) continue;
        Os()->Close(it->fd);
        established_.erase(it);
      }
    }
    // Established connections first (their slots in fds follow the pending ones): any byte or
    // a hang-up ends them.
    const size_t first_established = 2 + pending_.size();
    std::vector<size_t> ended;
    for (size_t i = 0; i < established_.size() && first_established + i < fds.size(); ++i) {
      const pollfd& f = fds[first_established + i];
      if (f.fd != established_[i].fd || f.revents == 0) continue;
      ended.push_back(i);
    }
    for (size_t k = ended.size(); k-- > 0;) {
      Established e = established_[ended[k]];
      established_.erase(established_.begin() + static_cast<ptrdiff_t>(ended[k]));
      Os()->Close(e.fd);
      gone_(e.conn_id);
    }
    // Pending handshakes.
    std::vector<int> ready;
    for (size_t i = 0; i < pending_.size(); ++i)
      if (fds[2 + i].revents != 0) ready.push_back(fds[2 + i].fd);
    for (int fd : ready) {
      auto it = std::find_if(pending_.begin(), pending_.end(), [fd](const Pending& p) { return p.fd == fd; });
      if (it == pending_.end()) continue;
      bool done = false;
      Read(*it, &done);
      if (done) pending_.erase(it);
    }
    if (fds[1].fd >= 0 && (fds[1].revents & POLLIN)) Accept();
  }
  for (const auto& p : pending_) Os()->Close(p.fd);
  for (const auto& e : established_) Os()->Close(e.fd);
  pending_.clear();
  established_.clear();
  pending_count_.store(0);
  established_count_.store(0);
}

void Door::Accept() {
  for (int round = 0; round < 64; ++round) {
    int fd = Os()->Accept(listen_fd_, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: make room by dropping the oldest handshake, or stop
      // accepting for a moment (the kernel keeps the connections queued meanwhile).
      const int err = errno;
      if (++accept_errors_ <= 8 || accept_errors_ % 1000 == 0)
        FERRY_LOG_WARN("ucx: accepting on port {} failed (#{}): {}", port_, accept_errors_,
                       os::ErrnoStatus("accept4", err).ToString());
      if (!pending_.empty()) {
        limited_.fetch_add(1, std::memory_order_relaxed);
        Refuse(pending_.front().fd, "dropped to make room");
        pending_.erase(pending_.begin());
        continue;
      }
      paused_until_ = Clock::now() + kAcceptPause;
      return;
    }
    if (pending_.size() >= options_.max_pending) {
      limited_.fetch_add(1, std::memory_order_relaxed);
      Refuse(pending_.front().fd, "too many handshakes in progress; the oldest is dropped");
      pending_.erase(pending_.begin());
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    pending_.push_back(Pending{fd, Clock::now() + options_.handshake_timeout, {}});
  }
}

void Door::Read(Pending& p, bool* done) {
  *done = false;
  // Exactly the frame: the prefix first, then as many bytes as it announces, never more.
  size_t want = kDoorPrefixBytes;
  if (p.buf.size() >= kDoorPrefixBytes) {
    auto length = DoorFrameLength(p.buf);
    want = length.ok() ? *length : 0;
  }
  char chunk[4096];
  size_t room = want > p.buf.size() ? std::min(sizeof(chunk), want - p.buf.size()) : 0;
  if (room == 0) room = 1;
  ssize_t n = Os()->Recv(p.fd, chunk, room, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    *done = true;
    // An initiator with another secret finds the challenge's proof wrong and hangs up.
    if (p.challenged)
      return RefuseAuth(p.fd, "'" + p.hello.from_key + "' closed the connection without proving the deployment's secret (a different secret?)");
    return Refuse(p.fd, n == 0 ? "closed before a ferry handshake" : "socket error before a ferry handshake");
  }
  p.buf.append(chunk, static_cast<size_t>(n));
  auto length = DoorFrameLength(p.buf);
  if (!length.ok()) {
    *done = true;
    // A ferry engine of another version gets a refusal it can decode (the prefix says ours).
    if (length.status().code() == Code::kFailedPrecondition) {
      Welcome w;
      w.code = Code::kFailedPrecondition;
      w.message = std::string(length.status().message());
      std::string frame = EncodeWelcome(w);
      (void)!Os()->Send(p.fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    return Refuse(p.fd, std::string(length.status().message()).c_str());
  }
  if (*length == 0 || p.buf.size() < *length) return;
  *done = Finish(p);
}

void Door::RefuseAuth(int fd, const std::string& why) {
  auth_failures_.fetch_add(1, std::memory_order_relaxed);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  char host[INET6_ADDRSTRLEN] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
    if (ss.ss_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, host, sizeof(host));
  }
  if (auth_logged_.size() < 1024 && auth_logged_.insert(host).second)
    FERRY_LOG_WARN("ucx: a peer at {} failed authentication: {} (logged once per address)", host, why);
  Welcome w;
  w.code = Code::kPermissionDenied;
  w.message = why;
  w.key = options_.key;
  std::string frame = EncodeWelcome(w);
  (void)!Os()->Send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  Refuse(fd, why.c_str());
}

bool Door::Finish(Pending& p) {
  if (p.challenged) {
    auto proof = DecodeProof(p.buf);
    if (!proof.ok()) {
      RefuseAuth(p.fd, "not a proof of the deployment's secret: " + std::string(proof.status().message()));
      return true;
    }
    if (!auth::MacEqual(proof->mac, InitiatorProof(options_.secret, p.hello, p.target_nonce))) {
      RefuseAuth(p.fd, "engine '" + options_.key + "' refused '" + p.hello.from_key +
                           "': its proof of the deployment's secret is wrong (a different secret?)");
      return true;
    }
    Answer(p, p.hello);
    return true;
  }
  auto hello = DecodeHello(p.buf);
  if (!hello.ok()) {
    Refuse(p.fd, std::string(hello.status().message()).c_str());
    return true;
  }
  if (!options_.secret.empty() && hello->to_key == options_.key) {
    if (hello->nonce.empty()) {
      RefuseAuth(p.fd, "engine '" + options_.key +
                           "' admits authenticated peers only: give this engine the deployment's secret "
                           "(EngineOptions::secret, FERRY_SECRET)");
      return true;
    }
    auto nonce = auth::Nonce();
    if (!nonce.ok()) {
      Refuse(p.fd, std::string(nonce.status().message()).c_str());
      return true;
    }
    Challenge c{*nonce, TargetProof(options_.secret, *hello, *nonce)};
    std::string frame = EncodeChallenge(c);
    if (Os()->Send(p.fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(frame.size())) {
      Refuse(p.fd, "the challenge could not be sent");
      return true;
    }
    p.challenged = true;
    p.hello = std::move(hello).value();
    p.target_nonce = std::move(nonce).value();
    p.buf.clear();
    return false;  // the proof comes next, within the same handshake deadline
  }
  Answer(p, *hello);
  return true;
}

void Door::Answer(Pending& p, const Hello& hello_in) {
  const Hello* hello = &hello_in;
  Welcome w;
  if (hello->to_key != options_.key) {
    w.code = Code::kFailedPrecondition;
    w.message = "this is engine '" + options_.key + "', not '" + hello->to_key + "'";
  } else if (established_.size() >= options_.max_connections) {
    limited_.fetch_add(1, std::memory_order_relaxed);
    w.code = Code::kResourceExhausted;
    w.message = "engine '" + options_.key + "' serves at most " + std::to_string(options_.max_connections) +
                " connections (ucx.max_connections)";
  } else {
    w = admit_(*hello, Deadline::At(p.deadline));
  }
  w.key = options_.key;
  std::string frame = EncodeWelcome(w);
  // A welcome is far smaller than a socket's buffer: it goes out whole or the peer is gone.
  ssize_t sent = Os()->Send(p.fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent != static_cast<ssize_t>(frame.size())) {
    if (w.code == Code::kOk) gone_(w.conn_id);
    return Refuse(p.fd, "the welcome could not be sent");
  }
  if (w.code != Code::kOk) return Refuse(p.fd, w.message.c_str());
  established_.push_back(Established{p.fd, w.conn_id});
}

Result<Dialed> Dial(const std::string& address, Hello hello, Deadline deadline, std::string_view secret) {
  if (!secret.empty()) {
    FERRY_ASSIGN_OR_RETURN(hello.nonce, auth::Nonce());
  } else {
    hello.nonce.clear();
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining());
  FERRY_ASSIGN_OR_RETURN(SocketAddress addr,
                         ParseAddress(address, std::clamp(left, std::chrono::milliseconds(1), kDefaultResolveTimeout)));
  int fd = Os()->Socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return os::ErrnoStatus(Code::kResourceExhausted, "socket", errno);
  auto fail = [fd](Status s) {
    Os()->Close(fd);
    return s;
  };
  const std::string ms = std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining()).count());
  if (Os()->Connect(fd, addr.get(), addr.len) != 0) {
    if (errno != EINPROGRESS) return fail(os::ErrnoStatus(Code::kUnavailable, "connecting to " + address, errno));
    if (!WaitFd(fd, POLLOUT, deadline)) return fail(Status(Code::kUnavailable, address + " did not accept a connection within " + ms + " ms"));
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      errno = err;
      return fail(os::ErrnoStatus(Code::kUnavailable, "connecting to " + address, errno));
    }
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const std::string frame = EncodeHello(hello);
  for (size_t sent = 0; sent < frame.size();) {
    ssize_t n = Os()->Send(fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return fail(os::ErrnoStatus(Code::kUnavailable, "sending ferry's handshake to " + address, errno));
    if (!WaitFd(fd, POLLOUT, deadline)) return fail(Status(Code::kUnavailable, address + " did not take ferry's handshake within " + ms + " ms"));
  }
  // One whole frame: exactly as many bytes as it announces, never more.
  auto read_frame = [&](std::string* buf) -> Status {
    buf->clear();
    size_t want = kDoorPrefixBytes;
    while (buf->size() < want) {
      char chunk[4096];
      ssize_t n = Os()->Recv(fd, chunk, std::min(sizeof(chunk), want - buf->size()), 0);
      if (n == 0) return Status(Code::kUnavailable, address + " closed the connection during ferry's handshake");
      if (n < 0) {
        if (errno != EAGAIN && errno != EINTR) return os::ErrnoStatus(Code::kUnavailable, "receiving ferry's handshake from " + address, errno);
        if (!WaitFd(fd, POLLIN, deadline))
          return Status(Code::kUnavailable, address + " did not answer ferry's handshake within " + ms +
                                                " ms (a stopped or busy engine, or not a ferry engine)");
        continue;
      }
      buf->append(chunk, static_cast<size_t>(n));
      auto length = DoorFrameLength(*buf);
      if (!length.ok()) return length.status().WithContext(address);
      if (*length != 0) want = *length;
    }
    return Status::Ok();
  };
  std::string buf;
  if (Status r = read_frame(&buf); !r.ok()) return fail(r);
  auto fields = DoorFrameFields(buf);
  if (!fields.ok()) return fail(fields.status().WithContext(address));
  if (*fields == 2) {  // a challenge: the target authenticates its peers
    auto challenge = DecodeChallenge(buf);
    if (!challenge.ok()) return fail(challenge.status().WithContext(address));
    if (secret.empty())
      return fail(Status(Code::kPermissionDenied, "engine at " + address +
                                                      " admits authenticated peers only: give this engine the "
                                                      "deployment's secret (EngineOptions::secret, FERRY_SECRET)"));
    if (!auth::MacEqual(challenge->mac, TargetProof(secret, hello, challenge->nonce)))
      return fail(Status(Code::kPermissionDenied, "engine at " + address +
                                                      " could not prove that it holds the deployment's secret "
                                                      "(a different secret?)"));
    const std::string proof = EncodeProof(Proof{InitiatorProof(secret, hello, challenge->nonce)});
    for (size_t sent = 0; sent < proof.size();) {
      ssize_t n = Os()->Send(fd, proof.data() + sent, proof.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EINTR) return fail(os::ErrnoStatus(Code::kUnavailable, "sending ferry's proof to " + address, errno));
      if (!WaitFd(fd, POLLOUT, deadline)) return fail(Status(Code::kUnavailable, address + " did not take ferry's proof within " + ms + " ms"));
    }
    if (Status r = read_frame(&buf); !r.ok()) return fail(r);
  } else if (!secret.empty()) {
    auto refusal = DecodeWelcome(buf);
    if (refusal.ok() && refusal->code != Code::kOk)
      return fail(Status(refusal->code, "engine at " + address + " refused the connection: " + refusal->message));
    return fail(Status(Code::kPermissionDenied, "engine at " + address +
                                                    " does not authenticate its peers (it has no secret); this engine "
                                                    "talks to authenticated peers only"));
  }
  auto welcome = DecodeWelcome(buf);
  if (!welcome.ok()) return fail(welcome.status().WithContext(address));
  if (welcome->code != Code::kOk)
    return fail(Status(welcome->code, "engine at " + address + " refused the connection: " + welcome->message));
  return Dialed{std::move(welcome).value(), fd};
}

}  // namespace ferry::internal::ucx
