// The client's per-forward calls (PrepareForward, Wait, ReleaseOutputs), Close and the
// accessors; see client_setup.cc for Create and client_threads.cc for the threads.
#include <cstring>
#include <string>

#include "embed/service/client_impl.h"

namespace ferry::embed::service {

uint64_t ProtocolVersion() { return kEmbedProtocolVersion; }

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { Close(); }

void Client::Close() {
  Impl& c = *impl_;
  {
    MutexLock lock(&c.mu);
    if (c.closed) return;
    c.closed = true;
  }
  c.cv.NotifyAll();
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
  MutexLock lock(&c.aux_mu);
  uint32_t word = kFlagFailed;
  (void)cuda::SetDevice(c.options.device);
  if (!cuda::MemcpyAsync(&word, c.dev_flags[slot], 4, c.aux_stream).ok() ||
      !cuda::StreamSync(c.aux_stream, Deadline::After(kClientFlagTimeout)).ok())
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
          cuda::MemsetAsync(c.dev_outputs[s], 0, tokens * c.options.token_bytes, stream));
      FERRY_RETURN_IF_ERROR(cuda::StreamWrite(stream, c.dev_flags[s], kFlagDone));
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
    MutexLock lock(&c.mu);
    if (c.free_events.empty())
      return Status(Code::kResourceExhausted, "more steps in flight than input events");
    event = c.free_events.back();
    c.free_events.pop_back();
  }
  Status st = cuda::MemcpyAsync(input_ids().data(), sources->input_ids, num_tokens * 4ull, stream);
  if (st.ok())
    st = cuda::MemcpyAsync(query_start_loc().data(), sources->query_start_loc,
                           (num_reqs + 1ull) * 4, stream);
  if (st.ok() && c.options.context_len > 0)
    st = cuda::MemcpyAsync(ngram_context().data(), sources->ngram_context,
                           num_reqs * c.options.context_len * 4, stream);
  if (st.ok()) st = cuda::EventRecord(event, stream);
  MutexLock lock(&c.mu);
  if (!st.ok()) {
    c.free_events.push_back(event);
    return st;
  }
  c.to_send.push_back(Impl::Pending{r, event});
  c.cv.NotifyAll();
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
    return cuda::StreamWaitGeq(stream, c.dev_flags[slot], kFlagDone);
  }
  {
    // A lost connection is reported after the error of the step it cut short, if any.
    MutexLock lock(&c.mu);
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
  MutexLock lock(&c.mu);
  c.cv.WaitFor(
      &c.mu,
      c.options.tp_rank == 0 ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(20),
      [&]() REQUIRES(c.mu) {
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
    MutexLock lock(&c.mu);
    if (c.closed) return Status(Code::kFailedPrecondition, "the client is closed");
    if (!c.fatal.ok()) {
      if (!c.cuda) c.FailAll();  // the flags stay failed: no later wait may block
      return c.fatal;
    }
  }
  for (size_t s = 0; s < slots(); ++s) {
    if (c.cuda)
      FERRY_RETURN_IF_ERROR(cuda::StreamWrite(stream, c.dev_flags[s], kFlagReset));
    else
      StoreFlag(c.Flag(s), kFlagReset);
  }
  c.outstanding = false;
  return Status::Ok();
}

}  // namespace ferry::embed::service
