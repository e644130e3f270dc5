#include "transport/cuda_ipc/transport.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include "base/log.h"
#include "base/mutex.h"
#include "base/os.h"
#include "transport/cuda_op_space.h"
#include "transport/cuda_ipc/ipc_desc.h"
#include "transport/cuda_ipc/lease_table.h"

namespace ferry::internal::cuda_ipc {

const std::string& ProcessToken() {
  static const std::string token = [] {
    std::random_device rd;
    char buf[64];
    snprintf(buf, sizeof(buf), "%d:%08x%08x", static_cast<int>(getpid()), rd(), rd());
    return std::string(buf);
  }();
  return token;
}

namespace {

// The state every endpoint and channel of one transport shares.
struct Shared {
  std::string engine_key;
  cuda::IpcApi* api = nullptr;
  std::unique_ptr<Copier> copier;
  std::string token;
  std::shared_ptr<LeaseTable> table;  // this engine's, for the regions it exports
  Duration retire_wait{};
};

// A peer's allocation mapped into this process; unmapped when the last holder lets go (the
// peer's cache, channels, and batches still copying).
// (Types with side-effecting destructors have constructors, so they are built in place.)
struct Mapping {
  // vmm_size: 0 for an IPC handle's mapping, else the size of a VMM mapping.
  Mapping(cuda::IpcApi* a, void* b, uint64_t vmm = 0) : api(a), base(b), vmm_size(vmm) {}
  Mapping(const Mapping&) = delete;
  cuda::IpcApi* const api;
  void* const base;
  const uint64_t vmm_size;
  ~Mapping() {
    Status s = vmm_size != 0 ? api->CloseVmm(base, vmm_size) : api->CloseHandle(base);
    if (!s.ok()) FERRY_LOG_WARN("cuda_ipc: closing a peer's allocation: {}", s.ToString());
  }
};

// The pid at the front of a process token ("<pid>:<random>"), or 0.
uint32_t TokenPid(std::string_view token) {
  uint64_t pid = 0;
  size_t i = 0;
  for (; i < token.size() && token[i] >= '0' && token[i] <= '9' && pid <= INT32_MAX; ++i) pid = pid * 10 + (token[i] - '0');
  return i > 0 && i < token.size() && token[i] == ':' && pid <= INT32_MAX ? static_cast<uint32_t>(pid) : 0;
}

// This process's row in a peer's lease table; given back when nothing uses it any more.
struct Row {
  Row(std::shared_ptr<LeaseTable> t, uint32_t i) : table(std::move(t)), index(i) {}
  Row(const Row&) = delete;
  const std::shared_ptr<LeaseTable> table;
  const uint32_t index;
  ~Row() { table->ReleaseRow(index); }
};

// A lease on a peer's region slot, held by a batch until its copies are complete.
struct Lease {
  Lease(std::shared_ptr<Row> r, uint32_t s) : row(std::move(r)), slot(s) {}
  Lease(const Lease&) = delete;
  const std::shared_ptr<Row> row;
  const uint32_t slot;
  ~Lease() { row->table->Release(row->index, slot); }
};

// One peer engine as this engine reaches it: its lease table and the allocations mapped.
struct Peer {
  std::shared_ptr<Shared> shared;
  std::string key;
  EngineAccess access;
  std::shared_ptr<LeaseTable> table;
  std::shared_ptr<Row> row;

  struct Entry {
    std::shared_ptr<Mapping> mapping;
    bool kernel_ok = false;
    bool same_device = false;  // the allocation is the mapping device's own memory
    std::vector<std::pair<uint32_t, uint64_t>> regions;  // (slot, region) reached through it
  };
  Mutex mu;
  std::map<std::pair<std::string, int>, Entry> mappings GUARDED_BY(mu);  // by (handle, device)

  // Drops the mappings whose regions were all revoked (they unmap once batches finish).
  void SweepLocked() REQUIRES(mu) {
    for (auto it = mappings.begin(); it != mappings.end();) {
      auto& regions = it->second.regions;
      regions.erase(std::remove_if(regions.begin(), regions.end(),
                                   [&](const auto& r) { return !table->Live(r.first, r.second); }),
                    regions.end());
      it = regions.empty() ? mappings.erase(it) : std::next(it);
    }
  }
  void Sweep() EXCLUDES(mu) {
    MutexLock lock(&mu);
    SweepLocked();
  }

  // The mapping of `a`'s allocation on `device`, opened on first use.
  struct Mapped {
    std::shared_ptr<Mapping> mapping;
    bool kernel_ok;
    bool same_device;
  };
  Result<Mapped> Map(const RegionAccess& a, int device) EXCLUDES(mu) {
    MutexLock lock(&mu);
    SweepLocked();
    // The key: the IPC handle, or for VMM memory the owner's export id.
    std::string handle = a.vmm() ? "vmm:" + std::to_string(a.export_id)
                                 : std::string(reinterpret_cast<const char*>(a.handle.bytes.data()),
                                               a.handle.bytes.size());
    auto k = std::make_pair(handle, device);
    auto it = mappings.find(k);
    if (it == mappings.end()) {
      Entry e;
      if (a.vmm()) {
        FERRY_ASSIGN_OR_RETURN(void* base, shared->api->OpenVmm(static_cast<int>(a.pid), a.pieces, device));
        e.mapping = std::make_shared<Mapping>(shared->api, base, a.allocation_size);
      } else {
        FERRY_ASSIGN_OR_RETURN(void* base, shared->api->OpenHandle(a.handle, device));
        e.mapping = std::make_shared<Mapping>(shared->api, base);
      }
      void* base = e.mapping->base;
      e.kernel_ok = shared->copier->KernelReaches(device, base);
      e.same_device = shared->copier->OnDevice(device, base);
      it = mappings.emplace(k, std::move(e)).first;
    }
    auto& regions = it->second.regions;
    auto r = std::make_pair(a.lease_slot, a.region);
    if (std::find(regions.begin(), regions.end(), r) == regions.end()) regions.push_back(r);
    return Mapped{it->second.mapping, it->second.kernel_ok, it->second.same_device};
  }

  size_t mapped() EXCLUDES(mu) {
    MutexLock lock(&mu);
    return mappings.size();
  }
};

Status RegionGone(uint64_t region) {
  return Status(Code::kFailedPrecondition, "remote region " + std::to_string(region) + " was deregistered");
}

class IpcChannel final : public Channel {
 public:
  IpcChannel(std::shared_ptr<Peer> peer, std::shared_ptr<Region> local, RegionAccess remote,
             std::weak_ptr<Mapping> mapping, std::byte* remote_base, bool kernel_ok, bool same_device)
      : peer_(std::move(peer)), local_(std::move(local)), remote_(std::move(remote)),
        mapping_(std::move(mapping)), remote_base_(remote_base), kernel_ok_(kernel_ok),
        same_device_(same_device) {}

  Status Post(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
              const std::shared_ptr<TransferState>& state) override {
    return PostFrom(op, ops, total_bytes, state, nullptr);
  }

  std::unique_ptr<OpSpace> ReserveOps(Op /*op*/, size_t n) override {
    return MakeCudaOpSpace(peer_->shared->copier->ReserveOps(local_->device, n));
  }

  Status PostReserved(Op op, OpSpace& space, std::span<const TransferOp> ops, uint64_t total_bytes,
                      const std::shared_ptr<TransferState>& state) override {
    return PostFrom(op, ops, total_bytes, state, OpBufferOf(space));
  }

  TransferPath path() const override { return TransferPath{std::string(kName), false}; }

 private:
  Status PostFrom(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
                  const std::shared_ptr<TransferState>& state, const cuda::OpBuffer* buffer) {
    if (!peer_->table->OwnerAlive()) {
      peer_->table->UnlinkIfOwnerDead();
      return Status(Code::kUnavailable, "peer " + peer_->key + " (its process) is gone");
    }
    auto local_use = RegionUse::Make(local_);
    if (!local_use)
      return Status(Code::kFailedPrecondition,
                    "local region " + std::to_string(static_cast<uint64_t>(local_->id)) + " was deregistered");
    auto mapping = mapping_.lock();
    if (!mapping) return RegionGone(remote_.region);
    if (!peer_->table->Acquire(peer_->row->index, remote_.lease_slot, remote_.region)) {
      peer_->Sweep();  // unmaps the allocation once nothing else reaches it
      return RegionGone(remote_.region);
    }
    auto lease = std::make_shared<Lease>(peer_->row, remote_.lease_slot);

    const bool write = op == Op::kWrite;
    // Read in place by the copier: no per-piece array is built before the GPU starts.
    const cuda::OffsetBatch batch = write ? cuda::OffsetBatch{ops, remote_base_, local_->base, true, buffer}
                                          : cuda::OffsetBatch{ops, local_->base, remote_base_, false, buffer};
    if (total_bytes == 0) return Status::Ok();
    Copier& copier = *peer_->shared->copier;
    // Held until every part is done: the copies still touch both regions until then, and the
    // owner's deregistration waits for the lease.
    state->Hold(std::move(local_use));
    state->Hold(std::move(lease));
    state->Hold(std::move(mapping));
    if (auto poller = copier.Poller(local_->device)) state->SetPoller(std::move(poller));
    state->AddParts(1);
    Status posted = copier.Post(local_->device, batch, kernel_ok_, same_device_, state->deadline(),
                                [state](const Status& s) { state->PartDone(s); });
    if (!posted.ok()) state->PartDone(posted);
    return posted;
  }

  std::shared_ptr<Peer> peer_;
  std::shared_ptr<Region> local_;
  const RegionAccess remote_;
  std::weak_ptr<Mapping> mapping_;  // the peer's cache owns it; revocation drops it
  std::byte* const remote_base_;    // the region inside the mapping
  const bool kernel_ok_;
  const bool same_device_;  // the peer's region is local_'s device's own memory
};

class IpcEndpoint final : public Endpoint {
 public:
  explicit IpcEndpoint(std::shared_ptr<Peer> peer) : peer_(std::move(peer)) {}

  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local,
                                               const MemoryDesc& remote) override {
    if (local->kind != MemoryKind::kCuda || remote.kind != MemoryKind::kCuda)
      return Status(Code::kUnsupported, "the cuda_ipc transport carries GPU memory on both sides");
    const TransportData* data = remote.FindAccess(kName);
    if (data == nullptr) return Status(Code::kInvalidArgument, "remote region has no cuda_ipc entry");
    FERRY_ASSIGN_OR_RETURN(RegionAccess access, UnpackRegionAccess(data->data, remote.size));
    if (access.process_token != peer_->access.process_token || remote.engine_key != peer_->key)
      return Status(Code::kInvalidArgument, "remote region does not belong to peer " + peer_->key);
    if (access.region != static_cast<uint64_t>(remote.region))
      return Status(Code::kInvalidArgument, "remote descriptor does not match its cuda_ipc entry");
    // VMM memory is taken from the owner's process by pid: only from the peer's own.
    if (access.vmm() && access.pid != TokenPid(peer_->access.process_token))
      return Status(Code::kInvalidArgument, "remote VMM region names another process than peer " + peer_->key);
    if (!peer_->table->Live(access.lease_slot, access.region))
      return Status(Code::kFailedPrecondition, "remote region " + std::to_string(access.region) +
                                                   " is not registered");
    FERRY_ASSIGN_OR_RETURN(auto mapped, peer_->Map(access, local->device));
    std::byte* remote_base = static_cast<std::byte*>(mapped.mapping->base) + access.offset;
    return std::unique_ptr<Channel>(new IpcChannel(peer_, local, std::move(access), mapped.mapping,
                                                   remote_base, mapped.kernel_ok, mapped.same_device));
  }

  Status Notify(std::string_view) override {
    return Status(Code::kUnsupported, "the cuda_ipc transport carries no notifications");
  }
  bool healthy() const override { return peer_->table->OwnerAlive(); }

 private:
  std::shared_ptr<Peer> peer_;
};

class IpcTransport final : public Transport {
 public:
  explicit IpcTransport(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

  std::string_view name() const override { return kName; }
  Capabilities caps() const override {
    Capabilities c;
    c.host_memory = false;
    c.cuda_memory = true;
    c.reach = Reach::kSameHost;
    c.notifications = false;
    c.cost = 5;  // after `local` (same process), before `ucx`
    return c;
  }
  TransportData Describe() const override {
    return TransportData{std::string(kName), PackEngineAccess(EngineAccess{shared_->token, shared_->table->name()})};
  }

  Result<TransportData> Register(const std::shared_ptr<Region>& region) override {
    if (region->kind != MemoryKind::kCuda) return Status(Code::kUnsupported, "cuda_ipc carries GPU memory");
    // An IPC handle (or VMM descriptor) in a descriptor lets any process of the host that
    // sees it open the memory, and cuda_ipc has no authenticated connection of its own over
    // which to hand it to allowed peers only: a region with an access list is not exported
    // here, and peers reach it through a transport that checks each request (ucx, staged).
    if (region->restricted())
      return Status(Code::kUnsupported, "cuda_ipc does not export regions with an access list");
    auto ipc = RegisterIpc(region);
    if (ipc.ok()) return ipc;
    // No IPC handle (memory mapped with the VMM API has none): its allocations' descriptors.
    auto vmm = RegisterVmm(region);
    if (vmm.ok() || vmm.status().code() != Code::kUnsupported) return vmm;
    return ipc.status();
  }

  Result<TransportData> RegisterVmm(const std::shared_ptr<Region>& region) {
    FERRY_ASSIGN_OR_RETURN(cuda::VmmExport ex, shared_->api->ExportVmm(region->base, region->size));
    // The exported descriptors, closed unless the region ends up registered.
    struct Descriptors {
      std::vector<cuda::VmmPiece> pieces;
      ~Descriptors() {
        for (const auto& p : pieces) os::Env::Current()->Close(p.fd);
      }
    } owned{ex.pieces};
    const auto base = reinterpret_cast<uint64_t>(ex.base);
    const auto at = reinterpret_cast<uint64_t>(region->base);
    if (at < base || !InBounds(at - base, region->size, ex.size))
      return Status(Code::kInternal, "the VMM export does not cover the region");
    RegionAccess a;
    a.process_token = shared_->token;
    a.offset = at - base;
    a.allocation_size = ex.size;
    a.region = static_cast<uint64_t>(region->id);
    a.pid = static_cast<uint32_t>(getpid());
    a.pieces = std::move(ex.pieces);
    {
      MutexLock lock(&mu_);
      a.export_id = ++last_export_;
    }
    if (!FitsRegionAccess(a))
      return Status(Code::kUnsupported, "the region spans " + std::to_string(a.pieces.size()) +
                                            " VMM allocations, too many to describe");
    FERRY_ASSIGN_OR_RETURN(a.lease_slot, shared_->table->Publish(static_cast<uint64_t>(region->id)));
    {
      MutexLock lock(&mu_);
      slots_[static_cast<uint64_t>(region->id)] = Exported{a.lease_slot, 0, std::move(owned.pieces)};
    }
    owned.pieces.clear();
    return TransportData{std::string(kName), PackRegionAccess(a)};
  }

  Result<TransportData> RegisterIpc(const std::shared_ptr<Region>& region) {
    FERRY_ASSIGN_OR_RETURN(cuda::AllocationRange range, shared_->api->GetAllocationRange(region->base));
    const auto base = reinterpret_cast<uint64_t>(range.base);
    const auto at = reinterpret_cast<uint64_t>(region->base);
    if (at < base || !InBounds(at - base, region->size, range.size))
      return Status(Code::kInvalidArgument, "the region spans more than one CUDA allocation");
    // One handle per allocation while any of its regions is registered, so that a peer maps
    // the allocation once whatever the number of regions in it. (A freed and reallocated block
    // at the same address gets a new handle: no region of it was registered in between.)
    cuda::IpcHandle handle;
    {
      MutexLock lock(&mu_);
      auto it = handles_.find(base);
      if (it != handles_.end()) handle = it->second.first;
    }
    if (handle == cuda::IpcHandle{}) {
      FERRY_ASSIGN_OR_RETURN(handle, shared_->api->GetHandle(range.base));
    }
    FERRY_ASSIGN_OR_RETURN(uint32_t slot, shared_->table->Publish(static_cast<uint64_t>(region->id)));
    {
      MutexLock lock(&mu_);
      slots_[static_cast<uint64_t>(region->id)] = Exported{slot, base, {}};
      auto [it, added] = handles_.try_emplace(base, handle, 0);
      ++it->second.second;
    }
    RegionAccess a;
    a.process_token = shared_->token;
    a.handle = handle;
    a.offset = at - base;
    a.allocation_size = range.size;
    a.lease_slot = slot;
    a.region = static_cast<uint64_t>(region->id);
    return TransportData{std::string(kName), PackRegionAccess(a)};
  }

  // A peer process that still holds a lease when the wait ends may still be copying into the
  // region: kDeadlineExceeded, and the slot stays revoking, so that a retry waits again.
  Status Deregister(const Region& region) override {
    const auto id = static_cast<uint64_t>(region.id);
    Revoking r;
    {
      MutexLock lock(&mu_);
      auto rv = revoking_.find(id);
      if (rv != revoking_.end()) {
        r = std::move(rv->second);
        revoking_.erase(rv);
      } else {
        auto it = slots_.find(id);
        if (it == slots_.end()) return Status::Ok();
        r.slot = it->second.slot;
        r.pieces = std::move(it->second.pieces);
        if (r.pieces.empty()) {
          auto h = handles_.find(it->second.allocation);
          if (h != handles_.end() && --h->second.second == 0) handles_.erase(h);
        }
        slots_.erase(it);
      }
    }
    Status s = shared_->table->Revoke(r.slot, Deadline::After(shared_->retire_wait));
    if (!s.ok()) {
      FERRY_LOG_WARN("cuda_ipc: deregistering region {}: {}", id, s.ToString());
      MutexLock lock(&mu_);
      revoking_[id] = std::move(r);
      return s;
    }
    // The descriptors go once the slot is revoked: a peer that took one later finds the
    // region gone at its next lease, whatever the number now names.
    for (const auto& p : r.pieces) os::Env::Current()->Close(p.fd);
    return Status::Ok();
  }

  bool CanReach(const EngineDesc& peer) const override {
    const TransportData* t = peer.FindTransport(kName);
    if (t == nullptr || peer.host_id != LocalHostId()) return false;
    auto access = UnpackEngineAccess(t->data);
    return access.ok() && access->process_token != shared_->token;
  }

  Result<std::shared_ptr<Endpoint>> Connect(const EngineDesc& peer) override {
    if (!CanReach(peer)) return Status(Code::kUnavailable, "peer " + peer.key + " is not another process of this host");
    FERRY_ASSIGN_OR_RETURN(EngineAccess access, UnpackEngineAccess(peer.FindTransport(kName)->data));
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<LeaseTable> table, LeaseTable::Open(access.lease_table));
    FERRY_ASSIGN_OR_RETURN(uint32_t row, table->ClaimRow());
    auto p = std::make_shared<Peer>();
    p->shared = shared_;
    p->key = peer.key;
    p->access = std::move(access);
    p->row = std::make_shared<Row>(table, row);
    p->table = std::move(table);
    return std::shared_ptr<Endpoint>(std::make_shared<IpcEndpoint>(std::move(p)));
  }

 private:
  std::shared_ptr<Shared> shared_;
  struct Exported {
    uint32_t slot;        // in the lease table
    uint64_t allocation;  // IPC: base of the allocation containing the region
    std::vector<cuda::VmmPiece> pieces;  // VMM: the descriptors exported for the region
  };
  Mutex mu_;
  uint64_t last_export_ GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, Exported> slots_ GUARDED_BY(mu_);  // by region id
  // Regions whose revocation passed its wait with a peer still holding a lease (Deregister).
  struct Revoking {
    uint32_t slot = 0;
    std::vector<cuda::VmmPiece> pieces;
  };
  std::unordered_map<uint64_t, Revoking> revoking_ GUARDED_BY(mu_);  // by region id
  std::unordered_map<uint64_t, std::pair<cuda::IpcHandle, int>> handles_ GUARDED_BY(mu_);  // by allocation base
};

}  // namespace

Result<std::unique_ptr<Transport>> MakeTransport(const TransportContext& ctx, Seams seams) {
  if (seams.api == nullptr || !seams.copier || seams.process_token.empty())
    return Status(Code::kInvalidArgument, "cuda_ipc needs an IPC api, a copier and a process token");
  auto shared = std::make_shared<Shared>();
  shared->engine_key = ctx.engine_key;
  shared->api = seams.api;
  shared->copier = std::move(seams.copier);
  shared->token = std::move(seams.process_token);
  shared->retire_wait = std::max<Duration>(ctx.options->default_deadline, std::chrono::seconds(10));
  FERRY_ASSIGN_OR_RETURN(shared->table, LeaseTable::Create());
  return std::unique_ptr<Transport>(new IpcTransport(std::move(shared)));
}

}  // namespace ferry::internal::cuda_ipc

namespace ferry::internal {
// The registry's entry (src/transport/CMakeLists.txt): usable where a CUDA device is present.
Result<std::unique_ptr<Transport>> MakeCudaipcTransport(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto copier, cuda_ipc::MakeCudaCopier(ctx.copy_engines));
  cuda_ipc::Seams seams;
  seams.api = &cuda::IpcApi::Default();
  seams.copier = std::move(copier);
  seams.process_token = cuda_ipc::ProcessToken();
  return cuda_ipc::MakeTransport(ctx, std::move(seams));
}
}  // namespace ferry::internal
