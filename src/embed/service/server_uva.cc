// The UVA path of a layer step: the step's inputs go to device memory once per step (through a
// page-locked mirror), the UVA kernel runs on rank 0's stream and writes rank 0's output, the
// other ranks' outputs are device-to-device copies of it on the same stream, and every rank's
// DONE is ordered after them (an event the other ranks' streams wait for). The inputs are the
// copy the service validated, so the kernel's own checks cannot fire; they are read back (one
// synchronous copy per layer) after DONE on the first step and every kUvaCheckEvery-th step
// (UvaCheck), off the client's path.
#include <cstring>

#include "base/log.h"
#include "cuda/runtime.h"
#include "cuda/stream_ops.h"
#include "embed/service/server_internal.h"

namespace ferry::embed::service {

using internal::Group;
using internal::Member;
using internal::UvaState;

constexpr uint64_t kUvaCheckEvery = 256;

namespace {

// Frees everything (on its device); the state can be set up again.
void Release(UvaState& u) {
  if (u.device >= 0) (void)cuda::SetDevice(u.device);
  u.gatherers.clear();
  if (u.dev_inputs != nullptr) (void)cuda::Free(u.dev_inputs);
  if (u.host_inputs != nullptr) (void)cuda::HostFree(u.host_inputs);
  if (u.event != nullptr) (void)cuda::EventDestroy(u.event);
  u.dev_inputs = u.host_inputs = nullptr;
  u.event = nullptr;
  u.capacity = 0;
  u.uploaded_for = 0;
  u.device = -1;
}

// Buffers for rank 0's registered capacity on its device (a re-registered rank 0 may have
// another device or capacity).
Status SetUp(UvaState& u, const Register& reg, int device) {
  if (u.device != device) Release(u);
  u.device = device;
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(device));
  const size_t want = reg.max_tokens + reg.max_reqs + 1 + reg.max_reqs * reg.context_len;
  if (u.capacity < want) {
    if (u.dev_inputs != nullptr) (void)cuda::Free(u.dev_inputs);
    if (u.host_inputs != nullptr) (void)cuda::HostFree(u.host_inputs);
    u.dev_inputs = u.host_inputs = nullptr;
    u.capacity = 0;
    FERRY_ASSIGN_OR_RETURN(void* d, cuda::Malloc(device, want * 4));
    u.dev_inputs = static_cast<int32_t*>(d);
    FERRY_ASSIGN_OR_RETURN(void* h, cuda::HostAlloc(want * 4));
    u.host_inputs = static_cast<int32_t*>(h);
    u.capacity = want;
    u.uploaded_for = 0;
  }
  if (u.event == nullptr) {
    FERRY_ASSIGN_OR_RETURN(u.event, cuda::EventCreate());
  }
  return Status::Ok();
}

}  // namespace

UvaState::~UvaState() { Release(*this); }

bool Server::Impl::UvaReady(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                            size_t slot) {
  UvaState& u = g.uva;
  if (u.broken) return false;
  for (const auto& m : members)
    if (m->sink->stream() == nullptr) return false;  // host outputs: nothing for a kernel
  const size_t index = members[0]->served[slot];
  const ServedLayer& layer = layers[index];
  if (!layer.table->pinned() || layer.table->data() == nullptr) return false;
  Status s = SetUp(u, members[0]->reg, members[0]->sink->device());
  if (s.ok() && u.gatherers.count(index) == 0) {
    Result<std::unique_ptr<UvaGatherer>> k =
        UvaGatherer::Create(layer.layout, *layer.table, u.device);
    if (k.ok())
      u.gatherers[index] = std::move(k).value();
    else
      s = k.status();
  }
  if (!s.ok()) {
    u.broken = true;
    FERRY_LOG_WARN("embed-serve: dp {}: the UVA path is unavailable, steps run on the CPU: {}",
                   g.dp_rank, s.ToString());
    return false;
  }
  return true;
}

Status Server::Impl::UvaLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                              size_t slot, const StepInput& in, Clock::time_point* gathered,
                              Clock::time_point* last_copy, uint64_t* copies) {
  UvaState& u = g.uva;
  OutputSink& s0 = *members[0]->sink;
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(u.device));
  const size_t n_tok = in.tokens.size(), n_qsl = in.query_start_loc.size(),
               n_ctx = in.ngram_context.size();
  if (n_tok + n_qsl + n_ctx > u.capacity)
    return Status(Code::kInternal, "UVA inputs larger than the registered capacity");
  if (u.uploaded_for != g.serial) {
    // The mirror is free: the previous step's upload finished before this layer's Drain.
    int32_t* h = u.host_inputs;
    if (n_tok) std::memcpy(h, in.tokens.data(), n_tok * 4);
    std::memcpy(h + n_tok, in.query_start_loc.data(), n_qsl * 4);
    if (n_ctx) std::memcpy(h + n_tok + n_qsl, in.ngram_context.data(), n_ctx * 4);
    FERRY_RETURN_IF_ERROR(
        cuda::MemcpyAsync(u.dev_inputs, h, (n_tok + n_qsl + n_ctx) * 4, s0.stream()));
    u.uploaded_for = g.serial;
  }
  const int32_t* d = u.dev_inputs;
  DeviceStep step{d, d + n_tok, d + n_tok + n_qsl, static_cast<int64_t>(n_tok), in.num_reqs()};
  uint8_t* out = s0.device_output(slot);
  if (n_tok > 0)
    FERRY_RETURN_IF_ERROR(
        u.gatherers.at(members[0]->served[slot])->Enqueue(step, out, s0.stream()));
  u.ran = true;
  *gathered = Clock::now();
  if (members.size() > 1 && n_tok > 0) {
    const size_t bytes = n_tok * members[0]->reg.token_bytes;
    for (size_t i = 1; i < members.size(); ++i)
      FERRY_RETURN_IF_ERROR(
          cuda::MemcpyAsync(members[i]->sink->device_output(slot), out, bytes, s0.stream()));
    *copies = members.size() - 1;
    FERRY_RETURN_IF_ERROR(cuda::EventRecord(u.event, s0.stream()));
    for (size_t i = 1; i < members.size(); ++i)
      FERRY_RETURN_IF_ERROR(members[i]->sink->WaitEvent(u.event));
  }
  *last_copy = Clock::now();
  return Status::Ok();
}

Status Server::Impl::UvaCheck(Group& g) {
  UvaState& u = g.uva;
  if (g.serial % kUvaCheckEvery != 1) return Status::Ok();
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(u.device));
  for (auto& [index, k] : u.gatherers) FERRY_RETURN_IF_ERROR(k->CheckErrors());
  return Status::Ok();
}

}  // namespace ferry::embed::service
