#include "transport/shm/core.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <system_error>

#include "base/auth.h"
#include "base/codec.h"
#include "base/log.h"
#include "base/os.h"
#include "base/shared_host.h"

namespace ferry::internal::shm {
namespace {

// How long one message may wait for room in a peer's socket before the peer counts as gone.
constexpr auto kSendTimeout = std::chrono::seconds(1);

std::string RandomName() {
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "ferry-shm.%d.%08x%08x", static_cast<int>(getpid()), rd(), rd());
  return buf;
}

Status FromCode(uint8_t code, std::string_view what) {
  return Status(static_cast<Code>(code), std::string(what));
}

}  // namespace

// ---- Core ------------------------------------------------------------------------------------

Core::Core(const TransportContext& ctx)
    : engine_key_(ctx.engine_key), options_(ctx.options->shm),
      parallel_copy_bytes_(ctx.options->parallel_copy_bytes),
      max_notification_bytes_(ctx.options->max_notification_bytes), inbox_(ctx.inbox) {}

Result<std::shared_ptr<Core>> Core::Create(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(std::string secret, auth::LoadSecret(ctx.options->secret, ctx.options->secret_file));
  std::shared_ptr<Core> core(new Core(ctx));
  core->secret_ = std::move(secret);
  int threads = ctx.options->copy_threads;
  if (threads <= 0) threads = std::clamp<int>(std::thread::hardware_concurrency(), 1, 8);
  if (threads > 1) { FERRY_ASSIGN_OR_RETURN(core->pool_, ThreadPool::Create(threads, "ferry-shm")); }
  FERRY_ASSIGN_OR_RETURN(core->table_, RevocationTable::Create());
  core->socket_name_ = RandomName();
  FERRY_ASSIGN_OR_RETURN(os::UniqueFd listen_fd, os::ListenUnix(os::UnixAddress::Abstract(core->socket_name_)));
  core->listen_fd_ = listen_fd.release();
  core->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (core->wake_fd_ < 0) return Status(Code::kUnavailable, "eventfd failed");
  try {
    core->io_ = std::thread([c = core.get()] { c->Run(); });
  } catch (const std::system_error& e) {
    return Status(Code::kResourceExhausted, std::string("cannot start the shm I/O thread: ") + e.what());
  }
  return core;
}

Core::~Core() {
  Shutdown();
  if (listen_fd_ >= 0) os::Env::Current()->Close(listen_fd_);
  if (wake_fd_ >= 0) os::Env::Current()->Close(wake_fd_);
}

void Core::Shutdown() {
  if (stopping_.exchange(true)) return;
  Wake();
  if (io_.joinable()) io_.join();
  std::vector<std::shared_ptr<Conn>> conns;
  std::unordered_map<uint64_t, Exported> exported;
  {
    MutexLock lock(&mu_);
    conns.swap(conns_);
    exported.swap(exported_);
    mapped_.clear();
  }
  for (auto& [id, e] : exported) {
    table_->Revoke(e.slot);
    os::Env::Current()->Close(e.fd);
  }
  for (auto& c : conns) c->Fail(Status(Code::kAborted, "the shm transport was shut down"));
  {
    MutexLock lock(&drain_mu_);
    rings_.clear();
  }
  {
    MutexLock lock(&deferred_mu_);
    deferred_acks_.clear();
  }
  unmapped_cv_.NotifyAll();
}

bool Core::MapsLocked(const Conn* conn, uint64_t id) const {
  auto it = mapped_.find(conn);
  return it != mapped_.end() && it->second.count(id) != 0;
}

void Core::Wake() {
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof(one));
}

void Core::Reject(const std::string& why) {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  FERRY_LOG_DEBUG("shm: rejected a message: {}", why);
}

void Core::Add(const std::shared_ptr<Conn>& conn) {
  conn->self_ = conn;
  {
    MutexLock lock(&mu_);
    conns_.push_back(conn);
  }
  Wake();
}

Result<TransportData> Core::Register(const std::shared_ptr<Region>& region) {
  if (stopping_.load()) return Status(Code::kAborted, "the shm transport was shut down");
  auto span = FindSharedHost(region->base, region->size);
  if (!span)
    return Status(Code::kUnsupported,
                  "region is not inside a shareable host buffer (ferry::AllocateSharedHost)");
  int fd = fcntl(span->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return Status(Code::kResourceExhausted, "cannot keep the region's memory file open");
  auto [slot, generation] = table_->Publish();
  const uint64_t key = RegionKey();
  {
    MutexLock lock(&mu_);
    exported_[static_cast<uint64_t>(region->id)] = Exported{reinterpret_cast<uint64_t>(region->base),
                                                            region->size, key, fd, span->offset, slot, generation, region};
  }
  return TransportData{std::string(kName), PackAccess(socket_name_, key)};
}

void Core::Deregister(const Region& region) {
  const auto id = static_cast<uint64_t>(region.id);
  std::vector<std::shared_ptr<Conn>> holders;
  int fd = -1;
  {
    MutexLock lock(&mu_);
    auto it = exported_.find(id);
    if (it == exported_.end()) return;  // never registered here (not a shared buffer)
    fd = it->second.fd;
    // Every peer sees it at its next transfer, whether or not it reads the message below.
    table_->Revoke(it->second.slot);
    exported_.erase(it);
    // Every reply that handed out this region's file went out under mu_, before this point:
    // each revocation below reaches its peer after the file did.
    for (auto& c : conns_)
      if (MapsLocked(c.get(), id)) holders.push_back(c);
  }
  Header h;
  h.type = MsgType::kRevoke;
  h.region = id;
  for (auto& c : holders) (void)c->Send(h);  // a failed send fails the connection
  const Deadline deadline = Deadline::After(options_.revoke_timeout);
  {
    MutexLock lock(&mu_);
    auto released = [&]() REQUIRES(mu_) {
      return std::all_of(holders.begin(), holders.end(),
                         [&](const auto& c) REQUIRES(mu_) { return c->failed() || !MapsLocked(c.get(), id); });
    };
    unmapped_cv_.WaitUntil(&mu_, deadline.at(), released);
    for (auto& c : holders) {
      if (c->failed() || !MapsLocked(c.get(), id)) continue;
      FERRY_LOG_WARN("shm: peer {} did not unmap region {} within {} ms; disconnecting it",
                     c->peer_key(), id, options_.revoke_timeout.count());
      mapped_.erase(c.get());
      c->Fail(Status(Code::kUnavailable, "peer did not unmap a deregistered region in time"));
    }
  }
  os::Env::Current()->Close(fd);
}

Result<std::shared_ptr<Conn>> Core::Dial(const std::string& peer_key, const std::string& name) {
  if (stopping_.load()) return Status(Code::kAborted, "the shm transport was shut down");
  // No retry: the peer listens from before it was described.
  const Deadline now = Deadline::At(Clock::time_point::min());
  FERRY_ASSIGN_OR_RETURN(os::UniqueFd fd, os::ConnectUnix(os::UnixAddress::Abstract(name), now));
  int64_t uid = -1;
  if (!os::PeerUserAllowed(fd.get(), options_.allowed_uids, &uid))
    return Status(Code::kPermissionDenied, "the shm socket of " + peer_key + " belongs to another user (uid " +
                                               (uid < 0 ? std::string("?") : std::to_string(uid)) +
                                               "), not in ShmOptions::allowed_uids");
  auto conn = std::make_shared<Conn>(fd.release(), Conn::Role::kInitiator, peer_key, kSendTimeout);
  // The proofs go before the I/O thread takes the socket: this thread reads the challenge.
  if (!secret_.empty()) FERRY_RETURN_IF_ERROR(Authenticate(*conn, Deadline::After(options_.call_timeout)));
  Add(conn);
  Header hello;
  hello.type = MsgType::kHello;
  hello.size = engine_key_.size();
  FERRY_RETURN_IF_ERROR(conn->Send(hello, engine_key_));
  return conn;
}

// ---- The I/O thread --------------------------------------------------------------------------

void Core::Run() {
  std::vector<pollfd> fds;
  std::vector<std::shared_ptr<Conn>> polled;
  while (!stopping_.load(std::memory_order_acquire)) {
    {
      MutexLock lock(&mu_);
      polled = conns_;
    }
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& c : polled) fds.push_back({c->fd(), POLLIN, 0});
    int n = os::Env::Current()->Poll(fds.data(), fds.size(), PrepareToSleep());
    if (n < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof(v));
    }
    if (fds[1].revents & POLLIN) Accept();
    for (size_t i = 0; i < polled.size(); ++i) {
      const auto& c = polled[i];
      short ev = fds[i + 2].revents;
      if (ev & POLLIN) Receive(c);
      if ((ev & (POLLHUP | POLLERR)) && !(ev & POLLIN)) Drop(c, Status(Code::kUnavailable, "peer " + c->peer_key() + " hung up"));
      if (c->failed()) Drop(c, c->failure());
      else if (c->role() == Conn::Role::kInitiator) c->ExpireCalls();
    }
  }
}

void Core::Accept() {
  for (int i = 0; i < 16; ++i) {
    auto fd = os::AcceptUnix(listen_fd_);
    if (!fd.ok()) return;
    int64_t who = -1;  // -1: unknown
    if (!os::PeerUserAllowed(fd->get(), options_.allowed_uids, &who)) {
      Reject("connection from another user, not in ShmOptions::allowed_uids");
      MutexLock lock(&mu_);
      if (refused_users_.size() < 64 && refused_users_.insert(who).second)  // once per user
        FERRY_LOG_WARN("shm: refused a connection from user {} (not this process's user, nor in "
                       "ShmOptions::allowed_uids)", who);
      continue;  // `fd` closes itself
    }
    {
      MutexLock lock(&mu_);
      if (accepted_ >= options_.max_connections) {
        // Refused at once (`fd` closes itself): the peer's next message finds the socket closed.
        refused_.fetch_add(1, std::memory_order_relaxed);
        if (!refusing_)
          FERRY_LOG_WARN("shm: refusing connections: {} served already (ShmOptions::max_connections)",
                         options_.max_connections);
        refusing_ = true;  // logged once until a connection is admitted again
        continue;
      }
      refusing_ = false;
      ++accepted_;
    }
    Add(std::make_shared<Conn>(fd->release(), Conn::Role::kTarget, "(unnamed)", kSendTimeout));
  }
}

void Core::Drop(const std::shared_ptr<Conn>& conn, Status why) {
  // An initiator with another secret finds the challenge's proof wrong and hangs up.
  if (conn->auth_pending()) {
    conn->set_auth_pending(false);
    auth_failures_.fetch_add(1, std::memory_order_relaxed);
    FERRY_LOG_DEBUG("shm: a peer hung up without proving the deployment's secret");
  }
  conn->Fail(std::move(why));
  if (conn->role() == Conn::Role::kTarget) DropRing(conn);
  {
    MutexLock lock(&mu_);
    mapped_.erase(conn.get());
    if (std::erase(conns_, conn) != 0 && conn->role() == Conn::Role::kTarget) --accepted_;
  }
  unmapped_cv_.NotifyAll();
  // Whoever still holds the connection (an endpoint the engine keeps for a peer that died)
  // holds no socket: one per peer killed and replaced would pile up until RLIMIT_NOFILE.
  conn->CloseSocket();
}

void Core::Receive(const std::shared_ptr<Conn>& conn) {
  // Notifications travel in the ring: the largest message is an authentication's first step.
  const size_t max_bytes = kHeaderBytes + 64 + kMaxKeyBytes;
  for (int i = 0; i < 64 && !conn->failed(); ++i) {
    auto msg = os::ReceiveMessage(conn->fd(), max_bytes);
    if (!msg.ok()) {
      if (msg.status().code() != Code::kInProgress) Drop(conn, msg.status());
      return;
    }
    Handle(conn, *msg);
  }
}

void Core::Handle(const std::shared_ptr<Conn>& conn, os::Received& msg) {
  // Descriptors are expected only with a successful kOpenReply (two); any other is closed.
  int region_fd = -1, table_fd = -1;
  auto close_fds = [&] { msg.fds.clear(); };
  auto m = Decode(msg.bytes.data(), msg.bytes.size());
  if (!m.ok() || msg.truncated) {
    close_fds();
    return Reject(m.ok() ? "truncated message" : std::string(m.status().message()));
  }
  // A successful kOpenReply brings the region's file and the revocation table; a successful
  // kRing the ring's file.
  const bool initiator = conn->role() == Conn::Role::kInitiator && m->header.code == 0;
  const size_t wanted = !initiator                             ? 0
                        : m->header.type == MsgType::kOpenReply ? 2
                        : m->header.type == MsgType::kRing      ? 1
                                                                : 0;
  if (wanted != 0 && msg.fds.size() == wanted) {
    region_fd = msg.fds[0].release();
    table_fd = wanted == 2 ? msg.fds[1].release() : -1;
    msg.fds.clear();
  } else if (!msg.fds.empty() || wanted != 0) {
    close_fds();
    if (wanted != 0 && m->header.type == MsgType::kOpenReply) {
      // An OK answer without its file: fail the call.
      (void)conn->Complete(m->header.token, Status(Code::kInvalidArgument, "the peer sent no memory file"),
                           m->header, -1, -1);
    }
    if (wanted != 0 && m->header.type == MsgType::kRing)
      (void)conn->SetRing(Status(Code::kInvalidArgument, "the peer sent no ring file"));
    return Reject("unexpected file descriptors");
  }
  if (conn->role() == Conn::Role::kTarget) return HandleAtTarget(conn, *m);
  HandleAtInitiator(conn, *m, region_fd, table_fd);
}

void Core::HandleAtTarget(const std::shared_ptr<Conn>& conn, const Message& m) {
  const Header& h = m.header;
  if (h.type == MsgType::kAuth) return HandleAuth(conn, m);
  if (h.type == MsgType::kHello) {
    if (conn->hello_seen() || m.payload.empty() || m.payload.size() > kMaxKeyBytes)
      return Reject("bad hello");
    if (!secret_.empty() && (!conn->auth().proven || conn->auth().key != m.payload)) {
      conn->auth().key = std::string(m.payload);
      return RefuseAuth(conn, "engine '" + engine_key_ +
                                  "' admits authenticated peers only: give this engine the deployment's secret "
                                  "(EngineOptions::secret, FERRY_SECRET)");
    }
    conn->set_peer_key(std::string(m.payload));
    return OfferRing(conn);
  }
  if (!conn->hello_seen()) return Reject("message before hello");
  switch (h.type) {
    case MsgType::kOpen: {
      Header reply;
      reply.type = MsgType::kOpenReply;
      reply.token = h.token;
      reply.region = h.region;
      MutexLock lock(&mu_);
      auto it = exported_.find(h.region);
      int pass[2] = {-1, table_->fd()};
      size_t files = 0;
      if (it == exported_.end() || it->second.key != h.extra) {
        // A wrong key is as good as no region (ids are small and sequential; keys are not).
        if (it != exported_.end()) Reject("open of region " + std::to_string(h.region) + " without its key");
        reply.code = static_cast<uint8_t>(Code::kFailedPrecondition);
      } else if (it->second.address != h.offset || it->second.size != h.size) {
        Reject("open of region " + std::to_string(h.region) + " with a wrong address or size");
        reply.code = static_cast<uint8_t>(Code::kInvalidArgument);
      } else if (!it->second.region->Admit(kName, conn->peer_key())) {
        // Not on the region's access list: its memory file stays here (counted and logged).
        reply.code = static_cast<uint8_t>(Code::kPermissionDenied);
      } else {
        reply.offset = it->second.file_offset;
        reply.size = it->second.slot;
        reply.extra = it->second.generation;
        pass[0] = it->second.fd;
        files = 2;
        mapped_[conn.get()].insert(h.region);
      }
      // Sent under mu_: a revocation of this region cannot overtake the file (Deregister).
      (void)conn->Send(reply, {}, std::span<const int>(pass, files));
      return;
    }
    case MsgType::kWake:
      return;  // the I/O thread drains the rings before it sleeps again
    case MsgType::kUnmapped: {
      {
        MutexLock lock(&mu_);
        if (auto m = mapped_.find(conn.get()); m != mapped_.end()) m->second.erase(h.region);
      }
      unmapped_cv_.NotifyAll();
      return;
    }
    default:
      return Reject("message type " + std::to_string(static_cast<int>(h.type)) + " sent to a target");
  }
}

void Core::HandleAtInitiator(const std::shared_ptr<Conn>& conn, const Message& m, int region_fd, int table_fd) {
  const Header& h = m.header;
  switch (h.type) {
    case MsgType::kOpenReply:
    case MsgType::kAck: {
      Status s = h.code == 0 ? Status::Ok() : FromCode(h.code, "the peer refused");
      if (!conn->Complete(h.token, s, h, region_fd, table_fd)) {
        if (region_fd >= 0) os::Env::Current()->Close(region_fd);
        if (table_fd >= 0) os::Env::Current()->Close(table_fd);
        Reject("reply to no call");
      }
      return;
    }
    case MsgType::kRevoke:
      conn->RevokeSlot(h.region);
      return;
    case MsgType::kRing: {
      Result<std::unique_ptr<RingWriter>> ring =
          h.code != 0 ? Result<std::unique_ptr<RingWriter>>(FromCode(h.code, "the peer has no notification ring"))
                      : RingWriter::Map(region_fd, h.size, h.offset);
      if (region_fd >= 0) os::Env::Current()->Close(region_fd);
      const bool bad = h.code == 0 && !ring.ok();
      if (bad) Reject("notification ring: " + std::string(ring.status().message()));
      if (!conn->SetRing(std::move(ring)) && !bad) Reject("a second notification ring");
      return;
    }
    default:
      return Reject("message type " + std::to_string(static_cast<int>(h.type)) + " sent to an initiator");
  }
}

}  // namespace ferry::internal::shm
