// The pipelined CPU path of a layer step (copies through the copy pump): the group's thread
// gathers layer k + 1 into one staging while the pump still copies layer k out of the other
// and then sets layer k's DONE (ordered behind its copies on each rank's stream, in layer
// order: the pump serves its layers one after the other). A layer is retired (its DONE seen
// completed, its timings committed) before its staging is gathered into again and before the
// step replies, so at most CopyPump::kDepth layers are in flight and none outlives its step.
#include <algorithm>

#include "embed/service/server_internal.h"

namespace ferry::embed::service {

using internal::Group;
using internal::Member;
using internal::PendingLayer;
using internal::Step;

bool Server::Impl::UsesPump(const std::vector<std::shared_ptr<Member>>& members,
                            size_t slot) const {
  const size_t first = members[0]->sink->direct(slot) != nullptr ? 1 : 0;
  for (size_t i = first; i < members.size(); ++i)
    if (members[i]->sink->wants_pinned_source() || options.pump_host_copies) return true;
  return false;
}

Status Server::Impl::PipelineLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                                   size_t slot, const StepInput& in, const Step& step,
                                   LayerTiming t, Clock::time_point t0,
                                   Clock::time_point released, size_t* failed) {
  *failed = slot;
  const Register& reg = members[0]->reg;
  const ServedLayer& layer = layers[members[0]->served[slot]];
  const uint64_t tb = reg.token_bytes;
  // The pump holds at most kDepth layers, and a staging's previous layer must be retired (its
  // copies done) before it is gathered into again: with two stagings used in turn, retiring
  // down to kDepth - 1 layers frees the one this layer takes.
  while (g.pending.size() >= static_cast<size_t>(CopyPump::kDepth))
    FERRY_RETURN_IF_ERROR(RetireOldest(g, members, step, failed));
  *failed = slot;
  const Clock::time_point drained = Clock::now();
  bool cold = false;
  if (g.pump == nullptr) {
    FERRY_ASSIGN_OR_RETURN(g.pump, CopyPump::Create(pump_cpus));
    cold = true;
  }
  uint8_t* direct = members[0]->sink->direct(slot);
  Staging& staging = g.next_staging == 0 ? g.staging : g.staging_b;
  const size_t bytes = static_cast<size_t>(in.num_tokens()) * tb;
  if (direct == nullptr) {
    bool want_pinned = false;
    for (const auto& m : members) want_pinned |= m->sink->wants_pinned_source();
    const size_t capacity = staging.capacity();
    const bool pinned = staging.pinned();
    FERRY_RETURN_IF_ERROR(staging.Reserve(bytes, reg.max_tokens * tb, want_pinned));
    cold |= staging.capacity() != capacity || staging.pinned() != pinned;
  }
  uint8_t* src = direct != nullptr ? direct : staging.data();
  const size_t first = direct != nullptr ? 1 : 0;
  auto copies = std::make_shared<std::atomic<uint64_t>>(0);
  // Both run on the pump's thread, possibly after this function returned: they capture values
  // and `members`, which outlives the step's pending layers (RunStep retires them all).
  auto issue = [&members, slot, src, first, tb, copies](int64_t begin, int64_t end) -> Status {
    const uint64_t off = static_cast<uint64_t>(begin) * tb;
    const uint64_t n = static_cast<uint64_t>(end - begin) * tb;
    Status first_error;
    for (size_t i = first; i < members.size(); ++i) {
      Status s = members[i]->sink->Write(slot, off, src + off, n);
      if (!s.ok() && first_error.ok()) first_error = s;
      copies->fetch_add(1, std::memory_order_relaxed);
    }
    return first_error;
  };
  auto complete = [&members, slot]() -> Status {
    for (const auto& m : members) FERRY_RETURN_IF_ERROR(m->sink->Finish(slot, kFlagDone));
    return Status::Ok();
  };
  const int64_t min_tokens =
      std::max<int64_t>(1, static_cast<int64_t>(options.min_copy_bytes / tb));
  FERRY_ASSIGN_OR_RETURN(CopyPump::Ticket ticket,
                         g.pump->Begin(in.num_tokens(), gatherer->options().chunk_tokens,
                                       min_tokens, issue, complete));
  CopyPump* p = g.pump.get();
  // With pump_host_copies (tests) the first rank's host output may be the destination: the
  // staging rule applies only to the staging.
  const Gatherer::Stores stores = direct == nullptr && options.streaming_staging
                                      ? Gatherer::Stores::kStreaming
                                      : Gatherer::Stores::kOptions;
  Status gs = gatherer->GatherStep(
      layer.layout, *layer.table, in, std::span<uint8_t>(src, bytes),
      [p, ticket](int64_t b, int64_t e) { p->ChunkDone(ticket, b, e); }, stores);
  const Clock::time_point gathered = Clock::now();
  if (!gs.ok()) {
    (void)p->End(ticket, false, Deadline::After(options.wait_timeout), nullptr);
    return gs;
  }
  if (direct == nullptr) g.next_staging ^= 1;
  g.pending.push_back(PendingLayer{slot, ticket, t, t0, released, drained, gathered, copies, cold});
  if (!options.overlap_layers) return RetireOldest(g, members, step, failed);
  return Status::Ok();
}

Status Server::Impl::RetireOldest(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                                  const Step& step, size_t* failed) {
  PendingLayer p = std::move(g.pending.front());
  g.pending.pop_front();
  const Deadline deadline = Deadline::After(options.wait_timeout);
  Clock::time_point last_copy = p.gathered, completed{};
  Status s = g.pump->End(p.ticket, true, deadline, &last_copy, &completed);
  for (size_t i = 0; s.ok() && i < members.size(); ++i)
    s = members[i]->sink->WaitSlotFinished(p.slot, deadline);
  const Clock::time_point t4 = Clock::now();
  if (!s.ok()) {
    *failed = p.slot;
    return s.WithContext("layer " + std::to_string(members[0]->reg.layers[p.slot].layer));
  }
  if (completed == Clock::time_point{}) completed = last_copy;
  LayerTiming& t = p.timing;
  t.copies = p.copies->load();
  // A layer retired after the next one was gathered has its done, layer and step phases
  // measured when it was retired (an upper bound); the step's last layer is retired at once.
  t.Set(Phase::kReleased, (p.released - p.t0).count());
  t.Set(Phase::kDrain, (p.drained - p.released).count());
  t.Set(Phase::kGather, (p.gathered - p.drained).count());
  t.Set(Phase::kCopyTail, (last_copy - p.gathered).count());
  t.Set(Phase::kFinish, (completed - last_copy).count());
  t.Set(Phase::kDone, (t4 - completed).count());
  t.Set(Phase::kLayer, (t4 - p.released).count());
  t.Set(Phase::kStep, (t4 - step.received).count());
  // The policy compares paths by the work of one layer: up to its DONE being issued, which a
  // late retirement does not inflate. A cold layer is no sample: with two stagings the first
  // two CPU probes each page-locked a staging of their own, their median outweighed the UVA
  // kernel, and `--uva auto` ran 8192-token steps on the UVA kernel (4.5 ms on an H200, where
  // the CPU path takes 1.0-1.1 ms) until re-probes outvoted them.
  if (!p.cold) g.policy->Report(t.tokens, t.path, static_cast<uint64_t>((completed - p.released).count()));
  recorder.Commit(t);
  return Status::Ok();
}

Status Server::Impl::RetireAll(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                               const Step& step, size_t* failed) {
  Status first;
  while (!g.pending.empty()) {
    size_t f = 0;
    Status s = RetireOldest(g, members, step, &f);
    if (!s.ok() && first.ok()) {
      first = s;
      *failed = f;
    }
  }
  return first;
}

}  // namespace ferry::embed::service
