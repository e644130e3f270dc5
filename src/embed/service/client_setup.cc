// Client::Create: validates the options, allocates the shared inputs and the outputs (shared
// host memory, or device memory exported through CUDA IPC), connects, registers, and starts
// the client's threads.
#include <cstring>
#include <string>

#include "embed/service/client_impl.h"
#include "embed/start_thread.h"

namespace ferry::embed::service {
namespace {

// The IPC handle of the allocation that holds `ptr`, and ptr's offset in it (a caching
// allocator's tensors are pieces of larger allocations).
Status IpcHandleOf(void* ptr, std::string* handle, uint64_t* offset) {
  FERRY_ASSIGN_OR_RETURN(cuda::AllocationRange range, cuda::GetAllocationRange(ptr));
  FERRY_ASSIGN_OR_RETURN(cuda::IpcHandle h, cuda::IpcGetHandle(range.base));
  static_assert(cuda::kIpcHandleBytes == kCudaIpcHandleBytes);
  handle->assign(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size());
  *offset = static_cast<uint64_t>(static_cast<uint8_t*>(ptr) - static_cast<uint8_t*>(range.base));
  return Status::Ok();
}

}  // namespace

Status Client::Impl::SetUpCuda(Register* reg) {
  std::string reason;
  if (!cuda::StreamOpsUsable(&reason))
    return Status(Code::kFailedPrecondition, "CUDA mode, but CUDA is not usable: " + reason);
  const ClientOptions& o = options;
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(o.device));
  FERRY_ASSIGN_OR_RETURN(aux_stream, cuda::StreamCreate());
  const size_t n = o.layers.size();
  if (o.cuda_outputs.empty() != o.cuda_flags.empty() ||
      (!o.cuda_outputs.empty() && (o.cuda_outputs.size() != n || o.cuda_flags.size() != n)))
    return Status(Code::kInvalidArgument, "cuda_outputs and cuda_flags need one entry per layer");
  if (o.cuda_outputs.empty()) {
    const uint64_t out_bytes = ClientAlignUp(o.max_tokens * o.token_bytes);
    FERRY_ASSIGN_OR_RETURN(allocation, cuda::Malloc(o.device, out_bytes * n + kClientAlign * n));
    auto* base = static_cast<uint8_t*>(allocation);
    for (size_t i = 0; i < n; ++i) {
      dev_outputs.push_back(base + out_bytes * i);
      dev_flags.push_back(reinterpret_cast<uint32_t*>(base + out_bytes * n + kClientAlign * i));
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (reinterpret_cast<uintptr_t>(o.cuda_flags[i]) % 4 != 0)
        return Status(Code::kInvalidArgument, "a flag is not 4-byte aligned");
      dev_outputs.push_back(static_cast<uint8_t*>(o.cuda_outputs[i]));
      dev_flags.push_back(static_cast<uint32_t*>(o.cuda_flags[i]));
    }
  }
  for (uint32_t* f : dev_flags) FERRY_RETURN_IF_ERROR(cuda::StreamWrite(aux_stream, f, kFlagReset));
  FERRY_RETURN_IF_ERROR(cuda::StreamSync(aux_stream, Deadline::After(kClientFlagTimeout)));
  reg->mode = OutputMode::kCuda;
  reg->device = o.device;
  for (size_t i = 0; i < n; ++i) {
    FERRY_RETURN_IF_ERROR(
        IpcHandleOf(dev_outputs[i], &reg->layers[i].output_ipc, &reg->layers[i].output_offset));
    FERRY_RETURN_IF_ERROR(
        IpcHandleOf(dev_flags[i], &reg->layers[i].flag_ipc, &reg->layers[i].flag_offset));
  }
  for (int i = 0; i < kClientEvents; ++i) {
    FERRY_ASSIGN_OR_RETURN(void* e, cuda::EventCreate());
    all_events.push_back(e);
    MutexLock lock(&mu);  // no thread runs yet; the lock is for the analysis, and cheap
    free_events.push_back(e);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Client>> Client::Create(const ClientOptions& o) {
  if (o.max_tokens == 0 || o.max_reqs == 0 || o.token_bytes == 0 || o.layers.empty() ||
      o.tp_size == 0 || o.tp_rank >= o.tp_size)
    return Status(Code::kInvalidArgument,
                  "client needs max_tokens, max_reqs, token_bytes, layers and tp_rank < tp_size");
  if (o.max_tokens > kMaxTokens || o.max_reqs > kMaxRequests || o.context_len > kMaxContext ||
      o.token_bytes > kMaxTokenBytes || o.layers.size() > kMaxLayers)
    return Status(Code::kInvalidArgument, "client options exceed the protocol's limits");
  for (uint32_t layer : o.layers)
    if (layer > kMaxLayerIndex)
      return Status(Code::kInvalidArgument, "layer " + std::to_string(layer) +
                                                " is outside the protocol's [0, " +
                                                std::to_string(kMaxLayerIndex) + "]");
  for (auto [what, d] :
       {std::pair{"connect_timeout", o.connect_timeout}, std::pair{"step_timeout", o.step_timeout}})
    if (d <= std::chrono::nanoseconds::zero() || d > kMaxClientTimeout)
      return Status(Code::kInvalidArgument, std::string(what) + " of " + std::to_string(d.count()) +
                                                " ns outside (0, " +
                                                std::to_string(kMaxClientTimeout.count()) + " s]");
  auto impl = std::make_unique<Impl>();
  Impl& c = *impl;
  c.options = o;
  c.cuda = o.mode == OutputMode::kCuda;
  std::string tag =
      "ferry-embed-dp" + std::to_string(o.dp_rank) + "-tp" + std::to_string(o.tp_rank);
  Register reg = RegisterOf(o);
  std::vector<int> fds;
  if (c.cuda) {
    FERRY_RETURN_IF_ERROR(c.SetUpCuda(&reg));
  } else {
    uint64_t out_bytes = ClientAlignUp(o.max_tokens * o.token_bytes);
    uint64_t flags_base = out_bytes * o.layers.size();
    for (size_t i = 0; i < o.layers.size(); ++i) {
      reg.layers[i].output_offset = out_bytes * i;
      reg.layers[i].flag_offset = flags_base + kClientAlign * i;
      c.output_offsets.push_back(reg.layers[i].output_offset);
      c.flag_offsets.push_back(reg.layers[i].flag_offset);
    }
    FERRY_ASSIGN_OR_RETURN(
        c.outputs, SharedMemory::Create(tag + "-out", flags_base + kClientAlign * o.layers.size()));
    fds.push_back(c.outputs->fd());
  }
  if (o.tp_rank == 0) {
    reg.has_inputs = true;
    c.input_offsets.ids = 0;
    c.input_offsets.query_start_loc = ClientAlignUp(o.max_tokens * 4);
    c.input_offsets.ngram_context =
        c.input_offsets.query_start_loc + ClientAlignUp((o.max_reqs + 1) * 4);
    uint64_t bytes = c.input_offsets.ngram_context + ClientAlignUp(o.max_reqs * o.context_len * 4);
    reg.inputs = c.input_offsets;
    FERRY_ASSIGN_OR_RETURN(c.inputs, SharedMemory::Create(tag + "-in", bytes));
    if (c.cuda) {
      // Page-locked, so the runner's device-to-host input copies are asynchronous.
      FERRY_RETURN_IF_ERROR(cuda::HostRegister(c.inputs->data(), c.inputs->bytes()));
      c.inputs_pinned = true;
    }
    fds.push_back(c.inputs->fd());
  }
  Deadline deadline = Deadline::After(o.connect_timeout);
  FERRY_ASSIGN_OR_RETURN(c.fd, Connect(o.socket_path, deadline));
  // A service that refuses the connection (too many) answers before it reads anything and
  // closes: its answer is read even when the registration could not be sent.
  Status sent = Send(c.fd.get(), Encode(reg), fds);
  Result<Message> answer =
      Receive(c.fd.get(), sent.ok() ? deadline : Deadline::After(std::chrono::milliseconds(100)));
  if (!answer.ok()) return sent.ok() ? answer.status() : sent;
  FERRY_ASSIGN_OR_RETURN(AnyMessage decoded, Decode(answer->bytes));
  if (!std::holds_alternative<Registered>(decoded))
    return Status(Code::kInvalidArgument,
                  "the service answered a registration with another message");
  FERRY_RETURN_IF_ERROR(std::get<Registered>(decoded).status.WithContext("registration"));
  FERRY_ASSIGN_OR_RETURN(c.wake_fd, MakeWakeFd());
  if (!sent.ok()) return sent;
  Impl* raw = impl.get();
  FERRY_ASSIGN_OR_RETURN(c.reader, StartThread("embed client reader", [raw] { raw->Read(); }));
  auto client = std::unique_ptr<Client>(new Client(std::move(impl)));  // Close() joins
  if (c.cuda && o.tp_rank == 0) {
    FERRY_ASSIGN_OR_RETURN(c.sender,
                           StartThread("embed client sender", [raw] { raw->SendLoop(); }));
  }
  return client;
}

}  // namespace ferry::embed::service
