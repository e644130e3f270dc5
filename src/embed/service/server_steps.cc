// The step loop of a data-parallel group: wait for every rank's released outputs, then per layer
// either gather the rows in chunks and copy them to every rank behind the gather (the CPU
// path; through the copy pump it is pipelined, server_pipeline.cc: the next layer is gathered
// while this one's copies finish) or run the UVA kernel (server_uva.cc), as the group's
// StepPolicy picks; set DONE in layer order and time every phase; on any failure set FAILED on
// the layers not done.
#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "embed/service/server_internal.h"

namespace ferry::embed::service {

using internal::Connection;
using internal::Group;
using internal::Member;
using internal::RankName;
using internal::Step;

namespace {
// `count` int32 values from shared memory; an empty copy touches neither pointer.
void CopyIn(std::vector<int32_t>& dst, const uint8_t* src, size_t count) {
  dst.resize(count);
  if (count > 0) std::memcpy(dst.data(), src, count * sizeof(int32_t));
}
}  // namespace

void Server::Impl::Work(Group& group) {
  Group* g = &group;
  struct Finished {
    Group* g;
    ~Finished() { g->finished = true; }
  } finished{g};
  if (!gather_cpus.empty()) (void)PinThisThread(gather_cpus);  // it gathers with the workers
  for (;;) {
    Step step;
    std::vector<std::shared_ptr<Member>> members;
    {
      MutexLock lock(&g->mu);
      g->cv.Wait(&g->mu, [&]() REQUIRES(g->mu) { return g->stopping || !g->queue.empty(); });
      if (g->stopping) return;
      step = std::move(g->queue.front());
      g->queue.pop_front();
      // A step needs every rank of the group; wait for absent ones up to the deadline.
      Deadline deadline = Deadline::After(options.wait_timeout);
      auto complete = [&]() REQUIRES(g->mu) {
        if (g->stopping || g->members.empty()) return true;
        for (const auto& x : g->members)
          if (x == nullptr) return false;
        return true;
      };
      if (step.error.ok()) g->cv.WaitUntil(&g->mu, deadline.at(), complete);
      if (g->stopping) return;
      members = g->members;
    }
    step.started = Clock::now();
    std::shared_ptr<Member> rank0 = members.empty() ? nullptr : members[0];
    if (rank0 == nullptr) continue;  // rank 0 left: nobody asked any more
    Status st = step.error;
    if (st.ok()) {
      for (size_t i = 0; i < members.size(); ++i)
        if (members[i] == nullptr)
          st = Status(Code::kUnavailable, "tp rank " + std::to_string(i) + " of dp rank " +
                                              std::to_string(g->dp_rank) + " is not registered");
    }
    std::vector<std::shared_ptr<Member>> present;
    for (auto& x : members)
      if (x != nullptr) present.push_back(x);
    if (st.ok()) {
      st = RunStep(*g, present, step);
    } else {
      FailFrom(present, 0);
    }
    (st.ok() ? steps_ok : steps_failed)++;
    if (!st.ok())
      FERRY_LOG_WARN("embed-serve: dp {} step {} failed: {}", g->dp_rank, step.request.seq,
                     st.ToString());
    if (rank0->alive) {
      if (std::shared_ptr<Connection> c = rank0->conn.lock())
        (void)c->Send(Encode(Reply{step.request.seq, st}));
    }
  }
}

Status Server::Impl::RunStep(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                             const Step& step) {
  const Member& r0 = *members[0];
  const Register& reg = r0.reg;
  const Request& req = step.request;
  Status st;
  if (req.num_tokens > reg.max_tokens)
    st = Status(Code::kOutOfRange, "num_tokens " + std::to_string(req.num_tokens) +
                                       " exceeds the registered " + std::to_string(reg.max_tokens));
  else if (req.num_reqs > reg.max_reqs)
    st = Status(Code::kOutOfRange, "num_reqs " + std::to_string(req.num_reqs) +
                                       " exceeds the registered " + std::to_string(reg.max_reqs));
  if (!st.ok()) {
    FailFrom(members, 0);
    return st;
  }
  // Copy the inputs out of shared memory first: what is validated is what is used, whatever
  // the client writes meanwhile.
  const uint8_t* base = r0.inputs->data();
  CopyIn(g.tokens, base + reg.inputs.ids, req.num_tokens);
  CopyIn(g.qsl, base + reg.inputs.query_start_loc, req.num_reqs + 1);
  CopyIn(g.context, base + reg.inputs.ngram_context,
         static_cast<size_t>(req.num_reqs) * reg.context_len);
  StepInput in{g.tokens, g.qsl, g.context};
  st = ValidateStep(layers[r0.served[0]].layout, in);
  const Clock::time_point inputs_done = Clock::now();
  ++g.serial;
  g.uva.ran = false;
  size_t failed = 0;
  for (size_t slot = 0; st.ok() && slot < r0.served.size(); ++slot) {
    if (!r0.alive) {
      st = Status(Code::kAborted, "tp rank 0 left during the step");
      failed = slot;
      break;
    }
    LayerTiming t;
    t.tokens = req.num_tokens;
    if (slot == 0) {
      t.Set(Phase::kQueue, (step.started - step.received).count());
      t.Set(Phase::kInputs, (inputs_done - step.started).count());
    }
    st = RunLayer(g, members, slot, in, step, t, &failed);
    if (!st.ok() && failed == slot)
      st = st.WithContext("layer " + std::to_string(reg.layers[slot].layer));
  }
  // Layers still in the pump get their DONE (or fail) before the step replies, whatever
  // happened to a later layer: nothing of the step outlives it.
  size_t retire_failed = 0;
  Status rs = RetireAll(g, members, step, &retire_failed);
  if (!rs.ok() && (st.ok() || retire_failed < failed)) {
    st = rs;
    failed = retire_failed;
  }
  if (!st.ok()) {
    // ValidateStep's error is before any layer: every layer fails.
    FailFrom(members, failed);
    return st;
  }
  if (g.uva.ran) st = UvaCheck(g);  // after DONE: off the client's path
  if (!st.ok()) FailFrom(members, 0);
  return st;
}

Status Server::Impl::WaitReleased(const std::vector<std::shared_ptr<Member>>& members, size_t slot,
                                  Deadline deadline) {
  for (const auto& m : members) {
    for (int spin = 0;; ++spin) {
      FERRY_ASSIGN_OR_RETURN(uint32_t v, m->sink->ReadFlag(slot));
      if (v == kFlagReset) break;
      if (stopping) return Status(Code::kAborted, "the service is stopping");
      if (!m->alive) return Status(Code::kUnavailable, RankName(m->reg) + " left");
      if (deadline.expired())
        return Status(Code::kDeadlineExceeded, RankName(m->reg) +
                                                   " did not release its previous output (flag " +
                                                   std::to_string(v) + ")");
      if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  return Status::Ok();
}

Status Server::Impl::RunLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                              size_t slot, const StepInput& in, const Step& step, LayerTiming& t,
                              size_t* failed) {
  *failed = slot;
  const Clock::time_point t0 = Clock::now();
  FERRY_RETURN_IF_ERROR(WaitReleased(members, slot, Deadline::After(options.wait_timeout)));
  const Clock::time_point t1 = Clock::now();
  const uint64_t tokens = static_cast<uint64_t>(in.num_tokens());
  const bool uva = options.policy.mode != UvaMode::kOff && UvaReady(g, members, slot);
  t.path = g.policy->Choose(tokens, uva);
  if (t.path == StepPath::kCpu && tokens > 0 && UsesPump(members, slot))
    return PipelineLayer(g, members, slot, in, step, t, t0, t1, failed);
  // A synchronous layer: the pipelined ones before it first get their DONE (in order).
  FERRY_RETURN_IF_ERROR(RetireAll(g, members, step, failed));
  *failed = slot;
  // The previous layer's copies read the staging that this layer's gather overwrites (and the
  // UVA inputs' host mirror).
  for (const auto& m : members)
    FERRY_RETURN_IF_ERROR(m->sink->Drain(Deadline::After(options.wait_timeout)));
  const Clock::time_point t2 = Clock::now();
  Clock::time_point gathered, last_copy;
  if (t.path == StepPath::kUva)
    FERRY_RETURN_IF_ERROR(UvaLayer(g, members, slot, in, &gathered, &last_copy, &t.copies));
  else
    FERRY_RETURN_IF_ERROR(GatherLayer(g, members, slot, in, &gathered, &last_copy, &t.copies));
  for (const auto& m : members) FERRY_RETURN_IF_ERROR(m->sink->Finish(slot, kFlagDone));
  const Clock::time_point t3 = Clock::now();
  for (const auto& m : members)
    FERRY_RETURN_IF_ERROR(m->sink->WaitFinished(Deadline::After(options.wait_timeout)));
  const Clock::time_point t4 = Clock::now();
  t.Set(Phase::kReleased, (t1 - t0).count());
  t.Set(Phase::kDrain, (t2 - t1).count());
  t.Set(Phase::kGather, (gathered - t2).count());
  t.Set(Phase::kCopyTail, (last_copy - gathered).count());
  t.Set(Phase::kFinish, (t3 - last_copy).count());
  t.Set(Phase::kDone, (t4 - t3).count());
  t.Set(Phase::kLayer, (t4 - t1).count());
  t.Set(Phase::kStep, (t4 - step.received).count());
  g.policy->Report(tokens, t.path, static_cast<uint64_t>((t4 - t1).count()));
  recorder.Commit(t);
  return Status::Ok();
}

Status Server::Impl::GatherLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                                 size_t slot, const StepInput& in, Clock::time_point* gathered,
                                 Clock::time_point* last_copy, uint64_t* copies) {
  const Register& reg = members[0]->reg;
  const ServedLayer& layer = layers[members[0]->served[slot]];
  const uint64_t tb = reg.token_bytes;
  // Rows go to the staging, or straight into the first rank's buffer when it is host memory;
  // from there to the other ranks.
  uint8_t* direct = members[0]->sink->direct(slot);
  if (direct == nullptr && in.num_tokens() > 0) {
    // Staging only for outputs that are not host memory, as large as this step needs.
    bool want_pinned = false;
    for (const auto& m : members) want_pinned |= m->sink->wants_pinned_source();
    FERRY_RETURN_IF_ERROR(g.staging.Reserve(static_cast<size_t>(in.num_tokens()) * tb,
                                            reg.max_tokens * tb, want_pinned));
  }
  uint8_t* src = direct != nullptr ? direct : g.staging.data();
  const size_t first = direct != nullptr ? 1 : 0;
  auto write_all = [&](int64_t begin, int64_t end) -> Status {
    const uint64_t off = static_cast<uint64_t>(begin) * tb;
    const uint64_t bytes = static_cast<uint64_t>(end - begin) * tb;
    Status first_error;
    for (size_t i = first; i < members.size(); ++i) {
      Status s = members[i]->sink->Write(slot, off, src + off, bytes);
      if (!s.ok() && first_error.ok()) first_error = s;
    }
    return first_error;
  };
  if (in.num_tokens() == 0) {
    *gathered = *last_copy = Clock::now();
    return Status::Ok();
  }
  std::span<uint8_t> dst(src, static_cast<size_t>(in.num_tokens()) * tb);
  // Host copies: each gather thread copies its own chunk (a memcpy, no shared queue).
  Mutex err_mu;
  Status copy_error;
  std::atomic<uint64_t> chunks{0};
  auto on_chunk = [&](int64_t begin, int64_t end) {
    chunks.fetch_add(members.size() - first, std::memory_order_relaxed);
    Status s = write_all(begin, end);
    if (!s.ok()) {
      MutexLock lock(&err_mu);
      if (copy_error.ok()) copy_error = s;
    }
  };
  ChunkDone cb;
  if (first < members.size()) cb = on_chunk;
  FERRY_RETURN_IF_ERROR(gatherer->GatherStep(layer.layout, *layer.table, in, dst, cb));
  *gathered = *last_copy = Clock::now();
  *copies = chunks.load();
  return copy_error;
}

void Server::Impl::FailFrom(const std::vector<std::shared_ptr<Member>>& members, size_t slot) {
  // Wait (briefly) for each output to be released first, so that a release still in flight
  // cannot erase the failure and leave a GPU stream waiting.
  Deadline deadline = Deadline::After(
      std::min<std::chrono::nanoseconds>(options.wait_timeout, std::chrono::seconds(2)));
  for (const auto& m : members) {
    for (size_t s = slot; s < m->sink->slots(); ++s) {
      (void)WaitReleased({m}, s, deadline);
      (void)m->sink->Signal(s, kFlagFailed);
    }
  }
}

}  // namespace ferry::embed::service
