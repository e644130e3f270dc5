// The `ucx` transport: host memory across processes and hosts through UCX. One-sided writes
// and reads use native RMA (put/get + flush) where the UCX transport has it, and active
// messages received straight into registered memory where RMA would be emulated (TCP).
#include <algorithm>
#include <cstring>

#include "base/codec.h"
#include "base/log.h"
#include "base/tsan.h"
#include "transport/ucx/core.h"

namespace ferry::internal::ucx {

namespace {

// Write pieces up to this size are sent eagerly (copied through UCX's buffers) rather than by
// rendezvous, whose extra round trips dominate for KV-cache-sized blocks.
constexpr uint64_t kEagerBytes = 256 << 10;


// ---- Channel ---------------------------------------------------------------------------------

struct FlushCtx {
  std::shared_ptr<TransferState> state;
};

void OnFlushDone(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<FlushCtx*>(user_data);
  FERRY_TSAN_WIRE_ACQUIRE();  // RMA completed at the target
  ctx->state->PartDone(FromUcs(status, "completing RMA"));
  delete ctx;
  ucp_request_free(request);
}

class UcxChannel final : public Channel {
 public:
  // `conns`: the peer's connections, one per shard it was spread over (see UcxEndpoint).
  UcxChannel(std::shared_ptr<Core> core, std::vector<std::shared_ptr<Conn>> conns,
             std::shared_ptr<Region> local, MemoryDesc remote, uint64_t remote_key)
      : core_(std::move(core)), conns_(std::move(conns)), local_(std::move(local)),
        remote_(std::move(remote)), remote_key_(remote_key), rma_(HasRemoteKey(remote_)) {}

  Status Post(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
              const std::shared_ptr<TransferState>& state) override {
    for (const auto& conn : conns_)
      if (conn->failed()) return conn->failure();
    auto hold = RegionUse::Make(local_);
    if (!hold)
      return Status(Code::kFailedPrecondition, "local region " +
                                                   std::to_string(static_cast<uint64_t>(local_->id)) +
                                                   " was deregistered");
    state->Hold(hold);
    // GPU memory on either side goes through bounce buffers (staged.h), on one connection;
    // host memory is spread over the connections.
    auto shares = staged() ? std::vector<std::shared_ptr<std::vector<TransferOp>>>{
                                 std::make_shared<std::vector<TransferOp>>(ops.begin(), ops.end())}
                           : Spread(ops);
    size_t tasks = 0;
    for (const auto& share : shares) tasks += !share->empty();
    state->AddParts(tasks);  // each posting task's own part, before any can finish
    for (size_t k = 0; k < shares.size(); ++k) {
      if (shares[k]->empty()) continue;
      const auto& conn = conns_[k];
      bool submitted = conn->shard().worker->Submit([this_core = core_, conn, local = local_,
                                                     remote = remote_, op, batch = std::move(shares[k]),
                                                     state, hold, staged = staged(), key = remote_key_,
                                                     rma = rma_] {
        if (staged) {
          if (conn->failed()) return state->PartDone(conn->failure());
          if (!state->finished()) {
            if (op == Op::kWrite) this_core->stager().PostWrite(conn, local, remote, *batch, state);
            else this_core->stager().PostRead(conn, local, remote, *batch, state);
          }
          return state->PartDone(Status::Ok());
        }
        Run(*this_core, *conn, *local, remote, key, rma, op, *batch, state, hold);
      });
      if (!submitted) state->PartDone(Status(Code::kAborted, "the ucx transport was shut down"));
    }
    return Status::Ok();
  }

  TransferPath path() const override { return TransferPath{"ucx", staged()}; }

 private:
  bool staged() const { return local_->kind == MemoryKind::kCuda || remote_.kind == MemoryKind::kCuda; }
  // The batch's share for each connection: all of it with one connection; otherwise pieces of
  // at most max_am_bytes dealt round robin, so that every shard's thread posts (and, for active
  // messages, copies) its part.
  std::vector<std::shared_ptr<std::vector<TransferOp>>> Spread(std::span<const TransferOp> ops) const {
    std::vector<std::shared_ptr<std::vector<TransferOp>>> shares;
    if (conns_.size() == 1) {
      shares.push_back(std::make_shared<std::vector<TransferOp>>(ops.begin(), ops.end()));
      return shares;
    }
    for (size_t k = 0; k < conns_.size(); ++k) shares.push_back(std::make_shared<std::vector<TransferOp>>());
    const uint64_t max_piece = core_->options().max_am_bytes;
    size_t next = 0;
    for (const TransferOp& o : ops) {
      for (uint64_t done = 0; done < o.size; done += max_piece) {
        uint64_t size = std::min(max_piece, o.size - done);
        shares[next++ % shares.size()]->push_back({o.local_offset + done, o.remote_offset + done, size});
      }
    }
    return shares;
  }

  // On the progress thread: posts every op, then finishes the task's part.
  // `rma`: the remote region has a remote key (a region with an access list has none: each of
  // its requests goes as an active message, which the target checks).
  static void Run(Core& core, Conn& conn, Region& local, const MemoryDesc& remote, uint64_t key, bool rma, Op op,
                  const std::vector<TransferOp>& ops, const std::shared_ptr<TransferState>& state,
                  const std::shared_ptr<RegionUse>& hold) {
    if (conn.failed()) return state->PartDone(conn.failure());
    if (state->finished()) return state->PartDone(Status::Ok());  // e.g. its deadline passed
    Status s = rma && core.UseRma(conn) ? PostRma(core, conn, local, remote, op, ops, state)
                                 : PostAm(core, conn, local, remote, key, op, ops, state, hold);
    state->PartDone(s);
  }

  static Status PostRma(Core& core, Conn& conn, Region& local, const MemoryDesc& remote, Op op,
                        const std::vector<TransferOp>& ops, const std::shared_ptr<TransferState>& state) {
    FERRY_TSAN_WIRE_RELEASE();
    const size_t lanes = conn.lanes();
    std::vector<bool> used(lanes, false);
    int posted = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const TransferOp& o = ops[i];
      if (o.size == 0) continue;
      if (conn.failed()) return conn.failure();  // a send may run the error handler inline
      size_t lane = i % lanes;
      FERRY_ASSIGN_OR_RETURN(ucp_rkey_h rkey, conn.RemoteKey(remote, lane));
      ucp_request_param_t p = {};
      void* req;
      if (op == Op::kWrite) {
        req = ucp_put_nbx(conn.ep(lane), local.base + o.local_offset, o.size,
                          remote.address + o.remote_offset, rkey, &p);
      } else {
        req = ucp_get_nbx(conn.ep(lane), local.base + o.local_offset, o.size,
                          remote.address + o.remote_offset, rkey, &p);
      }
      if (UCS_PTR_IS_ERR(req)) return FromUcs(UCS_PTR_STATUS(req), op == Op::kWrite ? "ucp_put_nbx" : "ucp_get_nbx");
      if (req != nullptr) ucp_request_free(req);  // completes internally; the flush reports it
      used[lane] = true;
      if (++posted % core.options().post_batch == 0) {
        ucp_worker_progress(conn.shard().worker->handle());
        if (conn.failed()) return conn.failure();  // its error handler ran during progress
      }
    }
    // Remote completion: one flush per lane that carried ops.
    if (conn.failed()) return conn.failure();
    for (size_t lane = 0; lane < lanes; ++lane) {
      if (!used[lane]) continue;
      auto* ctx = new FlushCtx{state};
      ucp_request_param_t p = {};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = &OnFlushDone;
      p.user_data = ctx;
      state->AddParts(1);
      void* req = ucp_ep_flush_nbx(conn.ep(lane), &p);
      if (UCS_PTR_IS_ERR(req)) {
        state->PartDone(FromUcs(UCS_PTR_STATUS(req), "ucp_ep_flush_nbx"));
        delete ctx;
      } else if (req == nullptr) {
        state->PartDone(Status::Ok());
        delete ctx;
      }
    }
    return Status::Ok();
  }

  // Each write message holds the local region until UCX has sent it (a rendezvous reads it
  // in place), even after its transfer ended at the deadline.
  static Status PostAm(Core& core, Conn& conn, Region& local, const MemoryDesc& remote, uint64_t key, Op op,
                       const std::vector<TransferOp>& ops, const std::shared_ptr<TransferState>& state,
                       const std::shared_ptr<RegionUse>& hold) {
    const uint64_t max_piece = core.options().max_am_bytes;
    const size_t lanes = conn.lanes();
    int posted = 0;
    size_t lane = 0;
    for (const TransferOp& o : ops) {
      for (uint64_t done = 0; done < o.size; done += max_piece) {
        uint64_t size = std::min(max_piece, o.size - done);
        if (conn.failed()) return conn.failure();  // a send may run the error handler inline
        Pending pending{state, &conn, 0, nullptr, size};
        if (op == Op::kRead) pending.dst = local.base + o.local_offset + done;
        state->AddParts(1);
        AmHeader h;
        h.type = op == Op::kWrite ? MsgType::kWrite : MsgType::kReadReq;
        h.token = conn.shard().AddPending(std::move(pending));
        h.region = static_cast<uint64_t>(remote.region);
        h.offset = o.remote_offset + done;
        h.size = size;
        h.key = key;
        h.conn = conn.id();
        h.lane = static_cast<uint8_t>(lane % lanes);
        ucp_ep_h ep = conn.ep(lane++ % lanes);
        // Pieces up to kEagerBytes go eagerly: no rendezvous round trips per piece.
        if (op == Op::kWrite)
          conn.shard().Send(ep, h, local.base + o.local_offset + done, {}, size <= kEagerBytes, hold);
        else conn.shard().Send(ep, h, nullptr, {});
        if (++posted % core.options().post_batch == 0) {
          ucp_worker_progress(conn.shard().worker->handle());
          if (conn.failed()) return conn.failure();  // its error handler ran during progress
        }
      }
    }
    return Status::Ok();
  }

  std::shared_ptr<Core> core_;
  std::vector<std::shared_ptr<Conn>> conns_;
  std::shared_ptr<Region> local_;
  MemoryDesc remote_;
  const uint64_t remote_key_;
  const bool rma_;
};

// ---- Endpoint --------------------------------------------------------------------------------

// A peer's connections: min(lanes, workers) of them, on consecutive shards, the lanes dealt
// among them. Checks and notifications go on the first.
class UcxEndpoint final : public Endpoint {
 public:
  UcxEndpoint(std::shared_ptr<Core> core, std::vector<std::shared_ptr<Conn>> conns)
      : core_(std::move(core)), conns_(std::move(conns)) {}
  ~UcxEndpoint() override {
    // Sessions hold their endpoint: once none does, the connections close.
    for (const auto& conn : conns_) {
      conn->shard().worker->Submit([conn] {
        conn->Close();
        conn->shard().conns.erase(conn);
      });
    }
  }

  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local,
                                               const MemoryDesc& remote) override {
    for (const auto& conn : conns_)
      if (conn->failed()) return conn->failure();
    if (local->kind == MemoryKind::kCuda && !core_->stager().gpu())
      return Status(Code::kUnsupported, "no CUDA device to stage GPU memory through");
    FERRY_ASSIGN_OR_RETURN(uint64_t key, AccessKey(remote));
    // The target confirms the region as described before any byte moves to it.
    AmHeader check;
    check.type = MsgType::kCheck;
    check.region = static_cast<uint64_t>(remote.region);
    check.key = key;
    check.offset = remote.address;
    check.size = remote.size;
    const auto timeout = core_->options().connect_timeout;
    Status s = core_->Call(conns_[0], check, {}, Deadline::After(timeout));
    if (s.code() == Code::kDeadlineExceeded)
      return Status(Code::kUnavailable, "peer " + conns_[0]->peer().key + " did not confirm region " +
                                            std::to_string(static_cast<uint64_t>(remote.region)) + " within " +
                                            std::to_string(timeout.count()) + " ms (ucx.connect_timeout)");
    if (s.code() == Code::kInvalidArgument)
      return Status(Code::kInvalidArgument, "remote descriptor does not match the registered region");
    if (s.code() == Code::kFailedPrecondition)
      return Status(Code::kFailedPrecondition, "remote region " +
                                                   std::to_string(static_cast<uint64_t>(remote.region)) +
                                                   " is not registered");
    if (s.code() == Code::kPermissionDenied)
      return Status(Code::kPermissionDenied, "engine " + conns_[0]->peer().key + "'s access list for region " +
                                                 std::to_string(static_cast<uint64_t>(remote.region)) +
                                                 " does not name this engine");
    FERRY_RETURN_IF_ERROR(s);
    return std::unique_ptr<Channel>(new UcxChannel(core_, conns_, local, remote, key));
  }

  // Runs `fn` holding the shard's worker: at once when this thread holds it already (a
  // callback of that worker) or can take it without waiting, else on the progress thread.
  // False once the transport is shut down.
  template <typename F>
  static bool RunOnWorker(Shard& shard, F& fn) {
    if (shard.worker->Held()) {
      fn();
      return true;
    }
    if (shard.worker->TryRun(fn)) return true;
    return shard.worker->Submit(std::move(fn));
  }

  // One-way once the peer has answered on this connection: sent eagerly without a token, so
  // the receiver does not answer; from this thread when it can take the worker (RunOnWorker),
  // else by the progress thread. The first notification on a connection nobody has answered
  // yet is a round trip, so that a peer that is gone fails this call (kUnavailable) rather
  // than every later one vanishing. Order: a notification follows the data of writes that
  // completed before it (their acks came back), and this thread's earlier notifications
  // (one endpoint, eager messages in order; RunOnWorker never overtakes queued work).
  Status Notify(std::string_view message) override {
    const auto& conn = conns_[0];
    if (conn->failed()) return conn->failure();
    AmHeader h;
    h.type = MsgType::kNotify;
    std::string payload = EncodeNotify(message);
    h.size = payload.size();
    if (!conn->answered()) {
      Status s = core_->Call(conn, h, std::move(payload), Deadline::After(core_->options().connect_timeout));
      if (s.code() == Code::kDeadlineExceeded)
        return Status(Code::kUnavailable, "peer " + conn->peer().key + " did not answer in time");
      return s;
    }
    Shard& shard = conn->shard();
    h.conn = conn->id();
    auto send = [&shard, conn, h, payload = std::move(payload)]() mutable {
      if (conn->failed()) return;  // the next call reports the failure
      shard.Send(conn->ep(0), h, nullptr, std::move(payload), /*eager=*/true);
    };
    if (!RunOnWorker(shard, send)) return Status(Code::kAborted, "the ucx transport was shut down");
    // A failure that the send itself detected is reported now rather than by the next call.
    if (conn->failed()) return conn->failure();
    return Status::Ok();
  }

  // Acked: the batch that carries it completes once the receiver holds it.
  void NotifyPart(std::string message, const std::shared_ptr<TransferState>& state) override {
    state->AddParts(1);
    const auto& conn = conns_[0];
    Shard& shard = conn->shard();
    auto send = [&shard, conn, state, payload = EncodeNotify(message)]() mutable {
      if (conn->failed()) return state->PartDone(conn->failure());
      AmHeader h;
      h.type = MsgType::kNotify;
      h.size = payload.size();
      h.conn = conn->id();
      h.token = shard.AddPending(Pending{state, conn.get(), 0});
      shard.Send(conn->ep(0), h, nullptr, std::move(payload), /*eager=*/true);
    };
    if (!RunOnWorker(shard, send)) state->PartDone(Status(Code::kAborted, "the ucx transport was shut down"));
  }

  bool healthy() const override {
    for (const auto& conn : conns_)
      if (conn->failed()) return false;
    return true;
  }
  bool dead() const override {
    for (const auto& conn : conns_)
      if (!conn->failed()) return false;
    return true;
  }

 private:
  std::shared_ptr<Core> core_;
  std::vector<std::shared_ptr<Conn>> conns_;
};

// ---- Transport -------------------------------------------------------------------------------

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~UcxTransport() override { core_->Shutdown(); }
  void Shutdown() override { core_->Shutdown(); }

  std::string_view name() const override { return "ucx"; }
  Capabilities caps() const override {
    Capabilities c;
    c.host_memory = true;
    c.cuda_memory = true;  // staged through host bounce buffers (staged.h)
    c.reach = Reach::kNetwork;
    c.notifications = true;
    c.cost = 10;
    return c;
  }
  TransportData Describe() const override {
    codec::Writer w;
    w.Array(static_cast<uint32_t>(core_->addresses().size()));
    for (const auto& a : core_->addresses()) w.Str(a);
    return TransportData{"ucx", w.Take()};
  }
  std::vector<std::string> Addresses() const override { return core_->addresses(); }
  Result<TransportData> Register(const std::shared_ptr<Region>& region) override {
    if (region->kind == MemoryKind::kCuda && !core_->stager().gpu())
      return Status(Code::kUnsupported, "no CUDA device to stage GPU memory through");
    return core_->Register(region);
  }
  // A peer that does not confirm in time cannot reach the region afterwards: its remote key is
  // unmapped and its messages find no region.
  Status Deregister(const Region& region) override {
    core_->Deregister(region);
    return Status::Ok();
  }
  uint64_t rejected_messages() const override { return core_->rejected(); }
  uint64_t auth_failures() const override { return core_->auth_failures(); }
  uint64_t connections_refused() const override { return core_->connections_refused(); }
  // Writes carried as active messages are refused once their connection is dropped. Native
  // RMA (RDMA verbs) is not: a cut RC link errs the peer's queue pair once its retries run out
  // (UCX_RC_TIMEOUT x UCX_RC_RETRY_COUNT), and nothing it posted lands after that.
  Status FencePeer(std::string_view key, Deadline deadline) override {
    return core_->FencePeer(std::string(key), deadline);
  }
  bool Poll() override { return core_->Poll(); }
  bool CanReach(const EngineDesc& peer) const override { return peer.FindTransport("ucx") != nullptr; }

  Result<std::shared_ptr<Endpoint>> Connect(const EngineDesc& peer) override {
    const TransportData* t = peer.FindTransport("ucx");
    if (t == nullptr) return Status(Code::kUnavailable, "peer " + peer.key + " has no ucx transport");
    FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(t->data));
    codec::ArrayReader list = reader.root();
    std::vector<std::string> addresses;
    while (!list.done()) {
      FERRY_ASSIGN_OR_RETURN(std::string_view a, list.Bytes("address", 64));
      addresses.emplace_back(a);
    }
    if (addresses.empty()) return Status(Code::kInvalidArgument, "peer " + peer.key + " advertises no address");
    bool same_host = peer.host_id == LocalHostId();
    // On this host, the loopback address if offered; elsewhere, the first non-loopback one.
    std::string address = addresses.front();
    for (const auto& a : addresses) {
      bool loopback = a.rfind("127.", 0) == 0;
      if (loopback == same_host) {
        address = a;
        break;
      }
    }
    // The lanes dealt over min(lanes, workers) connections on consecutive shards, each begun
    // with ferry's handshake at the peer's door (door.h), within ucx.connect_timeout.
    const int lanes = core_->options().lanes;
    const size_t n = std::min<size_t>(static_cast<size_t>(lanes), core_->shards());
    const size_t first = core_->NextShard();
    const Deadline deadline = Deadline::After(core_->options().connect_timeout);
    std::vector<std::shared_ptr<Conn>> conns;
    for (size_t k = 0; k < n; ++k) {
      int share = lanes / static_cast<int>(n) + (k < static_cast<size_t>(lanes) % n ? 1 : 0);
      auto conn = core_->Dial(peer, address, same_host, first + k, share, deadline);
      if (!conn.ok()) {
        for (const auto& c : conns)
          (void)c->shard().worker->Submit([c] {
            c->Close();
            c->shard().conns.erase(c);
          });
        return conn.status().WithContext("peer " + peer.key);
      }
      conns.push_back(std::move(conn).value());
    }
    return std::shared_ptr<Endpoint>(std::make_shared<UcxEndpoint>(core_, std::move(conns)));
  }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

Result<std::unique_ptr<Transport>> MakeUcxTransport(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto core, Core::Create(ctx, MakeCudaStageCopier(ctx.copy_engines)));
  return std::unique_ptr<Transport>(new UcxTransport(std::move(core)));
}

Result<std::unique_ptr<Transport>> MakeUcxTransportWithCopier(const TransportContext& ctx,
                                                              std::unique_ptr<StageCopier> copier,
                                                              Stager** stager) {
  FERRY_ASSIGN_OR_RETURN(auto core, Core::Create(ctx, std::move(copier)));
  if (stager != nullptr) *stager = &core->stager();
  return std::unique_ptr<Transport>(new UcxTransport(std::move(core)));
}

}  // namespace ferry::internal::ucx

namespace ferry::internal {
Result<std::unique_ptr<Transport>> MakeUcxTransport(const TransportContext& ctx) {
  return ucx::MakeUcxTransport(ctx);
}
}  // namespace ferry::internal
