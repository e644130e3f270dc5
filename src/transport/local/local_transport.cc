// The `local` transport: engines in one process reach each other's registered memory
// directly. A process-wide directory maps engine keys to their regions and inboxes; a process
// token in every descriptor tells whether a peer lives in this process.
#include <algorithm>
#include <random>
#include <thread>
#include <unordered_map>

#include "base/log.h"
#include "base/mutex.h"
#include "base/thread_pool.h"
#include "cuda/runtime.h"
#include "transport/cuda_op_space.h"
#include "transport/local/cuda_path.h"
#include "transport/host_copy.h"
#include "transport/transport.h"

namespace ferry::internal {
namespace {

constexpr std::string_view kName = "local";
static_assert(kMaxCopyThreads <= ThreadPool::kMaxThreads);

const std::string& ProcessToken() {
  static const std::string token = [] {
    std::random_device rd;
    std::string t = std::to_string(getpid()) + ":";
    for (int i = 0; i < 4; ++i) t += std::to_string(rd()) + ".";
    return t;
  }();
  return token;
}

// One engine of this process, as other engines of this process reach it.
struct EngineEntry {
  std::string key;
  std::weak_ptr<Inbox> inbox;
  Mutex mu;
  std::unordered_map<uint64_t, std::weak_ptr<Region>> regions GUARDED_BY(mu);
};

class Directory {
 public:
  static Directory& Get() {
    static Directory* dir = new Directory();  // never destroyed: engines may outlive statics
    return *dir;
  }
  void Add(const std::shared_ptr<EngineEntry>& entry) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    engines_[entry->key] = entry;
  }
  void Remove(const std::string& key, const EngineEntry* entry) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = engines_.find(key);
    if (it != engines_.end() && it->second.get() == entry) engines_.erase(it);
  }
  std::shared_ptr<EngineEntry> Find(const std::string& key) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = engines_.find(key);
    return it == engines_.end() ? nullptr : it->second;
  }

 private:
  Mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<EngineEntry>> engines_ GUARDED_BY(mu_);
};

struct Shared {
  std::string engine_key;
  uint64_t parallel_copy_bytes = 0;
  std::unique_ptr<ThreadPool> pool;  // null when copies stay on the posting thread
  std::unique_ptr<CudaPath> cuda;    // null without CUDA
};

class LocalChannel final : public Channel {
 public:
  LocalChannel(std::shared_ptr<Shared> shared, std::shared_ptr<Region> local,
               std::shared_ptr<Region> remote)
      : shared_(std::move(shared)), local_(std::move(local)), remote_(std::move(remote)) {}

  Status Post(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
              const std::shared_ptr<TransferState>& state) override {
    return PostFrom(op, ops, total_bytes, state, nullptr);
  }

  // GPU memory on both sides: the batch may be checked straight into a copy engine's op buffer.
  std::unique_ptr<OpSpace> ReserveOps(Op op, size_t n) override {
    return shared_->cuda ? shared_->cuda->ReserveOps(op, *local_, *remote_, n) : nullptr;
  }

  Status PostReserved(Op op, OpSpace& space, std::span<const TransferOp> ops, uint64_t total_bytes,
                      const std::shared_ptr<TransferState>& state) override {
    // Only the CUDA path's ReserveOps makes spaces for this channel.
    return PostFrom(op, ops, total_bytes, state, OpBufferOf(space));
  }

  TransferPath path() const override { return TransferPath{std::string(kName), false}; }

 private:
  Status PostFrom(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
                  const std::shared_ptr<TransferState>& state, const cuda::OpBuffer* buffer) {
    auto local_use = RegionUse::Make(local_);
    if (!local_use) return Gone(*local_, "local");
    auto remote_use = RegionUse::Make(remote_);
    if (!remote_use) return Gone(*remote_, "remote");
    bool write = op == Op::kWrite;
    if (local_->kind == MemoryKind::kCuda || remote_->kind == MemoryKind::kCuda) {
      if (!shared_->cuda) return Status(Code::kUnsupported, "no CUDA device for a CUDA region");
      state->Hold(std::move(local_use));
      state->Hold(std::move(remote_use));
      return shared_->cuda->Post(op, *local_, *remote_, ops, total_bytes, state, buffer);
    }
    if (!shared_->pool || total_bytes < shared_->parallel_copy_bytes || ops.empty()) {
      CopyInline(local_->base, remote_->base, ops, write, total_bytes);
      return Status::Ok();
    }
    state->Hold(std::move(local_use));
    state->Hold(std::move(remote_use));
    CopyParallel(shared_->pool.get(), local_->base, remote_->base, ops, total_bytes, write, state);
    return Status::Ok();
  }

  static Status Gone(const Region& r, std::string_view which) {
    return Status(Code::kFailedPrecondition,
                  std::string(which) + " region " + std::to_string(static_cast<uint64_t>(r.id)) +
                      " was deregistered");
  }
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Region> local_;
  std::shared_ptr<Region> remote_;
};

class LocalEndpoint final : public Endpoint {
 public:
  LocalEndpoint(std::shared_ptr<Shared> shared, std::shared_ptr<EngineEntry> peer)
      : shared_(std::move(shared)), peer_(std::move(peer)) {}

  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local,
                                               const MemoryDesc& remote) override {
    const TransportData* access = remote.FindAccess(kName);
    if (access == nullptr || access->data != ProcessToken())
      return Status(Code::kInvalidArgument, "remote region is not in this process");
    std::shared_ptr<Region> region;
    {
      MutexLock lock(&peer_->mu);
      auto it = peer_->regions.find(static_cast<uint64_t>(remote.region));
      if (it != peer_->regions.end()) region = it->second.lock();
    }
    if (!region || !region->live())
      return Status(Code::kFailedPrecondition, "remote region " +
                                                   std::to_string(static_cast<uint64_t>(remote.region)) +
                                                   " is not registered");
    if (reinterpret_cast<uint64_t>(region->base) != remote.address || region->size != remote.size ||
        region->kind != remote.kind)
      return Status(Code::kInvalidArgument, "remote descriptor does not match the registered region");
    // Engines of one process trust each other's code, but an access list still says which of
    // them may reach the region (it stops mistakes, as between engines without a secret).
    if (!region->Admit(kName, shared_->engine_key))
      return Status(Code::kPermissionDenied, "engine " + peer_->key + "'s access list for region " +
                                                 std::to_string(static_cast<uint64_t>(remote.region)) +
                                                 " does not name this engine");
    if (region->kind == MemoryKind::kCuda || local->kind == MemoryKind::kCuda) {
      if (!shared_->cuda) return Status(Code::kUnsupported, "no CUDA device for a CUDA region");
    }
    return std::unique_ptr<Channel>(new LocalChannel(shared_, local, std::move(region)));
  }

  Status Notify(std::string_view message) override {
    auto inbox = peer_->inbox.lock();
    if (!inbox) return Status(Code::kUnavailable, "peer engine " + peer_->key + " is gone");
    return inbox->Push(Notification{shared_->engine_key, std::string(message)});
  }

 private:
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<EngineEntry> peer_;
};

class LocalTransport final : public Transport {
 public:
  // kInvalidArgument for a thread count out of range, kResourceExhausted when a copy thread
  // cannot start.
  static Result<std::unique_ptr<Transport>> Create(const TransportContext& ctx) {
    auto shared = std::make_shared<Shared>();
    shared->engine_key = ctx.engine_key;
    shared->parallel_copy_bytes = ctx.options->parallel_copy_bytes;
    int threads = ctx.options->copy_threads;
    if (threads == 0) threads = std::clamp<int>(std::thread::hardware_concurrency(), 1, 8);
    if (threads < 0 || threads > ThreadPool::kMaxThreads)
      return Status(Code::kInvalidArgument, "copy_threads must be in 0.." + std::to_string(ThreadPool::kMaxThreads) +
                                                ", not " + std::to_string(ctx.options->copy_threads));
    if (threads > 1) {
      FERRY_ASSIGN_OR_RETURN(shared->pool, ThreadPool::Create(threads, "ferry-copy"));
    }
    auto cuda = CudaPath::Create(ctx.copy_engines);
    if (cuda.ok()) shared->cuda = std::move(cuda).value();
    return std::unique_ptr<Transport>(new LocalTransport(std::move(shared), ctx));
  }
  LocalTransport(std::shared_ptr<Shared> shared, const TransportContext& ctx) : shared_(std::move(shared)) {
    entry_ = std::make_shared<EngineEntry>();
    entry_->key = ctx.engine_key;
    entry_->inbox = ctx.inbox;
    Directory::Get().Add(entry_);
  }
  ~LocalTransport() override { Directory::Get().Remove(entry_->key, entry_.get()); }

  std::string_view name() const override { return kName; }
  Capabilities caps() const override {
    Capabilities c;
    c.host_memory = true;
    c.cuda_memory = shared_->cuda != nullptr;
    c.reach = Reach::kSameProcess;
    c.notifications = true;
    c.cost = 0;
    return c;
  }
  TransportData Describe() const override { return TransportData{std::string(kName), ProcessToken()}; }

  Result<TransportData> Register(const std::shared_ptr<Region>& region) override {
    if (region->kind == MemoryKind::kCuda && !shared_->cuda)
      return Status(Code::kUnsupported, "no CUDA device");
    MutexLock lock(&entry_->mu);
    entry_->regions[static_cast<uint64_t>(region->id)] = region;
    return TransportData{std::string(kName), ProcessToken()};
  }
  Status Deregister(const Region& region) override {
    MutexLock lock(&entry_->mu);
    entry_->regions.erase(static_cast<uint64_t>(region.id));
    return Status::Ok();
  }
  bool CanReach(const EngineDesc& peer) const override {
    const TransportData* t = peer.FindTransport(kName);
    return t != nullptr && t->data == ProcessToken();
  }
  Result<std::shared_ptr<Endpoint>> Connect(const EngineDesc& peer) override {
    if (!CanReach(peer)) return Status(Code::kUnavailable, "peer " + peer.key + " is not in this process");
    auto entry = Directory::Get().Find(peer.key);
    if (!entry) return Status(Code::kUnavailable, "peer engine " + peer.key + " is gone");
    return std::shared_ptr<Endpoint>(std::make_shared<LocalEndpoint>(shared_, std::move(entry)));
  }

 private:
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<EngineEntry> entry_;
};

}  // namespace

Result<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx) {
  return LocalTransport::Create(ctx);
}

}  // namespace ferry::internal
