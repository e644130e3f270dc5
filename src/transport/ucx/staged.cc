#include "transport/ucx/staged.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>

#include "base/log.h"
#include "base/tsan.h"
#include "cuda/runtime.h"
#include "transport/ucx/core.h"
#include "transport/ucx/staged_internal.h"
#if FERRY_HAVE_CUDA
#include "cuda/copy_engine.h"
#endif

namespace ferry::internal::ucx {

// ---- Chunks ----------------------------------------------------------------------------

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

// Bounce buffers and Stager::Impl: staged_internal.h. The target side: staged_target.cc.

// ---- GPU copies ------------------------------------------------------------------------------

namespace {
#if FERRY_HAVE_CUDA
class CudaStageCopier final : public StageCopier {
 public:
  explicit CudaStageCopier(std::shared_ptr<cuda::CopyEngines> engines) : engines_(std::move(engines)) {}
  bool gpu() const override { return engines_->devices() > 0; }
  Status Copy(int device, std::span<const StageCopy> copies, bool pinned,
              std::function<void(const Status&)> done) override {
    FERRY_ASSIGN_OR_RETURN(cuda::CopyEngine * engine, engines_->For(device));
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
  const std::shared_ptr<cuda::CopyEngines> engines_;
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

std::unique_ptr<StageCopier> MakeCudaStageCopier(std::shared_ptr<cuda::CopyEngines> engines) {
#if FERRY_HAVE_CUDA
  if (cuda::Available())
    return std::make_unique<CudaStageCopier>(engines ? std::move(engines) : std::make_shared<cuda::CopyEngines>());
#endif
  return std::make_unique<NoStageCopier>();
}

// ---- Initiator: writes -----------------------------------------------------------------------

namespace {

// What a staged write and a staged read share: the batch cut into chunks, each started as soon
// as a bounce buffer of its pool is free. Job provides Pool() and Start(i, buf).
template <typename Job>
struct ChunkJob : std::enable_shared_from_this<Job> {
  std::shared_ptr<Stager::Impl> stager;
  std::shared_ptr<Conn> conn;
  std::shared_ptr<Region> local;
  uint64_t remote_region = 0;
  uint64_t remote_key = 0;
  std::vector<StageChunk> chunks;
  size_t next = 0;
  std::shared_ptr<TransferState> state;

  static std::shared_ptr<Job> Make(std::shared_ptr<Stager::Impl> stager, const std::shared_ptr<Conn>& conn,
                                   const std::shared_ptr<Region>& local, const MemoryDesc& remote,
                                   std::span<const TransferOp> ops, const std::shared_ptr<TransferState>& state) {
    auto job = std::make_shared<Job>();
    job->stager = std::move(stager);
    job->conn = conn;
    job->local = local;
    job->remote_region = static_cast<uint64_t>(remote.region);
    auto key = AccessKey(remote);  // checked when the channel opened
    job->remote_key = key.ok() ? *key : 0;
    job->chunks = PlanChunks(ops, kStageChunkBytes, kStageMaxPieces);
    job->state = state;
    state->AddParts(static_cast<int>(job->chunks.size()));
    return job;
  }

  void FailRest(const Status& why) {
    for (; next < chunks.size(); ++next) state->PartDone(why);
  }

  // Progress thread: starts chunks while bounce buffers are free.
  void Pump() {
    auto& job = static_cast<Job&>(*this);
    while (next < chunks.size()) {
      if (conn->failed()) return FailRest(conn->failure());
      if (state->finished()) return FailRest(Status(Code::kAborted, "transfer ended"));
      auto buf = job.Pool().AcquireOrWait(conn->shard().index, [self = this->shared_from_this()] { self->Pump(); });
      if (!buf) return;  // Pump runs again when a buffer comes back
      job.Start(next++, std::move(buf));
    }
  }
};

struct WriteJob : ChunkJob<WriteJob> {
  BouncePool& Pool() { return *stager->send_pool; }

  // Copies chunk i's pieces into `buf` (on the GPU's copy engine for GPU memory), then sends it.
  void Start(size_t i, std::shared_ptr<Bounce> buf) {
    const StageChunk& c = chunks[i];
    EncodePieceTable(c.remote, buf->data);
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
    h.token = conn->shard().AddPending(Pending{state, conn.get(), 0});
    h.region = remote_region;
    h.key = remote_key;
    h.conn = conn->id();
    h.lane = static_cast<uint8_t>(i % conn->lanes());
    h.size = PieceTableBytes(c.remote.size()) + c.bytes;
    // The buffer goes back to the pool once UCX has sent it.
    conn->shard().Send(conn->ep(i), h, buf->data, {}, /*eager=*/false, buf);
  }
};

struct ReadJob : ChunkJob<ReadJob> {
  BouncePool& Pool() { return *stager->recv_pool; }

  // Asks the target for chunk i, to land in `buf`.
  void Start(size_t i, std::shared_ptr<Bounce> buf) {
    const StageChunk& c = chunks[i];
    std::string table = EncodeStagedReadReq(c.remote);
    Pending p{state, conn.get(), 0, buf->data, c.bytes};
    p.on_data = [self = shared_from_this(), i, buf](Status s) { self->Landed(i, buf, std::move(s)); };
    AmHeader h;
    h.type = MsgType::kStagedReadReq;
    h.token = conn->shard().AddPending(std::move(p));
    h.region = remote_region;
    h.key = remote_key;
    h.conn = conn->id();
    h.lane = static_cast<uint8_t>(i % conn->lanes());
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
  impl_->dispatch->Attach(core);
  impl_->copier = copier ? std::move(copier) : MakeCudaStageCopier(nullptr);
  impl_->has_gpu = impl_->copier->gpu();
  const bool pin = cuda::Available();
  impl_->send_pool = std::make_shared<BouncePool>(impl_->dispatch, pin);
  impl_->recv_pool = std::make_shared<BouncePool>(impl_->dispatch, pin);
}

Stager::~Stager() {
  impl_->dispatch->Detach();  // callbacks from now on fail their parts with kAborted
  impl_->send_pool->DropWaiters();
  impl_->recv_pool->DropWaiters();
  impl_->copier.reset();  // copies in flight finish on the engine's copy engines
}

bool Stager::gpu() const { return impl_->gpu(); }
size_t Stager::free_buffers() const { return impl_->send_pool->free() + impl_->recv_pool->free(); }
size_t Stager::allocated_buffers() const { return impl_->send_pool->allocated() + impl_->recv_pool->allocated(); }
size_t Stager::heap_buffer_bytes() const { return impl_->heap->used(); }
void Stager::SetHeapBufferLimitForTest(size_t bytes) { impl_->heap->set_limit(bytes); }

void Stager::PostWrite(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Region>& local,
                       const MemoryDesc& remote, std::span<const TransferOp> ops,
                       const std::shared_ptr<TransferState>& state) {
  WriteJob::Make(impl_, conn, local, remote, ops, state)->Pump();
}

void Stager::PostRead(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Region>& local,
                      const MemoryDesc& remote, std::span<const TransferOp> ops,
                      const std::shared_ptr<TransferState>& state) {
  ReadJob::Make(impl_, conn, local, remote, ops, state)->Pump();
}


}  // namespace ferry::internal::ucx
