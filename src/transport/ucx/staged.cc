#include "transport/ucx/staged.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>

#include "base/log.h"
#include "base/tsan.h"
#include "cuda/runtime.h"
#include "transport/ucx/core.h"
#if FERRY_HAVE_CUDA
#include "cuda/copy_engine.h"
#endif
#include "transport/ucx/staged.h"

namespace ferry::internal::ucx {

// ---- Piece tables ----------------------------------------------------------------------------

namespace {
void Put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void Put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint32_t Get32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t Get64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
}  // namespace

std::vector<StageChunk> PlanChunks(std::span<const TransferOp> ops, uint64_t chunk_bytes, size_t max_pieces) {
  std::vector<StageChunk> chunks;
  StageChunk cur;
  for (const TransferOp& o : ops) {
    for (uint64_t done = 0; done < o.size;) {
      if (cur.bytes == chunk_bytes || cur.remote.size() == max_pieces) {
        chunks.push_back(std::move(cur));
        cur = StageChunk();
      }
      const uint64_t n = std::min(o.size - done, chunk_bytes - cur.bytes);
      cur.remote.push_back({o.remote_offset + done, n});
      cur.local_offsets.push_back(o.local_offset + done);
      cur.bytes += n;
      done += n;
    }
  }
  if (!cur.remote.empty()) chunks.push_back(std::move(cur));
  return chunks;
}

void WritePieceTable(std::span<const StagedPiece> pieces, std::byte* out) {
  Put32(out, static_cast<uint32_t>(pieces.size()));
  for (size_t i = 0; i < pieces.size(); ++i) {
    Put64(out + 4 + 16 * i, pieces[i].offset);
    Put64(out + 12 + 16 * i, pieces[i].size);
  }
}

Result<std::vector<StagedPiece>> ReadPieceTable(const std::byte* bytes, size_t length, uint64_t region_size,
                                                size_t* table_bytes, uint64_t* total) {
  if (length < 4) return Status(Code::kInvalidArgument, "staged piece table is truncated");
  const uint32_t count = Get32(bytes);
  if (count == 0 || count > kStageMaxPieces)
    return Status(Code::kInvalidArgument, "staged piece table of " + std::to_string(count) + " pieces");
  if (PieceTableBytes(count) > length) return Status(Code::kInvalidArgument, "staged piece table is truncated");
  std::vector<StagedPiece> pieces(count);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < count; ++i) {
    pieces[i].offset = Get64(bytes + 4 + 16 * i);
    pieces[i].size = Get64(bytes + 12 + 16 * i);
    if (!InBounds(pieces[i].offset, pieces[i].size, region_size))
      return Status(Code::kOutOfRange, "staged piece outside the target region");
    sum += pieces[i].size;  // each <= region_size, count <= 4096: no overflow for sane sizes
    if (sum > kStageChunkBytes) return Status(Code::kInvalidArgument, "staged chunk larger than a bounce buffer");
  }
  *table_bytes = PieceTableBytes(count);
  *total = sum;
  return pieces;
}

// ---- Bounce buffers --------------------------------------------------------------------------

namespace {

constexpr size_t kBounceBytes = ((kStageChunkBytes + (4 + 16 * kStageMaxPieces)) + 4095) / 4096 * 4096;

// Runs work on a shard's progress thread while the transport lives.
struct Dispatcher {
  std::mutex mu;
  Core* core = nullptr;  // GUARDED_BY(mu); null once the transport is gone
  bool Run(size_t shard, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu);
    return core != nullptr && core->shard(shard).worker->Submit(std::move(fn));
  }
};

class BouncePool;

// A bounce buffer in use; back to its pool when the last holder lets go.
struct Bounce {
  Bounce(std::weak_ptr<BouncePool> pool, std::byte* data, bool pinned) : pool(std::move(pool)), data(data), pinned(pinned) {}
  Bounce(const Bounce&) = delete;
  ~Bounce();
  std::weak_ptr<BouncePool> pool;
  std::byte* const data;
  const bool pinned;  // page-locked and mapped: GPU kernels reach it
};

void FreeBuffer(std::byte* data, bool pinned) {
  if (pinned) (void)cuda::HostUnregister(data);
  std::free(data);
}

class BouncePool : public std::enable_shared_from_this<BouncePool> {
 public:
  BouncePool(std::shared_ptr<Dispatcher> dispatch, bool pin) : dispatch_(std::move(dispatch)), pin_(pin) {}
  ~BouncePool() {
    for (auto& [data, pinned] : free_) FreeBuffer(data, pinned);
  }
  // A buffer, or null when all kStageBuffers are in use; then `retry` runs on the progress
  // thread of `shard` once one comes back (registered under the same lock as the check, so that a
  // buffer returned meanwhile on another thread is not missed).
  std::shared_ptr<Bounce> AcquireOrWait(size_t shard, std::function<void()> retry) {
    std::lock_guard<std::mutex> lock(mu_);
    auto b = TryAcquireLocked();
    if (!b && retry) waiters_.emplace_back(shard, std::move(retry));
    return b;
  }
  std::shared_ptr<Bounce> TryAcquire() {
    std::lock_guard<std::mutex> lock(mu_);
    return TryAcquireLocked();
  }
  // REQUIRES: mu_ held.
  std::shared_ptr<Bounce> TryAcquireLocked() {
    if (!free_.empty()) {
      auto [data, pinned] = free_.back();
      free_.pop_back();
      return std::make_shared<Bounce>(weak_from_this(), data, pinned);
    }
    if (allocated_ >= kStageBuffers) return nullptr;
    auto* data = static_cast<std::byte*>(std::aligned_alloc(4096, kBounceBytes));
    if (data == nullptr) return nullptr;
    const bool pinned = pin_ && cuda::HostRegister(data, kBounceBytes).ok();
    ++allocated_;
    return std::make_shared<Bounce>(weak_from_this(), data, pinned);
  }
  void Return(std::byte* data, bool pinned) {
    std::pair<size_t, std::function<void()>> next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.emplace_back(data, pinned);
      if (!waiters_.empty()) {
        next = std::move(waiters_.front());
        waiters_.pop_front();
      }
    }
    if (next.second) (void)dispatch_->Run(next.first, std::move(next.second));
  }
  void DropWaiters() {
    std::deque<std::pair<size_t, std::function<void()>>> w;
    std::lock_guard<std::mutex> lock(mu_);
    w.swap(waiters_);
  }
  size_t free() {
    std::lock_guard<std::mutex> lock(mu_);
    return free_.size();
  }
  size_t allocated() {
    std::lock_guard<std::mutex> lock(mu_);
    return allocated_;
  }

 private:
  std::shared_ptr<Dispatcher> dispatch_;
  const bool pin_;
  std::mutex mu_;
  std::vector<std::pair<std::byte*, bool>> free_;  // GUARDED_BY(mu_)
  std::deque<std::pair<size_t, std::function<void()>>> waiters_;  // GUARDED_BY(mu_): shard, retry
  size_t allocated_ = 0;                           // GUARDED_BY(mu_)
};

Bounce::~Bounce() {
  if (auto p = pool.lock()) p->Return(data, pinned);
  else FreeBuffer(data, pinned);
}

// A buffer for one message: from the pool, or (pool exhausted, or a target of host memory)
// plain heap memory that only the DMA engines reach.
std::shared_ptr<Bounce> AnyBuffer(BouncePool* pool) {
  if (pool != nullptr) {
    if (auto b = pool->TryAcquire()) return b;
  }
  auto* data = static_cast<std::byte*>(std::aligned_alloc(4096, kBounceBytes));
  if (data == nullptr) return nullptr;
  return std::make_shared<Bounce>(std::weak_ptr<BouncePool>(), data, false);
}

}  // namespace

// ---- GPU copies ------------------------------------------------------------------------------

namespace {
#if FERRY_HAVE_CUDA
class CudaStageCopier final : public StageCopier {
 public:
  CudaStageCopier() : engines_(cuda::Available() ? cuda::DeviceCount() : 0) {}
  bool gpu() const override { return !engines_.empty(); }
  Status Copy(int device, std::span<const StageCopy> copies, bool pinned,
              std::function<void(const Status&)> done) override {
    cuda::CopyEngine* engine = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (device < 0 || device >= static_cast<int>(engines_.size()))
        return Status(Code::kInvalidArgument, "no CUDA device " + std::to_string(device));
      auto& slot = engines_[device];
      if (!slot) {
        FERRY_ASSIGN_OR_RETURN(slot, cuda::CopyEngine::Create(device));
      }
      engine = slot.get();
    }
    std::vector<cuda::Copy> c;
    c.reserve(copies.size());
    for (const StageCopy& g : copies) c.push_back(cuda::Copy{g.dst, g.src, g.size});
    cuda::PostOptions options;
    options.kernel_ok = pinned;  // device memory and a mapped page-locked bounce buffer
    options.pageable = !pinned;
    options.on_done = std::move(done);
    auto posted = engine->Post(c, std::move(options));
    return posted.ok() ? Status::Ok() : posted.status();
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<cuda::CopyEngine>> engines_;  // GUARDED_BY(mu_); by ordinal
};
#endif

class NoStageCopier final : public StageCopier {
 public:
  bool gpu() const override { return false; }
  Status Copy(int, std::span<const StageCopy>, bool, std::function<void(const Status&)>) override {
    return Status(Code::kUnsupported, "no CUDA device to stage GPU memory through");
  }
};
}  // namespace

std::unique_ptr<StageCopier> MakeCudaStageCopier() {
#if FERRY_HAVE_CUDA
  if (cuda::Available()) return std::make_unique<CudaStageCopier>();
#endif
  return std::make_unique<NoStageCopier>();
}

using GpuCopy = StageCopy;

struct Stager::Impl : std::enable_shared_from_this<Stager::Impl> {
  Core* core = nullptr;
  std::shared_ptr<Dispatcher> dispatch = std::make_shared<Dispatcher>();
  std::shared_ptr<BouncePool> send_pool, recv_pool;
  std::unique_ptr<StageCopier> copier;  // progress thread (and ~Stager, once it stopped)
  bool has_gpu = false;

  bool gpu() const { return has_gpu; }

  Status Copy(int device, const std::vector<GpuCopy>& copies, bool pinned, std::function<void(const Status&)> done) {
    if (!copier) return Status(Code::kAborted, "the ucx transport was shut down");
    return copier->Copy(device, copies, pinned, std::move(done));
  }

  // Progress thread of `s`, which received the request on `reply` (one of its accepted
  // endpoints, unless the peer closed it meanwhile).
  void SendAckIfOpen(Shard& s, ucp_ep_h reply, uint64_t token, Code code) {
    if (s.accepted.count(reply) != 0) s.SendAck(reply, token, code);
  }

  // Target side, progress thread of `s`: scatters a received chunk (in `buf`, `length` bytes)
  // into `region`, then acks.
  void Scatter(Shard& s, const std::shared_ptr<RegionUse>& hold, std::shared_ptr<Bounce> buf, size_t length,
               ucp_ep_h reply, uint64_t token);
  // Target side, progress thread of `s`: gathers `pieces` of `region` and answers `token` with them.
  void Gather(Shard& s, const std::shared_ptr<RegionUse>& hold, std::vector<StagedPiece> pieces, uint64_t total,
              ucp_ep_h reply, uint64_t token);
};

// ---- Initiator: writes -----------------------------------------------------------------------

namespace {

struct WriteJob : std::enable_shared_from_this<WriteJob> {
  std::shared_ptr<Stager::Impl> stager;
  std::shared_ptr<Conn> conn;
  std::shared_ptr<Region> local;
  uint64_t remote_region = 0;
  std::vector<StageChunk> chunks;
  size_t next = 0;
  std::shared_ptr<TransferState> state;

  void FailRest(const Status& why) {
    for (; next < chunks.size(); ++next) state->PartDone(why);
  }

  // Progress thread: stages chunks while bounce buffers are free.
  void Pump() {
    while (next < chunks.size()) {
      if (conn->failed()) return FailRest(conn->failure());
      if (state->finished()) return FailRest(Status(Code::kAborted, "transfer ended"));
      auto buf = stager->send_pool->AcquireOrWait(conn->shard().index, [self = shared_from_this()] { self->Pump(); });
      if (!buf) return;  // Pump runs again when a buffer comes back
      Stage(next++, std::move(buf));
    }
  }

  void Stage(size_t i, std::shared_ptr<Bounce> buf) {
    const StageChunk& c = chunks[i];
    WritePieceTable(c.remote, buf->data);
    std::byte* at = buf->data + PieceTableBytes(c.remote.size());
    if (local->kind == MemoryKind::kHost) {
      for (size_t k = 0; k < c.remote.size(); ++k) {
        std::memcpy(at, local->base + c.local_offsets[k], c.remote[k].size);
        at += c.remote[k].size;
      }
      return Send(i, std::move(buf));
    }
    std::vector<GpuCopy> copies;
    copies.reserve(c.remote.size());
    for (size_t k = 0; k < c.remote.size(); ++k) {
      copies.push_back({at, local->base + c.local_offsets[k], c.remote[k].size});
      at += c.remote[k].size;
    }
    auto self = shared_from_this();
    Status s = stager->Copy(local->device, copies, buf->pinned, [self, i, buf](const Status& st) {
      // On the copy engine's thread: hand the chunk to the progress thread to send.
      auto send = [self, i, buf, st] {
        if (!st.ok()) return self->state->PartDone(st);
        self->Send(i, buf);
      };
      if (!self->stager->dispatch->Run(self->conn->shard().index, send)) self->state->PartDone(Status(Code::kAborted, "the ucx transport was shut down"));
    });
    if (!s.ok()) state->PartDone(s);
  }

  void Send(size_t i, std::shared_ptr<Bounce> buf) {
    if (conn->failed()) return state->PartDone(conn->failure());
    const StageChunk& c = chunks[i];
    AmHeader h;
    h.type = MsgType::kStagedWrite;
    h.token = conn->shard().AddPending(Pending{state, conn.get(), nullptr});
    h.region = remote_region;
    h.size = PieceTableBytes(c.remote.size()) + c.bytes;
    // The buffer goes back to the pool once UCX has sent it.
    conn->shard().Send(conn->ep(i), h, buf->data, {}, /*eager=*/false, buf);
  }
};

struct ReadJob : std::enable_shared_from_this<ReadJob> {
  std::shared_ptr<Stager::Impl> stager;
  std::shared_ptr<Conn> conn;
  std::shared_ptr<Region> local;
  uint64_t remote_region = 0;
  std::vector<StageChunk> chunks;
  size_t next = 0;
  std::shared_ptr<TransferState> state;

  void FailRest(const Status& why) {
    for (; next < chunks.size(); ++next) state->PartDone(why);
  }

  void Pump() {
    while (next < chunks.size()) {
      if (conn->failed()) return FailRest(conn->failure());
      if (state->finished()) return FailRest(Status(Code::kAborted, "transfer ended"));
      auto buf = stager->recv_pool->AcquireOrWait(conn->shard().index, [self = shared_from_this()] { self->Pump(); });
      if (!buf) return;  // Pump runs again when a buffer comes back
      Request(next++, std::move(buf));
    }
  }

  void Request(size_t i, std::shared_ptr<Bounce> buf) {
    const StageChunk& c = chunks[i];
    std::string table(PieceTableBytes(c.remote.size()), '\0');
    WritePieceTable(c.remote, reinterpret_cast<std::byte*>(table.data()));
    Pending p{state, conn.get(), nullptr, buf->data, c.bytes};
    p.on_data = [self = shared_from_this(), i, buf](Status s) { self->Landed(i, buf, std::move(s)); };
    AmHeader h;
    h.type = MsgType::kStagedReadReq;
    h.token = conn->shard().AddPending(std::move(p));
    h.region = remote_region;
    h.offset = c.bytes;
    h.size = table.size();
    conn->shard().Send(conn->ep(i), h, nullptr, std::move(table), /*eager=*/true);
  }

  // Progress thread: chunk `i` arrived in `buf`; scatter it into the local region.
  void Landed(size_t i, const std::shared_ptr<Bounce>& buf, Status s) {
    if (!s.ok()) return state->PartDone(s);
    const StageChunk& c = chunks[i];
    const std::byte* at = buf->data;
    if (local->kind == MemoryKind::kHost) {
      for (size_t k = 0; k < c.remote.size(); ++k) {
        std::memcpy(local->base + c.local_offsets[k], at, c.remote[k].size);
        at += c.remote[k].size;
      }
      return state->PartDone(Status::Ok());
    }
    std::vector<GpuCopy> copies;
    copies.reserve(c.remote.size());
    for (size_t k = 0; k < c.remote.size(); ++k) {
      copies.push_back({local->base + c.local_offsets[k], at, c.remote[k].size});
      at += c.remote[k].size;
    }
    auto st = state;
    Status posted = stager->Copy(local->device, copies, buf->pinned, [st, buf](const Status& done) { st->PartDone(done); });
    if (!posted.ok()) state->PartDone(posted);
  }
};

}  // namespace

// ---- Stager ----------------------------------------------------------------------------------

Stager::Stager(Core* core, std::unique_ptr<StageCopier> copier) : impl_(std::make_shared<Impl>()) {
  impl_->core = core;
  impl_->dispatch->core = core;
  impl_->copier = copier ? std::move(copier) : MakeCudaStageCopier();
  impl_->has_gpu = impl_->copier->gpu();
  const bool pin = cuda::Available();
  impl_->send_pool = std::make_shared<BouncePool>(impl_->dispatch, pin);
  impl_->recv_pool = std::make_shared<BouncePool>(impl_->dispatch, pin);
}

Stager::~Stager() {
  {
    std::lock_guard<std::mutex> lock(impl_->dispatch->mu);
    impl_->dispatch->core = nullptr;  // callbacks from now on fail their parts with kAborted
  }
  impl_->send_pool->DropWaiters();
  impl_->recv_pool->DropWaiters();
  impl_->copier.reset();  // waits for copies in flight (the progress thread has stopped)
}

bool Stager::gpu() const { return impl_->gpu(); }
size_t Stager::free_buffers() const { return impl_->send_pool->free() + impl_->recv_pool->free(); }
size_t Stager::allocated_buffers() const { return impl_->send_pool->allocated() + impl_->recv_pool->allocated(); }

void Stager::PostWrite(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Region>& local,
                       const MemoryDesc& remote, std::span<const TransferOp> ops,
                       const std::shared_ptr<TransferState>& state) {
  auto job = std::make_shared<WriteJob>();
  job->stager = impl_;
  job->conn = conn;
  job->local = local;
  job->remote_region = static_cast<uint64_t>(remote.region);
  job->chunks = PlanChunks(ops, kStageChunkBytes, kStageMaxPieces);
  job->state = state;
  state->AddParts(static_cast<int>(job->chunks.size()));
  job->Pump();
}

void Stager::PostRead(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Region>& local,
                      const MemoryDesc& remote, std::span<const TransferOp> ops,
                      const std::shared_ptr<TransferState>& state) {
  auto job = std::make_shared<ReadJob>();
  job->stager = impl_;
  job->conn = conn;
  job->local = local;
  job->remote_region = static_cast<uint64_t>(remote.region);
  job->chunks = PlanChunks(ops, kStageChunkBytes, kStageMaxPieces);
  job->state = state;
  state->AddParts(static_cast<int>(job->chunks.size()));
  job->Pump();
}

// ---- Target ----------------------------------------------------------------------------------

namespace {
struct StagedRecv {
  std::shared_ptr<Stager::Impl> stager;
  Shard* shard;
  std::shared_ptr<RegionUse> hold;
  std::shared_ptr<Bounce> buf;
  size_t length;
  ucp_ep_h reply;
  uint64_t token;
};

void OnStagedRecv(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* ctx = static_cast<StagedRecv*>(user_data);
  FERRY_TSAN_WIRE_ACQUIRE();
  if (status != UCS_OK) ctx->stager->SendAckIfOpen(*ctx->shard, ctx->reply, ctx->token, FromUcs(status, "receive").code());
  else ctx->stager->Scatter(*ctx->shard, ctx->hold, ctx->buf, ctx->length, ctx->reply, ctx->token);
  delete ctx;
  ucp_request_free(request);
}
}  // namespace

void Stager::HandleWrite(Shard& s, const AmHeader& h, void* data, size_t length, const ucp_am_recv_param_t* param,
                         bool* keep) {
  Core& core = *impl_->core;
  ucp_ep_h reply = param->reply_ep;
  auto region = core.FindRegion(h.region);
  auto hold = region ? RegionUse::Make(region) : nullptr;
  if (!hold) {
    core.Reject("staged write to an unknown region");
    return s.SendAck(reply, h.token, Code::kFailedPrecondition);
  }
  if (length > kBounceBytes) {
    core.Reject("staged chunk larger than a bounce buffer");
    return s.SendAck(reply, h.token, Code::kInvalidArgument);
  }
  if (region->kind == MemoryKind::kCuda && !impl_->gpu()) return s.SendAck(reply, h.token, Code::kUnsupported);
  auto buf = AnyBuffer(region->kind == MemoryKind::kCuda ? impl_->recv_pool.get() : nullptr);
  if (!buf) return s.SendAck(reply, h.token, Code::kResourceExhausted);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    std::memcpy(buf->data, data, length);
    return impl_->Scatter(s, hold, std::move(buf), length, reply, h.token);
  }
  auto* ctx = new StagedRecv{impl_, &s, hold, buf, length, reply, h.token};
  ucp_request_param_t p = {};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &OnStagedRecv;
  p.user_data = ctx;
  void* req = ucp_am_recv_data_nbx(s.worker->handle(), data, buf->data, length, &p);
  *keep = true;
  if (UCS_PTR_IS_ERR(req)) {
    impl_->SendAckIfOpen(s, reply, h.token, FromUcs(UCS_PTR_STATUS(req), "ucp_am_recv_data_nbx").code());
    delete ctx;
  } else if (req == nullptr) {
    impl_->Scatter(s, hold, buf, length, reply, h.token);
    delete ctx;
  }
}

void Stager::Impl::Scatter(Shard& s, const std::shared_ptr<RegionUse>& hold, std::shared_ptr<Bounce> buf,
                           size_t length, ucp_ep_h reply, uint64_t token) {
  Region& region = hold->region();
  size_t table = 0;
  uint64_t total = 0;
  auto pieces = ReadPieceTable(buf->data, length, region.size, &table, &total);
  if (pieces.ok() && table + total != length)
    pieces = Status(Code::kInvalidArgument, "staged chunk size does not match its piece table");
  if (!pieces.ok()) {
    core->Reject(std::string(pieces.status().message()).c_str());
    return SendAckIfOpen(s, reply, token, pieces.status().code());
  }
  const std::byte* at = buf->data + table;
  if (region.kind == MemoryKind::kHost) {
    for (const StagedPiece& p : *pieces) {
      std::memcpy(region.base + p.offset, at, p.size);
      at += p.size;
    }
    return SendAckIfOpen(s, reply, token, Code::kOk);
  }
  std::vector<GpuCopy> copies;
  copies.reserve(pieces->size());
  for (const StagedPiece& p : *pieces) {
    copies.push_back({region.base + p.offset, at, p.size});
    at += p.size;
  }
  // The ack leaves once the bytes are in GPU memory.
  auto self = shared_from_this();
  const size_t shard = s.index;
  Status posted = Copy(region.device, copies, buf->pinned, [self, hold, buf, reply, token, shard](const Status& st) {
    (void)self->dispatch->Run(shard, [self, reply, token, shard, code = st.code()] {
      self->SendAckIfOpen(self->core->shard(shard), reply, token, code);
    });
  });
  if (!posted.ok()) SendAckIfOpen(s, reply, token, posted.code());
}

void Stager::HandleReadReq(Shard& s, const AmHeader& h, const void* data, size_t length,
                           const ucp_am_recv_param_t* param) {
  Core& core = *impl_->core;
  ucp_ep_h reply = param->reply_ep;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    core.Reject("staged read request sent by rendezvous");
    return s.SendAck(reply, h.token, Code::kInvalidArgument);
  }
  auto region = core.FindRegion(h.region);
  auto hold = region ? RegionUse::Make(region) : nullptr;
  if (!hold) {
    core.Reject("staged read of an unknown region");
    return s.SendAck(reply, h.token, Code::kFailedPrecondition);
  }
  size_t table = 0;
  uint64_t total = 0;
  auto pieces = ReadPieceTable(static_cast<const std::byte*>(data), length, region->size, &table, &total);
  if (pieces.ok() && (table != length || total != h.offset))
    pieces = Status(Code::kInvalidArgument, "staged read request does not match its piece table");
  if (!pieces.ok()) {
    core.Reject(std::string(pieces.status().message()).c_str());
    return s.SendAck(reply, h.token, pieces.status().code());
  }
  if (region->kind == MemoryKind::kCuda && !impl_->gpu()) return s.SendAck(reply, h.token, Code::kUnsupported);
  impl_->Gather(s, hold, std::move(pieces).value(), total, reply, h.token);
}

void Stager::Impl::Gather(Shard& s, const std::shared_ptr<RegionUse>& hold, std::vector<StagedPiece> pieces,
                          uint64_t total, ucp_ep_h reply, uint64_t token) {
  Region& region = hold->region();
  AmHeader resp;
  resp.type = MsgType::kReadResp;
  resp.token = token;
  resp.size = total;
  if (region.kind == MemoryKind::kHost) {
    std::string payload;
    payload.reserve(total);
    for (const StagedPiece& p : pieces) payload.append(reinterpret_cast<const char*>(region.base + p.offset), p.size);
    return s.Send(reply, resp, nullptr, std::move(payload));
  }
  auto buf = AnyBuffer(send_pool.get());
  if (!buf) return SendAckIfOpen(s, reply, token, Code::kResourceExhausted);
  std::vector<GpuCopy> copies;
  copies.reserve(pieces.size());
  std::byte* at = buf->data;
  for (const StagedPiece& p : pieces) {
    copies.push_back({at, region.base + p.offset, p.size});
    at += p.size;
  }
  auto self = shared_from_this();
  const size_t shard = s.index;
  Status posted = Copy(region.device, copies, buf->pinned, [self, hold, buf, reply, token, resp, shard](const Status& st) {
    (void)self->dispatch->Run(shard, [self, buf, reply, token, resp, st, shard] {
      Shard& sh = self->core->shard(shard);
      if (!st.ok()) return self->SendAckIfOpen(sh, reply, token, st.code());
      if (sh.accepted.count(reply) != 0) sh.Send(reply, resp, buf->data, {}, false, buf);
    });
  });
  if (!posted.ok()) SendAckIfOpen(s, reply, token, posted.code());
}

}  // namespace ferry::internal::ucx
