#include "embed/service/client.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "embed/service/host_flag.h"
#include "embed/service/shared_memory.h"
#include "embed/service/unix_socket.h"

namespace ferry::embed::service {
namespace {
constexpr uint64_t kAlign = 64;
uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
}  // namespace

struct Client::Impl {
  ClientOptions options;
  std::unique_ptr<SharedMemory> inputs;
  std::unique_ptr<SharedMemory> outputs;
  InputOffsets input_offsets;
  std::vector<uint64_t> output_offsets, flag_offsets;
  UniqueFd fd;
  UniqueFd wake_fd;
  std::thread reader;
  std::atomic<uint64_t> last_seq{0};  // the latest step sent

  std::mutex mu;
  std::condition_variable cv;
  Status pending;                       // GUARDED_BY(mu): a step's error not yet reported
  Status fatal;                         // GUARDED_BY(mu): sticky
  std::map<uint64_t, Deadline> waiting;  // GUARDED_BY(mu): steps sent, not answered
  bool closed = false;                   // GUARDED_BY(mu)

  uint32_t* Flag(size_t slot) const {
    return reinterpret_cast<uint32_t*>(outputs->data() + flag_offsets[slot]);
  }
  void FailAll() {
    for (size_t s = 0; s < flag_offsets.size(); ++s) StoreFlag(Flag(s), kFlagFailed);
  }
  void Read();
  // The error to report now, if any (the pending one is reported once).
  Status TakeError() {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return Status(Code::kFailedPrecondition, "the client is closed");
    if (!fatal.ok()) return fatal;
    Status s = pending;
    pending = Status::Ok();
    return s;
  }
};

Result<std::unique_ptr<Client>> Client::Create(const ClientOptions& o) {
  if (o.max_tokens == 0 || o.max_reqs == 0 || o.token_bytes == 0 || o.layers.empty() ||
      o.tp_size == 0 || o.tp_rank >= o.tp_size)
    return Status(Code::kInvalidArgument,
                  "client needs max_tokens, max_reqs, token_bytes, layers and tp_rank < tp_size");
  if (o.max_tokens > kMaxTokens || o.max_reqs > kMaxRequests || o.context_len > kMaxContext ||
      o.token_bytes > kMaxTokenBytes || o.layers.size() > kMaxLayers)
    return Status(Code::kInvalidArgument, "client options exceed the protocol's limits");
  auto impl = std::make_unique<Impl>();
  Impl& c = *impl;
  c.options = o;
  std::string tag = "ferry-embed-dp" + std::to_string(o.dp_rank) + "-tp" +
                    std::to_string(o.tp_rank);
  Register reg;
  reg.dp_rank = o.dp_rank;
  reg.tp_rank = o.tp_rank;
  reg.tp_size = o.tp_size;
  reg.mode = OutputMode::kHost;
  reg.max_tokens = o.max_tokens;
  reg.max_reqs = o.max_reqs;
  reg.context_len = o.context_len;
  reg.token_bytes = o.token_bytes;
  uint64_t out_bytes = AlignUp(o.max_tokens * o.token_bytes);
  uint64_t flags_base = out_bytes * o.layers.size();
  for (size_t i = 0; i < o.layers.size(); ++i) {
    LayerOutput l;
    l.layer = o.layers[i];
    l.output_offset = out_bytes * i;
    l.flag_offset = flags_base + kAlign * i;
    c.output_offsets.push_back(l.output_offset);
    c.flag_offsets.push_back(l.flag_offset);
    reg.layers.push_back(l);
  }
  FERRY_ASSIGN_OR_RETURN(c.outputs,
                         SharedMemory::Create(tag + "-out", flags_base + kAlign * o.layers.size()));
  std::vector<int> fds = {c.outputs->fd()};
  if (o.tp_rank == 0) {
    reg.has_inputs = true;
    c.input_offsets.ids = 0;
    c.input_offsets.query_start_loc = AlignUp(o.max_tokens * 4);
    c.input_offsets.ngram_context =
        c.input_offsets.query_start_loc + AlignUp((o.max_reqs + 1) * 4);
    uint64_t bytes = c.input_offsets.ngram_context + AlignUp(o.max_reqs * o.context_len * 4);
    reg.inputs = c.input_offsets;
    FERRY_ASSIGN_OR_RETURN(c.inputs, SharedMemory::Create(tag + "-in", bytes));
    fds.push_back(c.inputs->fd());
  }
  Deadline deadline = Deadline::After(o.connect_timeout);
  FERRY_ASSIGN_OR_RETURN(c.fd, Connect(o.socket_path, deadline));
  FERRY_RETURN_IF_ERROR(Send(c.fd.get(), Encode(reg), fds));
  FERRY_ASSIGN_OR_RETURN(Message answer, Receive(c.fd.get(), deadline));
  FERRY_ASSIGN_OR_RETURN(AnyMessage decoded, Decode(answer.bytes));
  if (!std::holds_alternative<Registered>(decoded))
    return Status(Code::kInvalidArgument, "the service answered a registration with another message");
  FERRY_RETURN_IF_ERROR(std::get<Registered>(decoded).status.WithContext("registration"));
  FERRY_ASSIGN_OR_RETURN(c.wake_fd, MakeWakeFd());
  Impl* raw = impl.get();
  c.reader = std::thread([raw] { raw->Read(); });
  return std::unique_ptr<Client>(new Client(std::move(impl)));
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
          if (fatal.ok())
            fatal = Status(Code::kDeadlineExceeded,
                           "embedding step " + std::to_string(it->first) +
                               " got no reply from the service within the step timeout");
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
      Status why = decoded.ok() ? Status(Code::kInvalidArgument, "unexpected message") : decoded.status();
      fatal = Status(Code::kUnavailable,
                     "embedding service connection lost: " + why.ToString());
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

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { Close(); }

void Client::Close() {
  Impl& c = *impl_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.closed) return;
    c.closed = true;
  }
  SignalWakeFd(c.wake_fd.get());
  if (c.reader.joinable()) c.reader.join();
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
  return {reinterpret_cast<int32_t*>(impl_->inputs->data() +
                                     impl_->input_offsets.query_start_loc),
          impl_->options.max_reqs + 1};
}
std::span<int32_t> Client::ngram_context() {
  if (!impl_->inputs) return {};
  return {reinterpret_cast<int32_t*>(impl_->inputs->data() +
                                     impl_->input_offsets.ngram_context),
          impl_->options.max_reqs * impl_->options.context_len};
}
std::span<uint8_t> Client::output(size_t slot) {
  if (slot >= slots()) return {};
  return {impl_->outputs->data() + impl_->output_offsets[slot],
          impl_->options.max_tokens * impl_->options.token_bytes};
}
uint32_t Client::flag(size_t slot) const {
  return slot < slots() ? LoadFlag(impl_->Flag(slot)) : kFlagFailed;
}

Status Client::PrepareForward(uint32_t num_reqs, uint32_t num_tokens, bool dummy) {
  Impl& c = *impl_;
  FERRY_RETURN_IF_ERROR(c.TakeError());
  if (dummy) {
    // Nothing goes to the service; the waits of this forward pass at once.
    uint64_t bytes = std::min<uint64_t>(num_tokens, c.options.max_tokens) * c.options.token_bytes;
    for (size_t s = 0; s < slots(); ++s) {
      std::memset(output(s).data(), 0, bytes);
      StoreFlag(c.Flag(s), kFlagDone);
    }
    return Status::Ok();
  }
  if (c.options.tp_rank != 0) return Status::Ok();  // rank 0 speaks for the group
  uint64_t seq = c.last_seq.load() + 1;
  c.last_seq = seq;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.waiting[seq] = Deadline::After(c.options.step_timeout);
  }
  Status s = Send(c.fd.get(), Encode(Request{seq, num_tokens, num_reqs}));
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(c.mu);
    c.waiting.erase(seq);
    if (c.fatal.ok()) c.fatal = Status(Code::kUnavailable, "embedding service connection lost: " + s.ToString());
    c.FailAll();
    return c.fatal;
  }
  return Status::Ok();
}

Status Client::Wait(size_t slot) {
  Impl& c = *impl_;
  if (slot >= slots())
    return Status(Code::kOutOfRange, "slot " + std::to_string(slot) + " of " +
                                         std::to_string(slots()));
  {
    // A lost connection is reported after the error of the step it cut short, if any.
    std::lock_guard<std::mutex> lock(c.mu);
    if (!c.fatal.ok()) return c.pending.ok() ? c.fatal : std::exchange(c.pending, Status::Ok());
  }
  Deadline deadline = Deadline::After(c.options.step_timeout);
  Result<uint32_t> v =
      WaitFlag(c.Flag(slot), deadline, [](uint32_t x) { return x >= kFlagDone; });
  if (!v.ok())
    return Status(Code::kDeadlineExceeded,
                  "layer " + std::to_string(c.options.layers[slot]) +
                      ": no output from the embedding service within the step timeout");
  if (*v == kFlagDone) return Status::Ok();
  // Failed: rank 0 gets the service's reply (it follows the flags); give it a moment.
  // Other ranks get no reply; they look briefly for a lost connection.
  std::unique_lock<std::mutex> lock(c.mu);
  c.cv.wait_for(lock,
                c.options.tp_rank == 0 ? std::chrono::milliseconds(1000)
                                       : std::chrono::milliseconds(20),
                [&] {
                  return !c.pending.ok() || !c.fatal.ok() ||
                         (c.options.tp_rank == 0 && c.waiting.count(c.last_seq.load()) == 0);
                });
  if (!c.pending.ok()) return std::exchange(c.pending, Status::Ok());
  if (!c.fatal.ok()) return c.fatal;
  return Status(Code::kAborted, "layer " + std::to_string(c.options.layers[slot]) +
                                    ": the embedding service failed this step");
}

Status Client::ReleaseOutputs() {
  Impl& c = *impl_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.closed) return Status(Code::kFailedPrecondition, "the client is closed");
    if (!c.fatal.ok()) {
      c.FailAll();  // the flags stay failed: no later wait may block
      return c.fatal;
    }
  }
  for (size_t s = 0; s < slots(); ++s) StoreFlag(c.Flag(s), kFlagReset);
  return Status::Ok();
}

}  // namespace ferry::embed::service
