// The handshake endpoint (handshake.h): one thread polls the listener, a wake descriptor and
// every open connection; each connection reads the 8-byte request, then writes the length and
// the metadata, all without blocking, and is closed at its deadline whatever its state. The
// metadata is shared (immutable, reference-counted) so that SetMetadata never waits for a
// slow reader and an answer in flight keeps the bytes it started with.
//
// Every socket call goes through the OS seam (base/os.h).
#include "kv/handshake.h"

#include "base/thread_pool.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <climits>
#include <cstring>
#include <thread>
#include <vector>

#include "base/deadline.h"
#include "base/endian.h"
#include "base/host_port.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/unique_fd.h"
#include "base/unix_socket.h"

namespace ferry::kv {
namespace {

using os::Env;
using os::UniqueFd;

constexpr std::string_view kRequest = "ferrykv1";
constexpr size_t kHeaderBytes = 4;
constexpr int kSocketFlags = SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC;

// How long a name in an address may take to resolve (numeric addresses need no lookup).
std::chrono::milliseconds ResolveTimeout(Duration timeout) {
  return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(timeout),
                    std::chrono::milliseconds(1), kDefaultResolveTimeout);
}

// "host:port" (IPv4, "[IPv6]" or a name) with a port in 1..65535.
Result<SocketAddress> ParseAddress(const std::string& address, Duration timeout) {
  FERRY_ASSIGN_OR_RETURN(HostPort hp, SplitHostPort(address));
  if (hp.port == 0) return Status(Code::kInvalidArgument, "handshake address '" + address + "': port 0");
  return ResolveHost(hp.host, hp.port, ResolveTimeout(timeout));
}

// Milliseconds for poll() until `d`, rounded up so that a wait never ends before its deadline.
int PollMs(const Deadline& d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d.remaining()).count();
  const long long ms = (ns + 999'999) / 1'000'000;
  return static_cast<int>(std::min<long long>(ms, INT_MAX));
}

// Waits until `fd` is ready for `events` or `d` passes.
Status WaitFd(int fd, short events, const Deadline& d, std::string_view what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = Env::Current()->Poll(&p, 1, PollMs(d));
    if (n > 0) return Status::Ok();
    if (n < 0 && errno != EINTR) return os::ErrnoStatus("poll", errno);
    if (n == 0 && d.expired())
      return Status(Code::kDeadlineExceeded, "handshake: timed out " + std::string(what));
  }
}

Status Connect(int fd, const SocketAddress& addr, const Deadline& d) {
  Env* env = Env::Current();
  if (env->Connect(fd, addr.get(), addr.len) == 0)
    return Status::Ok();
  int err = errno;
  if (err == EINPROGRESS || err == EINTR) {
    FERRY_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, d, "connecting"));
    socklen_t len = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0) return Status::Ok();
  }
  if (err == ECONNREFUSED || err == ENETUNREACH || err == EHOSTUNREACH || err == ECONNRESET)
    return os::ErrnoStatus(Code::kUnavailable, "handshake connect", err);
  return os::ErrnoStatus("handshake connect", err);
}

Status SendAll(int fd, std::string_view bytes, const Deadline& d) {
  while (!bytes.empty()) {
    const ssize_t n = Env::Current()->Send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (errno == EAGAIN || errno == EINTR) {
      FERRY_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, d, "sending the request"));
    } else {
      return os::ErrnoStatus(Code::kUnavailable, "handshake send", errno);
    }
  }
  return Status::Ok();
}

// Appends exactly `bytes` bytes to *out.
Status RecvExact(int fd, size_t bytes, std::string* out, const Deadline& d) {
  const size_t want = out->size() + bytes;
  while (out->size() < want) {
    // Grow as bytes arrive: a peer that announces much and sends little costs little.
    const size_t chunk = std::min<size_t>(want - out->size(), 64 * 1024);
    const size_t at = out->size();
    out->resize(at + chunk);
    const ssize_t n = Env::Current()->Recv(fd, out->data() + at, chunk, 0);
    out->resize(at + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n > 0) continue;
    if (n == 0)
      return Status(Code::kUnavailable, "handshake: the peer closed the connection after " +
                                            std::to_string(out->size()) + " bytes");
    if (errno != EAGAIN && errno != EINTR)
      return os::ErrnoStatus(Code::kUnavailable, "handshake recv", errno);
    FERRY_RETURN_IF_ERROR(WaitFd(fd, POLLIN, d, "waiting for the answer"));
  }
  return Status::Ok();
}

// One accepted connection: reading the request, then writing the answer.
struct Connection {
  UniqueFd fd;
  Deadline deadline;
  std::string request;                        // bytes of the request read so far
  std::shared_ptr<const std::string> answer;  // set once the request is complete
  char header[kHeaderBytes] = {};
  size_t sent = 0;  // of header and answer together
};

enum class Step { kWait, kDone, kDrop };

}  // namespace

struct HandshakeServer::Impl {
  HandshakeOptions options;
  UniqueFd listener;
  UniqueFd wake;
  std::string address;
  uint16_t port = 0;
  Mutex mu;
  std::shared_ptr<const std::string> metadata GUARDED_BY(mu);
  std::atomic<uint64_t> served{0};
  std::atomic<uint64_t> rejected{0};
  std::thread thread;

  void Run();
  void AcceptAll(std::vector<Connection>& conns);
  Step Advance(Connection& c);
  std::shared_ptr<const std::string> Snapshot() EXCLUDES(mu) {
    MutexLock l(&mu);
    return metadata;
  }
};

Step HandshakeServer::Impl::Advance(Connection& c) {
  Env* env = Env::Current();
  while (!c.answer) {
    char buf[kRequest.size()];
    const size_t want = kRequest.size() - c.request.size();
    const ssize_t n = env->Recv(c.fd.get(), buf, want, 0);
    if (n == 0) return Step::kDrop;  // closed before asking
    if (n < 0) return errno == EAGAIN || errno == EINTR ? Step::kWait : Step::kDrop;
    c.request.append(buf, static_cast<size_t>(n));
    if (kRequest.substr(0, c.request.size()) != c.request) return Step::kDrop;
    if (c.request.size() == kRequest.size()) {
      c.answer = Snapshot();
      StoreLe32(c.header, static_cast<uint32_t>(c.answer->size()));
    }
  }
  const size_t total = kHeaderBytes + c.answer->size();
  while (c.sent < total) {
    const bool in_header = c.sent < kHeaderBytes;
    const char* p = in_header ? c.header + c.sent : c.answer->data() + (c.sent - kHeaderBytes);
    const size_t len = in_header ? kHeaderBytes - c.sent : total - c.sent;
    const ssize_t n = env->Send(c.fd.get(), p, len, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EINTR ? Step::kWait : Step::kDrop;
    c.sent += static_cast<size_t>(n);
  }
  return Step::kDone;
}

void HandshakeServer::Impl::AcceptAll(std::vector<Connection>& conns) {
  for (;;) {
    UniqueFd fd(Env::Current()->Accept(listener.get(), SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN) {
        // Out of descriptors, most likely: leave the rest queued for the next round rather
        // than spin on a listener that stays readable.
        FERRY_LOG_WARN("handshake server {}: accept failed: {}", address, std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;
    }
    if (conns.size() >= options.max_connections) {
      rejected.fetch_add(1, std::memory_order_relaxed);
      continue;  // closed here, at once
    }
    Connection c;
    c.fd = std::move(fd);
    c.deadline = Deadline::After(options.io_timeout);
    conns.push_back(std::move(c));
  }
}

void HandshakeServer::Impl::Run() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake.get(), POLLIN, 0});
    fds.push_back({listener.get(), POLLIN, 0});
    Deadline next;
    for (const Connection& c : conns) {
      fds.push_back({c.fd.get(), static_cast<short>(c.answer ? POLLOUT : POLLIN), 0});
      next = Deadline::Earlier(next, c.deadline);
    }
    const int timeout = conns.empty() ? -1 : PollMs(next);
    const int n = Env::Current()->Poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      FERRY_LOG_ERROR("handshake server {}: poll failed: {}", address, std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (n > 0 && fds[0].revents != 0) break;  // stopping
    // The connections polled are conns[0, fds.size() - 2); those accepted below come after.
    std::vector<Connection> kept;
    kept.reserve(conns.size());
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = conns[i];
      Step step = Step::kWait;
      if (n > 0 && fds[i + 2].revents != 0) step = Advance(c);
      if (step == Step::kWait && c.deadline.expired()) step = Step::kDrop;
      if (step == Step::kDone) served.fetch_add(1, std::memory_order_relaxed);
      if (step == Step::kDrop) rejected.fetch_add(1, std::memory_order_relaxed);
      if (step == Step::kWait) kept.push_back(std::move(c));
    }
    conns = std::move(kept);
    if (n > 0 && fds[1].revents != 0) AcceptAll(conns);
  }
  // Every open connection closes with `conns`.
}

HandshakeServer::HandshakeServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HandshakeServer::~HandshakeServer() {
  if (!impl_) return;
  os::SignalWakeFd(impl_->wake.get());
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<HandshakeServer>> HandshakeServer::Start(std::string metadata,
                                                                const HandshakeOptions& options) {
  if (metadata.size() > kMaxHandshakeBytes)
    return Status(Code::kInvalidArgument, "handshake metadata of " +
                                              std::to_string(metadata.size()) + " bytes exceeds " +
                                              std::to_string(kMaxHandshakeBytes));
  if (options.max_connections == 0 || options.io_timeout <= std::chrono::milliseconds(0))
    return Status(Code::kInvalidArgument,
                  "handshake server: max_connections and io_timeout must be positive");
  FERRY_ASSIGN_OR_RETURN(SocketAddress addr, ResolveHost(options.host, options.port));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  {
    MutexLock l(&impl->mu);
    impl->metadata = std::make_shared<const std::string>(std::move(metadata));
  }
  Env* env = Env::Current();
  impl->listener = UniqueFd(env->Socket(addr.family(), kSocketFlags, 0));
  if (!impl->listener.valid()) return os::ErrnoStatus("handshake socket", errno);
  const int one = 1;
  (void)::setsockopt(impl->listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const std::string where = JoinHostPort(options.host, options.port);
  if (env->Bind(impl->listener.get(), addr.get(), addr.len) != 0)
    return os::ErrnoStatus("handshake bind " + where, errno);
  const int backlog =
      static_cast<int>(std::min<size_t>(std::max<size_t>(options.max_connections, 128), SOMAXCONN));
  if (env->Listen(impl->listener.get(), backlog) != 0)
    return os::ErrnoStatus("handshake listen " + where, errno);
  FERRY_ASSIGN_OR_RETURN(SocketAddress bound, LocalAddress(impl->listener.get()));
  impl->port = bound.port();
  // Peers dial the wildcard's loopback of the same family; otherwise the address as given
  // (a name stays a name: it may resolve differently on the peer's host).
  std::string host = options.host;
  if (bound.IsAny()) host = bound.family() == AF_INET6 ? "::1" : "127.0.0.1";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  impl->address = JoinHostPort(host, impl->port);
  FERRY_ASSIGN_OR_RETURN(impl->wake, os::MakeWakeFd());
  Impl* raw = impl.get();
  FERRY_ASSIGN_OR_RETURN(impl->thread, StartThread("kv-handshake", [raw] { raw->Run(); }));
  return std::unique_ptr<HandshakeServer>(new HandshakeServer(std::move(impl)));
}

const std::string& HandshakeServer::address() const { return impl_->address; }
uint16_t HandshakeServer::port() const { return impl_->port; }
uint64_t HandshakeServer::served() const { return impl_->served.load(std::memory_order_relaxed); }
uint64_t HandshakeServer::rejected() const {
  return impl_->rejected.load(std::memory_order_relaxed);
}

void HandshakeServer::SetMetadata(std::string metadata) {
  if (metadata.size() > kMaxHandshakeBytes) {
    // No peer would accept it; keep answering with what was served so far.
    FERRY_LOG_ERROR("handshake server {}: metadata of {} bytes exceeds {}; not replaced",
                    impl_->address, metadata.size(), kMaxHandshakeBytes);
    return;
  }
  auto next = std::make_shared<const std::string>(std::move(metadata));
  MutexLock l(&impl_->mu);
  impl_->metadata = std::move(next);
}

Result<std::string> FetchMetadata(const std::string& address, Duration timeout) {
  const Deadline d = Deadline::After(timeout);
  FERRY_ASSIGN_OR_RETURN(SocketAddress addr, ParseAddress(address, timeout));
  UniqueFd fd(Env::Current()->Socket(addr.family(), kSocketFlags, 0));
  if (!fd.valid()) return os::ErrnoStatus("handshake socket", errno);
  auto context = [&](const Status& s) { return s.WithContext("handshake with " + address); };
  if (Status s = Connect(fd.get(), addr, d); !s.ok()) return context(s);
  if (Status s = SendAll(fd.get(), kRequest, d); !s.ok()) return context(s);
  std::string header;
  if (Status s = RecvExact(fd.get(), kHeaderBytes, &header, d); !s.ok()) return context(s);
  const uint32_t len = LoadLe32(header.data());
  if (len > kMaxHandshakeBytes)
    return Status(Code::kInvalidArgument, "handshake with " + address + ": an answer of " +
                                              std::to_string(len) + " bytes exceeds " +
                                              std::to_string(kMaxHandshakeBytes));
  std::string answer;
  if (Status s = RecvExact(fd.get(), len, &answer, d); !s.ok()) return context(s);
  return answer;
}

}  // namespace ferry::kv
