// For tests of one transport without an engine (cuda_ipc's and ucx's staged path): what the
// engine would otherwise do around a Transport. A region of this process, the descriptors a
// peer gets of it and of its engine, a channel from one transport to another, and a batch
// posted as the engine posts it.
//
//   auto local = TestRegion(buf, size, 1, MemoryKind::kCuda);
//   auto link = OpenLink(*a, *b, "b", local, remote);   // registers both, connects, opens
//   auto done = PostBatch(*link->channel, Op::kWrite, ops, 10s);
//
// Thread safety: plain functions; what they return is owned by the test.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/descriptors.h"
#include "transport/transport.h"

namespace ferry::internal {

// `size` bytes at `base` as region `id` (device 0 for GPU memory, -1 for host memory).
inline std::shared_ptr<Region> TestRegion(void* base, uint64_t size, uint64_t id, MemoryKind kind) {
  auto r = std::make_shared<Region>();
  r->id = RegionId{id};
  r->base = static_cast<std::byte*>(base);
  r->size = size;
  r->kind = kind;
  r->device = kind == MemoryKind::kCuda ? 0 : -1;
  return r;
}

// What a peer learns of `r`, registered with a transport of engine `engine_key` on this host:
// the descriptor, with `access` when the registration succeeded.
inline MemoryDesc DescOf(const Region& r, const std::string& engine_key, const Result<TransportData>& access) {
  MemoryDesc d;
  d.engine_key = engine_key;
  d.region = r.id;
  d.address = reinterpret_cast<uint64_t>(r.base);
  d.size = r.size;
  d.kind = r.kind;
  d.device = r.device;
  d.host_id = LocalHostId();
  if (access.ok()) d.access.push_back(*access);
  return d;
}

// Engine `key` of this host with the one transport `t`.
inline EngineDesc EngineOf(const std::string& key, const Transport& t) {
  EngineDesc e;
  e.key = key;
  e.host_id = LocalHostId();
  e.transports.push_back(t.Describe());
  e.addresses = t.Addresses();
  return e;
}

// Posts `ops` on `ch` as the engine does (a part of its own, done once Post returned) and
// returns the transfer's state; a refused post finishes it with the refusal.
inline std::shared_ptr<TransferState> PostBatch(Channel& ch, Op op, const std::vector<TransferOp>& ops,
                                                Duration deadline) {
  uint64_t total = 0;
  for (auto& o : ops) total += o.size;
  auto state = std::make_shared<TransferState>(TransferId{1}, total, ch.path(), Deadline::After(deadline));
  Status s = ch.Post(op, ops, total, state);
  if (!s.ok()) state->Finish(s);
  state->PartDone(Status::Ok());
  return state;
}

// A channel and the endpoint it was opened on.
struct Link {
  std::shared_ptr<Endpoint> endpoint;
  std::unique_ptr<Channel> channel;
};

// A channel from `a`'s registered region `local` to `remote` of engine `peer`.
inline Result<Link> DialLink(Transport& a, const EngineDesc& peer, const std::shared_ptr<Region>& local,
                             const MemoryDesc& remote) {
  Link link;
  FERRY_ASSIGN_OR_RETURN(link.endpoint, a.Connect(peer));
  FERRY_ASSIGN_OR_RETURN(link.channel, link.endpoint->OpenChannel(local, remote));
  return link;
}

// `a`'s region `local` and `b`'s region `remote` (engine `b_key`) registered, and a channel
// from the one to the other.
inline Result<Link> OpenLink(Transport& a, Transport& b, const std::string& b_key,
                             const std::shared_ptr<Region>& local, const std::shared_ptr<Region>& remote) {
  FERRY_RETURN_IF_ERROR(a.Register(local).status());
  Result<TransportData> access = b.Register(remote);
  FERRY_RETURN_IF_ERROR(access.status());
  return DialLink(a, EngineOf(b_key, b), local, DescOf(*remote, b_key, access));
}

}  // namespace ferry::internal
