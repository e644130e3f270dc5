// The `shm` transport: host memory between processes of one host, for regions inside buffers
// from ferry::AllocateSharedHost. The initiator maps the target region's memory file once per
// connection (the file travels over a Unix-domain socket, after the target checked the
// region's id, address and size) and moves bytes with memcpy, on the posting thread or split
// over the copy threads; a batch completes when its copy is done. Notifications go into a ring
// in memory shared with the receiver (ring.h); revocation and the region checks travel over
// the socket; see core.h and wire.h.
#include <unistd.h>

#include "base/codec.h"
#include "base/mutex.h"
#include "base/os.h"
#include "transport/host_copy.h"
#include "transport/shm/core.h"

namespace ferry::internal::shm {
namespace {

Status Gone(const char* which, uint64_t region) {
  return Status(Code::kFailedPrecondition,
                std::string(which) + " region " + std::to_string(region) + " was deregistered");
}

class ShmChannel final : public Channel {
 public:
  ShmChannel(std::shared_ptr<Core> core, std::shared_ptr<Conn> conn, std::shared_ptr<Region> local,
             std::shared_ptr<MappingSlot> slot, uint64_t remote_region)
      : core_(std::move(core)), conn_(std::move(conn)), local_(std::move(local)),
        slot_(std::move(slot)), remote_region_(remote_region) {}

  Status Post(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
              const std::shared_ptr<TransferState>& state) override {
    if (conn_->failed()) return conn_->failure();
    auto local_use = RegionUse::Make(local_);
    if (!local_use) return Gone("local", static_cast<uint64_t>(local_->id));
    std::shared_ptr<Mapping> mapping = slot_->Acquire();
    if (!mapping) return conn_->failed() ? conn_->failure() : Gone("remote", remote_region_);
    const bool write = op == Op::kWrite;
    ThreadPool* pool = core_->pool();
    if (pool == nullptr || total_bytes < core_->parallel_copy_bytes() || ops.empty()) {
      CopyInline(local_->base, mapping->base(), ops, write, total_bytes);
      // A peer that died during the copy got nothing.
      if (conn_->failed()) return conn_->failure();
      return Status::Ok();
    }
    std::byte* remote = mapping->base();
    state->Hold(std::move(local_use));
    state->Hold(std::move(mapping));  // unmapped only once every part let go
    conn_->Track(state);
    CopyParallel(pool, local_->base, remote, ops, total_bytes, write, state);
    return Status::Ok();
  }

  TransferPath path() const override { return TransferPath{std::string(kName), false}; }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<Conn> conn_;
  std::shared_ptr<Region> local_;
  std::shared_ptr<MappingSlot> slot_;
  const uint64_t remote_region_;
};

// What a call's reply callback hands to the thread that waits for it.
template <typename T>
struct Waiter {
  Mutex mu;
  CondVar cv;
  bool done GUARDED_BY(mu) = false;
  Result<T> result GUARDED_BY(mu) = Status(Code::kInternal, "no reply");

  void Set(Result<T> r) EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      if (done) return;
      result = std::move(r);
      done = true;
    }
    cv.NotifyAll();
  }
  Result<T> Wait(Deadline until) EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (!cv.WaitUntil(&mu, until.at(), [&]() REQUIRES(mu) { return done; }))
      return Status(Code::kDeadlineExceeded, "the peer did not answer in time");
    return result;
  }
};

Status NotifyStatus(const Status& s, const std::string& peer) {
  switch (s.code()) {
    case Code::kOk:
      return s;
    case Code::kResourceExhausted:
      return Status(s.code(), "the receiver's notification backlog is full");
    case Code::kInvalidArgument:
      return Status(s.code(), "the receiver refused the notification (larger than its limit)");
    default:
      return Status(s.code(), "notification to " + peer + ": " + std::string(s.message()));
  }
}

class ShmEndpoint final : public Endpoint {
 public:
  ShmEndpoint(std::shared_ptr<Core> core, std::shared_ptr<Conn> conn, std::string socket_name)
      : core_(std::move(core)), conn_(std::move(conn)), socket_name_(std::move(socket_name)) {}
  ~ShmEndpoint() override { conn_->Fail(Status(Code::kAborted, "the endpoint was closed")); }

  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local,
                                               const MemoryDesc& remote) override {
    if (conn_->failed()) return conn_->failure();
    if (remote.kind != MemoryKind::kHost || local->kind != MemoryKind::kHost)
      return Status(Code::kUnsupported, "the shm transport carries host memory");
    const TransportData* access = remote.FindAccess(kName);
    if (access == nullptr) return Status(Code::kInvalidArgument, "remote region has no shm access");
    FERRY_ASSIGN_OR_RETURN(auto name_key, UnpackAccess(access->data));
    if (name_key.first != socket_name_)
      return Status(Code::kInvalidArgument, "remote region is not reachable through this shm endpoint");
    const auto region = static_cast<uint64_t>(remote.region);
    auto slot = conn_->FindSlot(region);
    if (!slot || !slot->live() || slot->address != remote.address || slot->size != remote.size) {
      FERRY_ASSIGN_OR_RETURN(slot, Open(region, remote.address, remote.size, name_key.second));
    }
    return std::unique_ptr<Channel>(new ShmChannel(core_, conn_, local, std::move(slot), region));
  }

  // One-way: the record is in the receiver's ring on return (or refused: its limit, no room).
  Status Notify(std::string_view message) override {
    if (conn_->failed()) return conn_->failure();
    RingWriter* ring = conn_->ring();
    if (ring == nullptr) {
      FERRY_ASSIGN_OR_RETURN(ring, conn_->Ring(Deadline::After(core_->options().call_timeout)));
    }
    Status s = Put(ring, message, 0, false);
    return s.ok() ? s : NotifyStatus(s, conn_->peer_key());
  }

  // The record asks for an answer: the part is done once the receiver's inbox took it.
  void NotifyPart(std::string message, const std::shared_ptr<TransferState>& state) override {
    state->AddParts(1);
    auto peer = conn_->peer_key();
    auto ring = conn_->Ring(state->deadline());
    if (!ring.ok()) return state->PartDone(ring.status().WithContext("data written, notification failed"));
    auto token = conn_->Expect(state->deadline(), [state, peer](const Status& s, const Header&, int, int) {
      state->PartDone(NotifyStatus(s, peer).WithContext(s.ok() ? "" : "data written, notification failed"));
    });
    if (!token.ok()) return state->PartDone(token.status().WithContext("data written, notification failed"));
    Status s = Put(*ring, message, *token, true);
    // Not sent: no answer comes; unless the connection failed and answered it meanwhile.
    if (!s.ok() && conn_->Forget(*token))
      state->PartDone(NotifyStatus(s, peer).WithContext("data written, notification failed"));
  }

  bool healthy() const override { return !conn_->failed(); }

 private:
  // Asks the target for the region's memory file and maps it (on the I/O thread, so that a
  // revocation that follows the reply finds the mapping in place).
  Result<std::shared_ptr<MappingSlot>> Open(uint64_t region, uint64_t address, uint64_t size, uint64_t key) {
    auto waiter = std::make_shared<Waiter<std::shared_ptr<MappingSlot>>>();
    Header h;
    h.type = MsgType::kOpen;
    h.region = region;
    h.extra = key;
    h.offset = address;
    h.size = size;
    const Deadline until = Deadline::After(core_->options().call_timeout);
    std::weak_ptr<Conn> weak = conn_;
    FERRY_RETURN_IF_ERROR(conn_->Call(h, {}, until, [waiter, weak, region, address, size](
                                                      const Status& s, const Header& reply, int fd,
                                                      int table_fd) {
      if (!s.ok()) {
        if (fd >= 0) os::Env::Current()->Close(fd);
        if (table_fd >= 0) os::Env::Current()->Close(table_fd);
        if (s.code() == Code::kFailedPrecondition)
          return waiter->Set(Status(s.code(), "remote region " + std::to_string(region) + " is not registered"));
        if (s.code() == Code::kInvalidArgument)
          return waiter->Set(Status(s.code(), "remote descriptor does not match the registered region"));
        if (s.code() == Code::kPermissionDenied)
          return waiter->Set(Status(s.code(), "the target's access list for region " + std::to_string(region) +
                                                  " does not name this engine"));
        return waiter->Set(s);
      }
      auto mapping = Mapping::Map(fd, reply.offset, size);
      os::Env::Current()->Close(fd);
      auto conn = weak.lock();
      if (!conn) {
        os::Env::Current()->Close(table_fd);
        return waiter->Set(Status(Code::kAborted, "the endpoint was closed"));
      }
      auto view = conn->View(table_fd);
      if (!mapping.ok()) return waiter->Set(mapping.status());
      if (!view.ok()) return waiter->Set(view.status());
      const auto slot = reply.size >= kRevocationSlots ? kNoSlot : static_cast<uint32_t>(reply.size);
      waiter->Set(conn->InstallSlot(region, std::make_shared<MappingSlot>(std::move(mapping).value(), address,
                                                                          size, *view, slot, reply.extra)));
    }));
    return waiter->Wait(until);
  }

  // Publishes a record, wakes the receiver if it sleeps; a corrupt ring fails the connection.
  Status Put(RingWriter* ring, std::string_view message, uint64_t token, bool acked) {
    if (conn_->failed()) return conn_->failure();
    bool wake = false;
    Status s = ring->Put(message, token, acked, &wake);
    if (wake) conn_->WakePeer();
    if (s.code() == Code::kDataLoss) {
      conn_->Fail(s);
      return conn_->failure();
    }
    return s;
  }

  std::shared_ptr<Core> core_;
  std::shared_ptr<Conn> conn_;
  std::string socket_name_;
};

// Transport data: [host id, socket name].
struct PeerAddress {
  std::string host_id;
  std::string socket_name;
};

Result<PeerAddress> ParsePeer(const EngineDesc& peer) {
  const TransportData* t = peer.FindTransport(kName);
  if (t == nullptr) return Status(Code::kUnavailable, "peer " + peer.key + " has no shm transport");
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(t->data));
  codec::ArrayReader root = reader.root();
  PeerAddress a;
  FERRY_ASSIGN_OR_RETURN(std::string_view host, root.Bytes("host_id", kMaxKeyBytes * 2));
  FERRY_ASSIGN_OR_RETURN(std::string_view name, root.Bytes("socket", 100));
  a.host_id = host;
  a.socket_name = name;
  return a;
}

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~ShmTransport() override { core_->Shutdown(); }
  void Shutdown() override { core_->Shutdown(); }

  std::string_view name() const override { return kName; }
  Capabilities caps() const override {
    Capabilities c;
    c.host_memory = true;
    c.cuda_memory = false;
    c.reach = Reach::kSameHost;
    c.notifications = true;
    c.cost = 5;  // between `local` (0) and `ucx` (10)
    return c;
  }
  TransportData Describe() const override {
    codec::Writer w;
    w.Array(2);
    w.Str(LocalHostId());
    w.Str(core_->socket_name());
    return TransportData{std::string(kName), w.Take()};
  }
  Result<TransportData> Register(const std::shared_ptr<Region>& region) override {
    if (region->kind != MemoryKind::kHost) return Status(Code::kUnsupported, "shm carries host memory");
    return core_->Register(region);
  }
  // A peer that does not unmap in time is disconnected (Core::Deregister).
  Status Deregister(const Region& region) override {
    core_->Deregister(region);
    return Status::Ok();
  }
  uint64_t rejected_messages() const override { return core_->rejected(); }
  uint64_t auth_failures() const override { return core_->auth_failures(); }
  uint64_t connections_refused() const override { return core_->connections_refused(); }
  bool Poll() override { return core_->Poll(); }
  bool CanReach(const EngineDesc& peer) const override {
    if (peer.host_id != LocalHostId()) return false;
    auto a = ParsePeer(peer);
    return a.ok() && a->host_id == LocalHostId();
  }
  Result<std::shared_ptr<Endpoint>> Connect(const EngineDesc& peer) override {
    FERRY_ASSIGN_OR_RETURN(PeerAddress a, ParsePeer(peer));
    if (a.host_id != LocalHostId()) return Status(Code::kUnavailable, "peer " + peer.key + " is on another host");
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Conn> conn, core_->Dial(peer.key, a.socket_name));
    return std::shared_ptr<Endpoint>(std::make_shared<ShmEndpoint>(core_, std::move(conn), a.socket_name));
  }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace
}  // namespace ferry::internal::shm

namespace ferry::internal {
Result<std::unique_ptr<Transport>> MakeShmTransport(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto core, shm::Core::Create(ctx));
  return std::unique_ptr<Transport>(new shm::ShmTransport(std::move(core)));
}
}  // namespace ferry::internal
