#include "embed/service/client.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "cuda/runtime.h"
#include "embed/service/gpu_ops.h"
#include "embed/service/host_flag.h"
#include "embed/service/shared_memory.h"
#include "embed/service/unix_socket.h"
#include "embed/start_thread.h"

namespace ferry::embed::service {
namespace {
constexpr uint64_t kAlign = 64;
constexpr int kEvents = 4;  // steps whose input copies may be in flight at once
constexpr auto kFlagTimeout = std::chrono::seconds(2);
uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
}  // namespace

struct Client::Impl {
  ClientOptions options;
  bool cuda = false;
  std::unique_ptr<SharedMemory> inputs;
  bool inputs_pinned = false;
  InputOffsets input_offsets;
  std::unique_ptr<SharedMemory> outputs;  // host mode
  std::vector<uint64_t> output_offsets, flag_offsets;
  // CUDA mode.
  void* allocation = nullptr;  // owned when the client allocated the outputs
  std::vector<uint8_t*> dev_outputs;
  std::vector<uint32_t*> dev_flags;
  void* aux_stream = nullptr;  // failure writes and flag reads
  std::mutex aux_mu;

  UniqueFd fd;
  UniqueFd wake_fd;
  std::thread reader;
  std::atomic<uint64_t> last_seq{0};  // the latest step sent
  // A forward was prepared and its outputs not released yet (the driving thread's).
  std::atomic<bool> outstanding{false};

  // CUDA mode, rank 0: steps whose input copies are in flight, sent by `sender`.
  struct Pending {
    Request request;
    void* event;
  };
  std::thread sender;
  std::deque<Pending> to_send;     // GUARDED_BY(mu)
  std::vector<void*> free_events;  // GUARDED_BY(mu)
  std::vector<void*> all_events;

  std::mutex mu;
  std::condition_variable cv;
  Status pending;                        // GUARDED_BY(mu): a step's error not yet reported
  Status fatal;                          // GUARDED_BY(mu): sticky
  std::map<uint64_t, Deadline> waiting;  // GUARDED_BY(mu): steps sent, not answered
  bool closed = false;                   // GUARDED_BY(mu)

  ~Impl() {
    if (cuda) {
      (void)gpu::SetDevice(options.device);
      if (aux_stream != nullptr) (void)gpu::StreamDestroy(aux_stream);
      for (void* e : all_events) (void)gpu::EventDestroy(e);
      if (allocation != nullptr) (void)gpu::Free(allocation);
    }
    if (inputs_pinned) (void)cuda::HostUnregister(inputs->data());
  }

  uint32_t* Flag(size_t slot) const {
    return reinterpret_cast<uint32_t*>(outputs->data() + flag_offsets[slot]);
  }
  // Sets every flag to FAILED, so that no wait stays blocked. REQUIRES: mu held or not needed.
  void FailAll() {
    if (!cuda) {
      for (size_t s = 0; s < flag_offsets.size(); ++s) StoreFlag(Flag(s), kFlagFailed);
      return;
    }
    std::lock_guard<std::mutex> lock(aux_mu);
    (void)gpu::SetDevice(options.device);
    for (uint32_t* f : dev_flags) (void)gpu::StreamWrite(aux_stream, f, kFlagFailed);
    (void)gpu::StreamSync(aux_stream, Deadline::After(kFlagTimeout));
  }
  void SetFatal(Status s) {
    if (fatal.ok()) fatal = std::move(s);
  }
  void Read();
  void SendLoop();
  Status SendRequest(const Request& r);
  // The error to report now, if any (the pending one is reported once).
  Status TakeError() {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return Status(Code::kFailedPrecondition, "the client is closed");
    if (!fatal.ok()) return pending.ok() ? fatal : std::exchange(pending, Status::Ok());
    return std::exchange(pending, Status::Ok());
  }
  Status SetUpCuda(Register* reg);
};

Status Client::Impl::SetUpCuda(Register* reg) {
  std::string reason;
  if (!gpu::Usable(&reason))
    return Status(Code::kFailedPrecondition, "CUDA mode, but CUDA is not usable: " + reason);
  const ClientOptions& o = options;
  FERRY_RETURN_IF_ERROR(gpu::SetDevice(o.device));
  FERRY_ASSIGN_OR_RETURN(aux_stream, gpu::StreamCreate());
  const size_t n = o.layers.size();
  if (o.cuda_outputs.empty() != o.cuda_flags.empty() ||
      (!o.cuda_outputs.empty() && (o.cuda_outputs.size() != n || o.cuda_flags.size() != n)))
    return Status(Code::kInvalidArgument, "cuda_outputs and cuda_flags need one entry per layer");
  if (o.cuda_outputs.empty()) {
    const uint64_t out_bytes = AlignUp(o.max_tokens * o.token_bytes);
    FERRY_ASSIGN_OR_RETURN(allocation, gpu::Malloc(out_bytes * n + kAlign * n));
    auto* base = static_cast<uint8_t*>(allocation);
    for (size_t i = 0; i < n; ++i) {
      dev_outputs.push_back(base + out_bytes * i);
      dev_flags.push_back(reinterpret_cast<uint32_t*>(base + out_bytes * n + kAlign * i));
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (reinterpret_cast<uintptr_t>(o.cuda_flags[i]) % 4 != 0)
        return Status(Code::kInvalidArgument, "a flag is not 4-byte aligned");
      dev_outputs.push_back(static_cast<uint8_t*>(o.cuda_outputs[i]));
      dev_flags.push_back(static_cast<uint32_t*>(o.cuda_flags[i]));
    }
  }
  for (uint32_t* f : dev_flags) FERRY_RETURN_IF_ERROR(gpu::StreamWrite(aux_stream, f, kFlagReset));
  FERRY_RETURN_IF_ERROR(gpu::StreamSync(aux_stream, Deadline::After(kFlagTimeout)));
  reg->mode = OutputMode::kCuda;
  reg->device = o.device;
  for (size_t i = 0; i < n; ++i) {
    FERRY_RETURN_IF_ERROR(gpu::IpcHandleOf(dev_outputs[i], &reg->layers[i].output_ipc,
                                           &reg->layers[i].output_offset));
    FERRY_RETURN_IF_ERROR(
        gpu::IpcHandleOf(dev_flags[i], &reg->layers[i].flag_ipc, &reg->layers[i].flag_offset));
  }
  for (int i = 0; i < kEvents; ++i) {
    FERRY_ASSIGN_OR_RETURN(void* e, gpu::EventCreate());
    all_events.push_back(e);
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
  for (auto [what, d] : {std::pair{"connect_timeout", o.connect_timeout},
                         std::pair{"step_timeout", o.step_timeout}})
    if (d <= std::chrono::nanoseconds::zero() || d > kMaxClientTimeout)
      return Status(Code::kInvalidArgument,
                    std::string(what) + " of " + std::to_string(d.count()) + " ns outside (0, " +
                        std::to_string(kMaxClientTimeout.count()) + " s]");
  auto impl = std::make_unique<Impl>();
  Impl& c = *impl;
  c.options = o;
  c.cuda = o.mode == OutputMode::kCuda;
  std::string tag =
      "ferry-embed-dp" + std::to_string(o.dp_rank) + "-tp" + std::to_string(o.tp_rank);
  Register reg;
  reg.dp_rank = o.dp_rank;
  reg.tp_rank = o.tp_rank;
  reg.tp_size = o.tp_size;
  reg.max_tokens = o.max_tokens;
  reg.max_reqs = o.max_reqs;
  reg.context_len = o.context_len;
  reg.token_bytes = o.token_bytes;
  for (uint32_t layer : o.layers) reg.layers.push_back(LayerOutput{layer, 0, 0, "", ""});
  std::vector<int> fds;
  if (c.cuda) {
    FERRY_RETURN_IF_ERROR(c.SetUpCuda(&reg));
  } else {
    uint64_t out_bytes = AlignUp(o.max_tokens * o.token_bytes);
    uint64_t flags_base = out_bytes * o.layers.size();
    for (size_t i = 0; i < o.layers.size(); ++i) {
      reg.layers[i].output_offset = out_bytes * i;
      reg.layers[i].flag_offset = flags_base + kAlign * i;
      c.output_offsets.push_back(reg.layers[i].output_offset);
      c.flag_offsets.push_back(reg.layers[i].flag_offset);
    }
    FERRY_ASSIGN_OR_RETURN(
        c.outputs, SharedMemory::Create(tag + "-out", flags_base + kAlign * o.layers.size()));
    fds.push_back(c.outputs->fd());
  }
  if (o.tp_rank == 0) {
    reg.has_inputs = true;
    c.input_offsets.ids = 0;
    c.input_offsets.query_start_loc = AlignUp(o.max_tokens * 4);
    c.input_offsets.ngram_context = c.input_offsets.query_start_loc + AlignUp((o.max_reqs + 1) * 4);
    uint64_t bytes = c.input_offsets.ngram_context + AlignUp(o.max_reqs * o.context_len * 4);
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

void Client::Impl::Read() {
  for (;;) {
    Deadline until = Deadline::After(std::chrono::milliseconds(200));
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [seq, d] : waiting) until = Deadline::Earlier(until, d);
    }
    Result<Message> msg = Receive(fd.get(), until, wake_fd.get());
    if (!msg.ok() && msg.status().code() == Code::kCancelled) return;
    if (!msg.ok() && msg.status().code() == Code::kDeadlineExceeded) {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (it->second.expired()) {
          SetFatal(Status(Code::kDeadlineExceeded,
                          "embedding step " + std::to_string(it->first) +
                              " got no reply from the service within the step timeout"));
          it = waiting.erase(it);
        } else {
          ++it;
        }
      }
      if (!fatal.ok()) {
        FailAll();
        cv.notify_all();
        return;
      }
      continue;
    }
    Result<AnyMessage> decoded = msg.ok() ? Decode(msg->bytes) : Result<AnyMessage>(msg.status());
    std::lock_guard<std::mutex> lock(mu);
    if (!decoded.ok() || !std::holds_alternative<Reply>(*decoded)) {
      Status why =
          decoded.ok() ? Status(Code::kInvalidArgument, "unexpected message") : decoded.status();
      SetFatal(Status(Code::kUnavailable, "embedding service connection lost: " + why.ToString()));
      FailAll();
      cv.notify_all();
      return;
    }
    const Reply& r = std::get<Reply>(*decoded);
    waiting.erase(r.seq);
    if (!r.status.ok() && pending.ok())
      pending = r.status.WithContext("embedding step " + std::to_string(r.seq));
    cv.notify_all();
  }
}

Status Client::Impl::SendRequest(const Request& r) {
  {
    std::lock_guard<std::mutex> lock(mu);
    waiting[r.seq] = Deadline::After(options.step_timeout);
  }
  Status s = Send(fd.get(), Encode(r));
  if (s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu);
  waiting.erase(r.seq);
  SetFatal(Status(Code::kUnavailable, "embedding service connection lost: " + s.ToString()));
  FailAll();
  cv.notify_all();
  return fatal;
}

void Client::Impl::SendLoop() {
  for (;;) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return closed || !to_send.empty(); });
      if (closed) return;
      p = to_send.front();
      to_send.pop_front();
    }
    (void)gpu::SetDevice(options.device);
    Status s = gpu::EventSync(p.event, Deadline::After(options.step_timeout));
    {
      std::lock_guard<std::mutex> lock(mu);
      free_events.push_back(p.event);
    }
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      SetFatal(s.WithContext("the step's input copies"));
      FailAll();
      cv.notify_all();
      continue;
    }
    (void)SendRequest(p.request);
  }
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { Close(); }

void Client::Close() {
  Impl& c = *impl_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.closed) return;
    c.closed = true;
  }
  c.cv.notify_all();
  SignalWakeFd(c.wake_fd.get());
  if (c.reader.joinable()) c.reader.join();
  if (c.sender.joinable()) c.sender.join();
  c.fd.reset();
}

const ClientOptions& Client::options() const { return impl_->options; }
size_t Client::slots() const { return impl_->options.layers.size(); }

std::span<int32_t> Client::input_ids() {
  if (!impl_->inputs) return {};
  return {reinterpret_cast<int32_t*>(impl_->inputs->data() + impl_->input_offsets.ids),
          impl_->options.max_tokens};
}
std::span<int32_t> Client::query_start_loc() {
  if (!impl_->inputs) return {};
  return {reinterpret_cast<int32_t*>(impl_->inputs->data() + impl_->input_offsets.query_start_loc),
          impl_->options.max_reqs + 1};
}
std::span<int32_t> Client::ngram_context() {
  if (!impl_->inputs) return {};
  return {reinterpret_cast<int32_t*>(impl_->inputs->data() + impl_->input_offsets.ngram_context),
          impl_->options.max_reqs * impl_->options.context_len};
}
std::span<uint8_t> Client::output(size_t slot) {
  if (slot >= slots() || impl_->cuda) return {};
  return {impl_->outputs->data() + impl_->output_offsets[slot],
          impl_->options.max_tokens * impl_->options.token_bytes};
}
void* Client::device_output(size_t slot) const {
  return impl_->cuda && slot < slots() ? impl_->dev_outputs[slot] : nullptr;
}
void* Client::device_flag(size_t slot) const {
  return impl_->cuda && slot < slots() ? impl_->dev_flags[slot] : nullptr;
}
uint32_t Client::flag(size_t slot) const {
  Impl& c = *impl_;
  if (slot >= slots()) return kFlagFailed;
  if (!c.cuda) return LoadFlag(c.Flag(slot));
  std::lock_guard<std::mutex> lock(c.aux_mu);
  uint32_t word = kFlagFailed;
  (void)gpu::SetDevice(c.options.device);
  if (!gpu::MemcpyAsync(&word, c.dev_flags[slot], 4, c.aux_stream).ok() ||
      !gpu::StreamSync(c.aux_stream, Deadline::After(kFlagTimeout)).ok())
    return kFlagFailed;
  return word;
}

Status Client::PrepareForward(uint32_t num_reqs, uint32_t num_tokens, bool dummy, void* stream,
                              const StepSources* sources) {
  Impl& c = *impl_;
  FERRY_RETURN_IF_ERROR(c.TakeError());
  if (c.outstanding)
    return Status(Code::kFailedPrecondition,
                  "the previous forward's outputs were not released: call ReleaseOutputs() "
                  "before the next PrepareForward()");
  if (!dummy && c.options.tp_rank == 0 &&
      (num_tokens > c.options.max_tokens || num_reqs > c.options.max_reqs))
    return Status(Code::kOutOfRange, "a step of " + std::to_string(num_tokens) + " tokens in " +
                                         std::to_string(num_reqs) +
                                         " requests exceeds the registered capacity of " +
                                         std::to_string(c.options.max_tokens) + " tokens, " +
                                         std::to_string(c.options.max_reqs) + " requests");
  Status st = PrepareStep(num_reqs, num_tokens, dummy, stream, sources);
  if (st.ok()) c.outstanding = true;
  return st;
}

Status Client::PrepareStep(uint32_t num_reqs, uint32_t num_tokens, bool dummy, void* stream,
                           const StepSources* sources) {
  Impl& c = *impl_;
  const uint64_t tokens = std::min<uint64_t>(num_tokens, c.options.max_tokens);
  if (dummy) {
    // Nothing goes to the service; the waits of this forward pass at once.
    for (size_t s = 0; s < slots(); ++s) {
      if (!c.cuda) {
        std::memset(output(s).data(), 0, tokens * c.options.token_bytes);
        StoreFlag(c.Flag(s), kFlagDone);
        continue;
      }
      FERRY_RETURN_IF_ERROR(
          gpu::MemsetAsync(c.dev_outputs[s], 0, tokens * c.options.token_bytes, stream));
      FERRY_RETURN_IF_ERROR(gpu::StreamWrite(stream, c.dev_flags[s], kFlagDone));
    }
    return Status::Ok();
  }
  if (c.options.tp_rank != 0) return Status::Ok();  // rank 0 speaks for the group
  Request r{c.last_seq.load() + 1, num_tokens, num_reqs, c.options.dp_rank};
  c.last_seq = r.seq;
  if (sources == nullptr) return c.SendRequest(r);
  if (!c.cuda) return Status(Code::kInvalidArgument, "input sources are copied in CUDA mode only");
  void* event = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.free_events.empty())
      return Status(Code::kResourceExhausted, "more steps in flight than input events");
    event = c.free_events.back();
    c.free_events.pop_back();
  }
  Status st = gpu::MemcpyAsync(input_ids().data(), sources->input_ids, num_tokens * 4ull, stream);
  if (st.ok())
    st = gpu::MemcpyAsync(query_start_loc().data(), sources->query_start_loc, (num_reqs + 1ull) * 4,
                          stream);
  if (st.ok() && c.options.context_len > 0)
    st = gpu::MemcpyAsync(ngram_context().data(), sources->ngram_context,
                          num_reqs * c.options.context_len * 4, stream);
  if (st.ok()) st = gpu::EventRecord(event, stream);
  std::lock_guard<std::mutex> lock(c.mu);
  if (!st.ok()) {
    c.free_events.push_back(event);
    return st;
  }
  c.to_send.push_back(Impl::Pending{r, event});
  c.cv.notify_all();
  return Status::Ok();
}

Status Client::Wait(size_t slot, void* stream) {
  Impl& c = *impl_;
  if (slot >= slots())
    return Status(Code::kOutOfRange,
                  "slot " + std::to_string(slot) + " of " + std::to_string(slots()));
  if (c.cuda) {
    // The stream waits; a failure is reported on the next call (the flag says FAILED and
    // releases the stream).
    FERRY_RETURN_IF_ERROR(c.TakeError());
    return gpu::StreamWaitGeq(stream, c.dev_flags[slot], kFlagDone);
  }
  {
    // A lost connection is reported after the error of the step it cut short, if any.
    std::lock_guard<std::mutex> lock(c.mu);
    if (!c.fatal.ok()) return c.pending.ok() ? c.fatal : std::exchange(c.pending, Status::Ok());
  }
  Deadline deadline = Deadline::After(c.options.step_timeout);
  Result<uint32_t> v = WaitFlag(c.Flag(slot), deadline, [](uint32_t x) { return x >= kFlagDone; });
  if (!v.ok())
    return Status(Code::kDeadlineExceeded,
                  "layer " + std::to_string(c.options.layers[slot]) +
                      ": no output from the embedding service within the step timeout");
  if (*v == kFlagDone) return Status::Ok();
  // Failed: rank 0 gets the service's reply (it follows the flags); give it a moment.
  // Other ranks get no reply; they look briefly for a lost connection.
  std::unique_lock<std::mutex> lock(c.mu);
  c.cv.wait_for(
      lock,
      c.options.tp_rank == 0 ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(20),
      [&] {
        return !c.pending.ok() || !c.fatal.ok() ||
               (c.options.tp_rank == 0 && c.waiting.count(c.last_seq.load()) == 0);
      });
  if (!c.pending.ok()) return std::exchange(c.pending, Status::Ok());
  if (!c.fatal.ok()) return c.fatal;
  return Status(Code::kAborted, "layer " + std::to_string(c.options.layers[slot]) +
                                    ": the embedding service failed this step");
}

Status Client::ReleaseOutputs(void* stream) {
  Impl& c = *impl_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.closed) return Status(Code::kFailedPrecondition, "the client is closed");
    if (!c.fatal.ok()) {
      if (!c.cuda) c.FailAll();  // the flags stay failed: no later wait may block
      return c.fatal;
    }
  }
  for (size_t s = 0; s < slots(); ++s) {
    if (c.cuda)
      FERRY_RETURN_IF_ERROR(gpu::StreamWrite(stream, c.dev_flags[s], kFlagReset));
    else
      StoreFlag(c.Flag(s), kFlagReset);
  }
  c.outstanding = false;
  return Status::Ok();
}

}  // namespace ferry::embed::service
